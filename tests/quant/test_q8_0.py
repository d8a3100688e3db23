"""q8_0 quantization (webtensor.quant's Q8_0 case): bit-equal to the gguf package's (ggml's
reference rounding), the padding rule, the byte layout, and the numpy quant_matmul reference."""

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
from webtensor.errors import ArgumentError, CheckpointError, WebtensorError
from webtensor.quant.weight import QuantWeight, quant_matmul

Q8 = GGMLQuantizationType.Q8_0


def parts(w: QuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """(qs int8 (N, padded_k), d float16 (N, blocks)) of a Q8_0 weight, read from its 34-byte blocks."""
    n = w.shape[0]
    b = w.to_blocks().reshape(n, -1, 34)
    d = np.ascontiguousarray(b[:, :, :2]).view("<f2").reshape(n, -1)
    return np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(n, -1), d


@st.composite
def matrices(draw: st.DrawFn, k_multiple: bool = True) -> np.ndarray:
    n = draw(st.integers(1, 6))
    k = draw(st.integers(1, 4)) * 32 if k_multiple else draw(st.integers(1, 100))
    scale = draw(st.sampled_from([1e-6, 1e-2, 1.0, 3e3]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    if draw(st.booleans()):  # an all-zero block and exact ties (x / d = m + 0.5)
        w[0, : min(k, 32)] = 0
        if n > 1 and k >= 32:
            w[1, :32] = np.float32(scale) * np.array([127] + [i + 0.5 for i in range(-15, 16)], np.float32)
    return w


@settings(max_examples=60, deadline=None)
@given(matrices())
def test_bytes_and_values_equal_gguf_package(w: np.ndarray) -> None:
    ours = quant.quantize(w, "Q8_0")
    theirs = gguf_quantize(w, Q8)
    assert np.array_equal(ours.to_blocks(), theirs)
    assert np.array_equal(ours.dequantize(), gguf_dequantize(theirs, Q8))
    back = QuantWeight.from_blocks("Q8_0", theirs, w.shape)
    (bq, bd), (oq, od) = parts(back), parts(ours)
    assert np.array_equal(bq, oq) and np.array_equal(bd.view(np.uint16), od.view(np.uint16))


def test_ties_round_half_away_from_zero() -> None:
    w = np.zeros((1, 32), np.float32)
    w[0, :5] = [127, 2.5, -2.5, 0.5, -0.49999997]
    qs, d = parts(quant.quantize(w, "Q8_0"))
    assert d[0, 0] == 1.0
    assert qs[0, :5].tolist() == [127, 3, -3, 1, 0]


@settings(max_examples=30, deadline=None)
@given(matrices(k_multiple=False))
def test_padding_rule(w: np.ndarray) -> None:
    n, k = w.shape
    q = quant.quantize(w, "Q8_0")
    qs, d = parts(q)
    assert q.padded_k == quant.padded(k, "Q8_0") and q.padded_k % 32 == 0 and q.padded_k - k < 32
    assert qs.shape == (n, q.padded_k) and np.all(qs[:, k:] == 0)
    wide = np.zeros((n, q.padded_k), np.float32)
    wide[:, :k] = w
    assert np.array_equal(q.to_blocks(), gguf_quantize(wide, Q8))  # same as quantizing the zero-padded rows
    assert q.dequantize().shape == (n, k)
    # error bound of q8_0: half a step of the block's scale, plus 127 times the float16 rounding
    # of that scale (relative 2**-11, or 2**-25 absolute where it is subnormal)
    dd = np.repeat(d.astype(np.float32), 32, axis=1)[:, :k]
    assert np.all(np.abs(q.dequantize() - w) <= 0.5 * dd + 127 * (dd * 2.0**-11 + 2.0**-25))


@settings(max_examples=30, deadline=None)
@given(matrices(k_multiple=False), st.integers(1, 5), st.integers(0, 1000))
def test_quant_matmul_is_x_times_dequantized_transpose(w: np.ndarray, m: int, seed: int) -> None:
    q = quant.quantize(w, "Q8_0")
    x = np.random.default_rng(seed).standard_normal((m, w.shape[1])).astype(np.float32)
    want = x.astype(np.float64) @ q.dequantize().astype(np.float64).T
    got = quant_matmul(x, q)
    assert got.dtype == np.float32 and got.shape == (m, w.shape[0])
    assert_close(got, want, linear_scale(x, q.dequantize().T))


def test_quant_matmul_keeps_leading_dims_and_one_dequantization() -> None:
    rng = np.random.default_rng(1)
    q = quant.quantize(rng.standard_normal((37, 64)).astype(np.float32), "Q8_0")
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got = quant_matmul(x, q)
    assert got.shape == (2, 3, 37)
    want = x.astype(np.float64) @ q.dequantize().T.astype(np.float64)  # (BLAS may sum in another order)
    assert_close(got, want, linear_scale(x, q.dequantize().T))
    assert quant.dequantized(q) is quant.dequantized(q)  # computed once per weight, kept
    assert not quant.dequantized(q).flags.writeable


def test_row_dequantize_is_an_embedding_lookup() -> None:
    w = np.random.default_rng(2).standard_normal((10, 64)).astype(np.float32)
    q = quant.quantize(w, "Q8_0")
    ids = np.array([3, 0, 3, 9])
    assert np.array_equal(q.dequantize(ids), q.dequantize()[ids])


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ArgumentError, match="non-finite"):
        quant.quantize(np.array([[1.0, np.nan]], np.float32), "Q8_0")
    with pytest.raises(ArgumentError, match="overflows"):
        quant.quantize(np.full((1, 32), 1e7, np.float32), "Q8_0")
    with pytest.raises(ArgumentError, match="2-D float"):
        quant.quantize(np.ones(32, np.float32), "Q8_0")
    q = quant.quantize(np.ones((2, 32), np.float32), "Q8_0")
    with pytest.raises(ArgumentError, match=r"expected \(\.\.\., 32\)"):
        quant_matmul(np.ones((1, 31), np.float32), q)
    with pytest.raises(CheckpointError, match="needs 68 bytes"):
        QuantWeight.from_blocks("Q8_0", b"\0" * 67, (2, 32))
    with pytest.raises(CheckpointError, match="multiple of 32"):
        QuantWeight.from_blocks("Q8_0", b"\0" * 34, (1, 31))
    with pytest.raises(WebtensorError, match="uint8"):
        QuantWeight("Q8_0", np.zeros((1, 34), np.int16), (1, 32))
