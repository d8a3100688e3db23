"""`quant.q8`, the reference of the integer-dot GEMV, checked on its own: the int8 activations (the clamp, the
scale, the rounding, the run sums, zero and non-finite blocks), the product against float64 arithmetic on the same
int8 activations and dequantized weights (every type: the integer decomposition of `dequant.RUNS` is exact), and
its tie bound (zero where no value lies near a rounding tie; covering a moved rounding where one does)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from webtensor import quant
from webtensor.quant.dequant import DEQUANTIZE, RUNS, dequantize_runs
from webtensor.quant.q8 import q8_product, quantize_rows

TYPES = sorted(quant.TYPES)
seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, m=st.integers(1, 5), blocks=st.integers(1, 6), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e30]))
def test_int8_activations(seed: int, m: int, blocks: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, 32 * blocks)) * scale).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    q, d, sums = quantize_rows(x)
    assert q.dtype == np.int8 and d.dtype == np.float32 and sums.dtype == np.int32
    xb, qb = x.reshape(m, blocks, 32), q.reshape(m, blocks, 32).astype(np.int32)
    assert d[0, 0] == 0 and not qb[0, 0].any()
    amax = np.abs(xb).max(axis=2)
    assert np.array_equal(d, (amax * np.float32(1 / 127)).astype(np.float32))
    live = amax > 0
    assert (np.abs(qb).max(axis=2)[live] == 127).all()  # the largest value of each block is +-127
    err = np.abs(xb.astype(np.float64) - d[..., None].astype(np.float64) * qb)
    assert (err <= 0.5 * d[..., None] * (1 + 1e-5) + 1e-45).all()  # round to nearest
    assert np.array_equal(sums, qb.reshape(m, blocks * 2, 16).sum(axis=2))


def test_rounding_is_half_to_even_and_non_finite_blocks_are_nan() -> None:
    x = np.zeros((2, 64), np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]  # d = 1 exactly: ties round to even
    x[1, 3], x[1, 40] = np.inf, np.nan
    q, d, _ = quantize_rows(x)
    assert q[0, :4].tolist() == [127, 0, 2, -2] and d[0, 0] == np.float32(127) * np.float32(1 / 127)
    assert np.isnan(d[1]).all() and not q[1].any()


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(TYPES), seed=seeds, m=st.integers(1, 4), n=st.integers(1, 20), blocks=st.integers(1, 3))
def test_product_is_the_float64_product_of_the_same_numbers(qtype: str, seed: int, m: int, n: int,
                                                            blocks: int) -> None:
    """y = (d_x q_x) @ dequantize(W).T, evaluated in float64: the integer sums and the per-run scaling are the same
    numbers grouped differently."""
    rng = np.random.default_rng(seed)
    k = blocks * quant.TYPES[qtype].values
    w = quant.random_weight(qtype, (n, k), rng, -7)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y, bound = q8_product(x, w)
    q, d, _ = quantize_rows(x)
    xd = np.repeat(d.astype(np.float64), 32, axis=1) * q
    want = xd @ w.dequantize().astype(np.float64).T
    assert np.allclose(y, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    assert bound.shape == y.shape and (bound >= 0).all()
    runs = RUNS[qtype](w.blocks.reshape(-1, quant.TYPES[qtype].nbytes))
    assert np.array_equal(dequantize_runs(runs), DEQUANTIZE[qtype](w.blocks.reshape(-1, quant.TYPES[qtype].nbytes)))


def test_tie_bound_covers_a_moved_rounding() -> None:
    """A value exactly at a tie (x / d = k + 1/2): the bound is d |w| there and covers the other rounding; a row
    without ties has bound 0."""
    rng = np.random.default_rng(3)
    w = quant.random_weight("Q8_0", (5, 32), rng, -7)
    x = np.zeros((2, 32), np.float32)
    x[:, 0] = 127.0  # d = 1
    x[0, 1] = 10.5  # a tie in row 0
    x[1, 1] = 10.25
    y, bound = q8_product(x, w, slack=1e-3)
    wd = w.dequantize().astype(np.float64)
    assert (bound[1] == 0).all()
    assert np.allclose(bound[0], np.abs(wd[:, 1]))
    moved = 127.0 * wd[:, 0] + 11.0 * wd[:, 1]  # the tie rounded up instead (half-even gave 10)
    assert (np.abs(moved - y[0]) <= bound[0] * (1 + 1e-9)).all()
