"""Real weights: SmolLM2-135M-Instruct.Q4_1.gguf (210 Q4_1 matrices, a Q8_0 token embedding that is
also the tied LM head). Every quantized tensor read through `GGUFCheckpoint.raw` is a QuantWeight
whose dequantization is the gguf package's bit for bit; block 0's seven matrices (decode rows, a
stack, a prefill chunk, with the RMS-norm prologue) and the head (49,152 x 576) on WebGPU agree with
the CPU reference, and embedding rows are the reference's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from smollm2 import smollm2_gguf
from tolerance import assert_close

import webtensor as wt
from webtensor import quant
from webtensor.formats.gguf_reader import GGUFCheckpoint
from webtensor.quant.weight import QuantWeight

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def ck() -> GGUFCheckpoint:
    return GGUFCheckpoint(smollm2_gguf(), reader="pure")


def weight(ck: GGUFCheckpoint, name: str) -> QuantWeight:
    t = ck.tensors[name]
    return QuantWeight.from_blocks(t.type_name, ck.raw(name), t.shape)


def test_every_quantized_tensor_dequantizes_as_gguf(ck: GGUFCheckpoint) -> None:
    kinds: dict[str, int] = {}
    ref = {t.name: t for t in gguf.GGUFReader(str(smollm2_gguf())).tensors}
    for name, t in ck.tensors.items():
        if t.type_name not in quant.TYPES:
            assert t.type_name == "F32", name
            continue
        kinds[t.type_name] = kinds.get(t.type_name, 0) + 1
        if not (name.startswith(("blk.0.", "blk.29.", "token_embd"))):
            assert weight(ck, name).shape == t.shape  # (the bytes fit; dequantized below for three layers)
            continue
        want = gguf.quants.dequantize(ref[name].data, ref[name].tensor_type)
        assert np.array_equal(weight(ck, name).dequantize().view(np.uint32), want.view(np.uint32)), name
    assert kinds == {"Q4_1": 210, "Q8_0": 1}


@pytest.mark.parametrize("rows", [(1, 576), (3, 1, 576), (9, 576)])
def test_block_0_matrices_on_webgpu(ck: GGUFCheckpoint, gpu: wt.Device, cpu: wt.Device, rows: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    g = rng.standard_normal(576).astype(np.float32)
    for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        w = weight(ck, f"blk.0.{part}.weight")
        x = rng.standard_normal((*rows[:-1], w.shape[1])).astype(np.float32)
        norm = part in ("attn_q", "ffn_up")  # two of them with the RMS prologue (the model's norms)

        def run(d: wt.Device, w: QuantWeight = w, x: np.ndarray = x, norm: bool = norm) -> np.ndarray:
            rms = (wt.tensor(g, device=d), 1e-5) if norm else None
            return wt.linear(wt.tensor(x, device=d), w, rms=rms).numpy()
        assert_close(run(gpu), run(cpu), what=part)  # (hundreds of outputs a row: no cancellation)


def test_tied_head_and_embedding_on_webgpu(ck: GGUFCheckpoint, gpu: wt.Device, cpu: wt.Device) -> None:
    emb = weight(ck, "token_embd.weight")
    assert emb.qtype == "Q8_0" and emb.shape == (49152, 576)
    ids = np.array([0, 1, 2, 49151, 1000, 1], np.int32)
    rows = wt.embedding(emb, wt.tensor(ids, device=gpu)).numpy()
    assert np.array_equal(rows, emb.dequantize(ids))
    x = np.random.default_rng(1).standard_normal((1, 576)).astype(np.float32)
    got = wt.linear(wt.tensor(x, device=gpu), emb).numpy()
    want = wt.linear(wt.tensor(x, device=cpu), emb).numpy()
    assert_close(got, want)
    assert int(got.argmax()) == int(want.argmax())
