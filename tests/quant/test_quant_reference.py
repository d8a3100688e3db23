"""webtensor.quant's numpy reference against the `gguf` package: every type's dequantization bit for
bit on random blocks (any bytes are a valid block once its float16 scales are finite), the
quantizers of Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 byte for byte, the padding rule, quant_matmul, and the
one-line errors for bad blocks, shapes and types."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from tolerance import assert_close, linear_scale

from webtensor import quant
from webtensor.errors import ArgumentError, CheckpointError
from webtensor.quant.weight import QuantWeight, quant_matmul

seeds = st.integers(0, 2**32 - 1)


def random_blocks(rng: np.random.Generator, qtype: str, n: int, k: int, nan_free: bool = True) -> np.ndarray:
    """uint8 (n, bytes a row): random bytes, each float16 field made finite (exponent < 31) and
    sometimes a subnormal or a zero."""
    t = quant.TYPES[qtype]
    raw = rng.integers(0, 256, (n, k // t.values, t.nbytes), dtype=np.uint8)
    for off in quant.HALVES[qtype]:
        hi = raw[:, :, off + 1]
        hi[(hi & 0x7C) == 0x7C] &= 0xBB  # exponent 31 (inf / nan) -> 14 or below
        raw[:, ::3, off + 1] &= 0x83  # every third block: a subnormal or zero exponent
    return raw.reshape(n, -1)


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(sorted(quant.TYPES)), n=st.integers(1, 9), blocks=st.integers(1, 4), seed=seeds)
def test_dequantize_equals_gguf_bit_for_bit(qtype: str, n: int, blocks: int, seed: int) -> None:
    k = blocks * quant.TYPES[qtype].values
    raw = random_blocks(np.random.default_rng(seed), qtype, n, k)
    w = QuantWeight.from_blocks(qtype, raw, (n, k))
    want = gguf_dequantize(raw, GGMLQuantizationType[qtype])
    got = w.dequantize()
    assert got.dtype == np.float32 and got.shape == (n, k) == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bits: signed zeros included
    rows = np.array([n - 1, 0, n // 2])
    assert np.array_equal(w.dequantize(rows).view(np.uint32), want[rows].view(np.uint32))
    assert w.nbytes == raw.nbytes and np.shares_memory(w.to_blocks(), raw)  # taken as stored, no copy


@st.composite
def matrices(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(1, 7))
    k = draw(st.integers(1, 4)) * 32
    scale = draw(st.sampled_from([1e-6, 1e-2, 1.0, 3e3]))
    w = (np.random.default_rng(draw(seeds)).standard_normal((n, k)) * scale).astype(np.float32)
    if draw(st.booleans()):  # an all-zero block, a constant one, and exact ties
        w[0, :32] = 0
        if n > 1:
            w[1, :32] = np.float32(scale)
        if n > 2:
            w[2, :32] = np.float32(scale) * np.array([-8] + [i + 0.5 for i in range(-15, 16)], np.float32)
    return w


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(quant.QUANTIZABLE), w=matrices())
def test_quantize_equals_gguf_byte_for_byte(qtype: str, w: np.ndarray) -> None:
    q = quant.quantize(w, qtype)
    theirs = gguf_quantize(w, GGMLQuantizationType[qtype])
    assert q.qtype == qtype and q.shape == w.shape
    assert np.array_equal(q.to_blocks(), theirs)
    assert np.array_equal(q.dequantize(), gguf_dequantize(theirs, GGMLQuantizationType[qtype]))


@settings(max_examples=20, deadline=None)
@given(qtype=st.sampled_from(quant.QUANTIZABLE), n=st.integers(1, 5), k=st.integers(1, 100), seed=seeds)
def test_padding_quantizes_the_zero_padded_rows(qtype: str, n: int, k: int, seed: int) -> None:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    q = quant.quantize(w, qtype)
    kp = quant.padded(k, qtype)
    assert q.padded_k == kp and kp % 32 == 0 and 0 <= kp - k < 32
    wide = np.zeros((n, kp), np.float32)
    wide[:, :k] = w
    assert np.array_equal(q.to_blocks(), gguf_quantize(wide, GGMLQuantizationType[qtype]))
    assert q.dequantize().shape == (n, k)


@settings(max_examples=20, deadline=None)
@given(qtype=st.sampled_from(sorted(quant.TYPES)), m=st.integers(1, 4), seed=seeds)
def test_quant_matmul_is_x_times_the_dequantized_transpose(qtype: str, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = 2 * quant.TYPES[qtype].values
    w = QuantWeight.from_blocks(qtype, random_blocks(rng, qtype, 5, k), (5, k))
    x = rng.standard_normal((m, 1, k)).astype(np.float32)
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    got = quant_matmul(x, w)
    assert got.dtype == np.float32 and got.shape == (m, 1, 5)
    assert_close(got, want, linear_scale(x, w.dequantize().T))


@pytest.mark.parametrize("qtype", sorted(quant.TYPES))
def test_bad_blocks_and_shapes_are_refused(qtype: str) -> None:
    t = quant.TYPES[qtype]
    k = 2 * t.values
    with pytest.raises(CheckpointError, match=rf"^a {qtype} tensor of shape \(3, {k}\) needs {3 * 2 * t.nbytes} bytes, "
                                              rf"got {3 * 2 * t.nbytes - 1}$"):
        QuantWeight.from_blocks(qtype, b"\0" * (3 * 2 * t.nbytes - 1), (3, k))
    with pytest.raises(CheckpointError, match=rf"^a {qtype} tensor needs rows of a positive multiple of {t.values} "
                                              rf"values, got shape \(2, {k - 16}\)$"):
        QuantWeight.from_blocks(qtype, b"\0" * (2 * t.nbytes), (2, k - 16))
    with pytest.raises(CheckpointError, match=rf"^a {qtype} weight is a 2-D matrix"):
        QuantWeight.from_blocks(qtype, b"\0" * (2 * t.nbytes), (2, 1, k))
    with pytest.raises(ArgumentError, match=r"holds uint8 blocks of shape"):
        QuantWeight(qtype, np.zeros((1, 2 * t.nbytes + 1), np.uint8), (1, k))


def test_unknown_types_are_refused() -> None:
    with pytest.raises(CheckpointError, match=r"^ggml type 'TQ1_0' is not a quantized type webtensor runs \(it runs "
                                              r"Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_NL, "
                                              r"IQ4_XS\)$"):
        QuantWeight.from_blocks("TQ1_0", b"\0" * 54, (1, 256))
    with pytest.raises(ArgumentError, match="'IQ2_XS' is not a quantized type"):
        quant.quantize(np.ones((1, 256), np.float32), "IQ2_XS")
    with pytest.raises(ArgumentError, match="Q3_K needs llama.cpp's quantizer"):
        quant.quantize(np.ones((1, 256), np.float32), "Q3_K")
    with pytest.raises(ArgumentError, match="Q4_K needs llama.cpp's quantizer"):
        quant.quantize(np.ones((1, 256), np.float32), "Q4_K")
    with pytest.raises(ArgumentError, match="Q4_1: a block's minimum -1e\\+06 overflows float16"):
        quant.quantize(np.full((1, 32), -1e6, np.float32), "Q4_1")
    with pytest.raises(ArgumentError, match="Q4_0: a block's scale .* overflows float16"):
        quant.quantize(np.full((1, 32), 1e6, np.float32), "Q4_0")


def test_the_package_imports_without_numpy_names() -> None:
    """quant.types and the ops' check need no numpy: the page (Pyodide) has none."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['numpy'] = None\n"
            "import webtensor.quant as q, webtensor.ops\n"
            "assert q.TYPES['Q4_K'].nbytes == 144 and q.row_bytes('Q6_K', 512) == 420\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
