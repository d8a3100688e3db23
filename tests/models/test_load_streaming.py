"""Weights streamed to the device (issue 30, item 4): a model file is uploaded tensor by tensor from its memory map,
in pieces; the writes' staging copies are bounded to two pieces; a piece's pages of the map leave the process once
it is on its way. What a load holds beyond the runtime stays under 1.2x the largest tensor, measured in a fresh
process by tools/load_memory.py on the CPU device and lavapipe, for a GGUF file and a safetensors checkpoint; the
pieces give the same bytes on the device as one whole write, for every quantized type and odd sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webtensor.dtypes as dt
from webtensor.backends.wgpu import ops as plan
from webtensor.backends.wgpu import quant_ops
from webtensor.quant import TYPES, QuantWeight
from webtensor.quant.types import row_bytes

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


class StagingLedger:
    """Wraps a device's API to account wgpu's staging copies as wgpu keeps them: a write's copy lives until a
    submission carrying it has run (flush_writes then wait_writes of that token or a later one)."""

    def __init__(self, api, monkeypatch):
        self.api, self.pending, self.inflight, self.live, self.peak, self.sizes = api, 0, [], 0, 0, []
        write, flush, wait = api.write_buffer, api.flush_writes, api.wait_writes

        def write_buffer(buf, offset, data):
            n = memoryview(data).nbytes
            self.sizes.append(n)
            self.pending += n
            self.live += n
            self.peak = max(self.peak, self.live)
            write(buf, offset, data)

        def flush_writes():
            token = flush()
            self.inflight.append((token, self.pending))
            self.pending = 0
            return token

        def wait_writes(token):
            wait(token)
            while self.inflight and (token is None or self.inflight[0][0] is None or self.inflight[0][0] <= token):
                self.live -= self.inflight.pop(0)[1]
        for name, fn in (("write_buffer", write_buffer), ("flush_writes", flush_writes), ("wait_writes", wait_writes)):
            monkeypatch.setattr(api, name, fn)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 300_000), piece=st.sampled_from([4096, 12_288, 65_536]), seed=st.integers(0, 2**32 - 1))
def test_upload_in_pieces_bounds_staging(gpu, n, piece, seed):
    with pytest.MonkeyPatch.context() as m:
        ledger = StagingLedger(gpu.ctx.api, m)
        m = -(-n // 4)  # float32 values holding n random bytes
        data = np.random.default_rng(seed).integers(0, 256, 4 * m, dtype=np.uint8).tobytes()
        spans: list[tuple[int, int]] = []
        with gpu.ctx.upload_pieces(piece):
            t = plan.from_bytes(gpu, (m,), dt.float32, data, lambda a, b: spans.append((a, b)))
        assert ledger.live == 0 and ledger.pending == 0  # everything submitted and waited for at the block's end
    assert max(ledger.sizes) <= piece and ledger.peak <= 2 * piece, (ledger.peak, piece)
    assert spans[0][0] == 0 and spans[-1][1] == 4 * m
    assert all(a2 == b1 for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False))  # in order, no gap
    assert t.numpy().tobytes() == data


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_quantized_upload_in_pieces_is_the_whole(gpu, qtype):
    rng = np.random.default_rng(len(qtype))
    k = TYPES[qtype].values * 3
    for n in (1, 7, 301):
        raw = rng.integers(0, 256, n * row_bytes(qtype, k), dtype=np.uint8)
        spans: list[tuple[int, int]] = []
        with gpu.ctx.upload_pieces(3 * row_bytes(qtype, k)):  # (a few rows a piece: uneven pieces, a short last)
            g = quant_ops.upload_blocks(gpu, qtype, raw.tobytes(), (n, k), lambda a, b, s=spans: s.append((a, b)))
        assert np.array_equal(g.to_quant_weight().blocks, QuantWeight.from_blocks(qtype, raw, (n, k)).blocks)
        assert spans[0][0] == 0 and spans[-1][1] == raw.nbytes and (n < 7 or len(spans) > 1)
        assert all(a2 == b1 and a2 % row_bytes(qtype, k) == 0 for (_, b1), (a2, _) in zip(spans, spans[1:],
                                                                                          strict=False))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A SmolLM2-shaped checkpoint of 2 layers (its 49,152 x 576 embedding the largest tensor), float16
    safetensors, and the same as a Q8_0 GGUF file."""
    d = tmp_path_factory.mktemp("stream")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "random_checkpoint.py"), str(d / "hf"), "--preset",
                        "smollm2-135m", "--n-layer", "2", "--dtype", "float16", "--gguf", str(d / "m.gguf"),
                        "--gguf-type", "q8_0"], env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return {"safetensors": d / "hf", "gguf": d / "m.gguf"}


@pytest.mark.parametrize("device", ["cpu", "lavapipe"])
@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_a_load_holds_pieces_not_the_file(checkpoints, tmp_path, device, kind):
    out = tmp_path / "fig.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "load_memory.py"), str(checkpoints[kind]), "--device",
                        device, "--json", str(out)], env=ENV, capture_output=True, text=True, timeout=600)
    assert out.exists(), r.stderr
    fig = json.loads(out.read_text())
    assert fig["largest_tensor"] >= 28 << 20, fig  # (the embedding: large beside the runtime's noise)
    assert fig["transient"] <= 1.2 * fig["largest_tensor"] and r.returncode == 0, (r.stdout, fig)


@pytest.mark.parametrize(("kind", "dtype"), [("gguf", None), ("safetensors", None), ("gguf", "float32"),
                                             ("safetensors", "q8_0")])
def test_progress_moves_within_tensors_and_ends_at_the_total(checkpoints, gpu, kind, dtype):
    """The CLI's bar is fed by `progress(name, bytes done, total)`: it moves as pieces go (the embedding, ~1/32 of
    it a piece, gives many reports where it is copied as stored), never backwards (a conversion's bytes are not
    the file's), and ends at the file's tensor bytes."""
    import webtensor as wt
    from webtensor.models import loader

    calls: list[tuple[str, int, int]] = []
    wt.load_model(str(checkpoints[kind]), device=gpu, dtype=dtype, progress=lambda n, d, t: calls.append((n, d, t)))
    ck = loader.open_checkpoint(str(checkpoints[kind]))
    total = sum(loader.stored_nbytes(ck.stored_type(n), ck.shape(n)) for n in ck.family.tensors(ck.config))
    done = [d for _, d, _ in calls]
    assert {t for *_, t in calls} == {total} and done[-1] == total and done == sorted(done)
    per_tensor = {n for n, *_ in calls}
    if dtype is None:  # (pieces within the big tensors)
        assert len(calls) > len(per_tensor) + 16, (len(calls), len(per_tensor))
