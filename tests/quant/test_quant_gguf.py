"""Quantized GGUF tensors of every type webtensor runs, the way the loader takes them: a file written by
the gguf package's GGUFWriter (the 32-value types quantized by the package, Q4_K / Q6_K random
blocks), read through `GGUFCheckpoint.raw` with either reader, made a `QuantWeight` (host) or a
`QuantGpu` (`quant_ops.upload_blocks`; the page's numpy-free split is checked in test_quant_kernels)
from the stored bytes as they are: the gguf package's dequantization bit for bit, and on the device
the same product as the host weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops
from webtensor.formats.gguf_reader import GGUFCheckpoint
from webtensor.quant.weight import QuantWeight

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
SHAPES = {"Q8_0": (7, 96), "Q4_0": (5, 64), "Q4_1": (9, 32), "Q5_0": (3, 96), "Q5_1": (6, 64), "Q4_K": (3, 512),
          "Q6_K": (4, 256), "Q5_K": (2, 768), "Q3_K": (3, 256), "Q2_K": (5, 512), "IQ4_NL": (3, 160),
          "IQ4_XS": (2, 256)}  # (N, K)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("quant") / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for qtype, (n, k) in SHAPES.items():
        if qtype in quant.QUANTIZABLE:
            data = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), Q[qtype])
        else:  # random blocks with finite float16 scales
            data = quant.random_weight(qtype, (n, k), rng).blocks
        w.add_tensor(f"w.{qtype}", data, raw_shape=data.shape, raw_dtype=Q[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("reader", ["gguf", "pure"])
def test_stored_blocks_become_quant_weights(gguf_file: Path, reader: str) -> None:
    ck = GGUFCheckpoint(gguf_file, reader=reader)
    ref = gguf.GGUFReader(str(gguf_file))
    for t in ref.tensors:
        qtype = t.tensor_type.name
        stored = ck.tensors[t.name]
        assert stored.type_name == qtype and stored.shape == SHAPES[qtype]
        w = QuantWeight.from_blocks(qtype, ck.raw(t.name), stored.shape)
        assert w.shape == SHAPES[qtype] and w.to_blocks().tobytes() == t.data.tobytes()
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.array_equal(w.dequantize().view(np.uint32), want.view(np.uint32)), qtype


def test_stored_blocks_upload_without_numpy_arrays(gguf_file: Path, gpu: wt.Device, cpu: wt.Device) -> None:
    ck = GGUFCheckpoint(gguf_file, reader="pure")
    rng = np.random.default_rng(1)
    for name, stored in ck.tensors.items():
        g = quant_ops.upload_blocks(gpu, stored.type_name, ck.raw(name), stored.shape)
        host = QuantWeight.from_blocks(stored.type_name, ck.raw(name), stored.shape)
        assert np.array_equal(g.to_quant_weight().to_blocks(), host.to_blocks())
        x = rng.standard_normal((2, stored.shape[1])).astype(np.float32)
        got = wt.linear(wt.tensor(x, device=gpu), g).numpy()
        want = wt.linear(wt.tensor(x, device=cpu), host).numpy()
        assert_close(got, want, linear_scale(x, host.dequantize().T), what=name)
