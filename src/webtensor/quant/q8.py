"""int8 activations: the numpy reference of the quantized product that the integer-dot GEMV
(`backends/wgpu/kernels/gemv_quant_dot4.wgsl`) computes, as llama.cpp's `mmvq` does: the activations
are quantized to int8 in blocks of 32, each weight run of 16 is dotted with them in integers, and
only the per-run sums are scaled in floating point.

Activations, per row and block of 32 values x (float32):

    amax = max |x|,  d = amax * f32(1 / 127),  q = round_half_even(x * f32(1 / d))  (0 where amax = 0),

clipped to [-127, 127]; a block holding a NaN or an infinity gets d = NaN (its products are NaN, as a
float product would be). With the weight's runs (`quant.dequant.RUNS`: value = scale (q_w) + min,
q_w already less its zero point) the product of a row x with weight row n is

    y[n] = sum over runs r:  d[block(r)] * (scale[n, r] * I[n, r] + min[n, r] * S[r]),
    I[n, r] = sum_{i in r} q_w[n, i] q[i]   (an exact integer),   S[r] = sum_{i in r} q[i],

exact in its integer sums; the reference adds the terms in float64, the GPU in float32 (so the two
differ by float32 rounding only: ~1e-6 of the result's norm).

The activations' rounding can differ between a device and numpy where x * (1 / d) lies within a few
ulps of a half-integer (GPUs' `1 / d` and the fused norms' `inverseSqrt` are not correctly rounded):
such a value's q moves by one and the result by d |w[n, i]|. `q8_product` therefore also returns, per
output, the sum of d |w| over the values that lie within `slack` of such a tie: the honest bound of
what a different rounding of those values can change.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from .dequant import RUNS, dequantize_runs
from .weight import QuantWeight

QBLOCK = 32  # activation values sharing one scale
INV127 = np.float32(1.0 / 127.0)


class Q8Rows(NamedTuple):
    """Rows of activations in int8: q (M, K) int8, d (M, K / 32) float32, sums (M, K / 16) int32 (the
    sum of q over each run of 16)."""

    q: npt.NDArray[np.int8]
    d: npt.NDArray[np.float32]
    sums: npt.NDArray[np.int32]


def quantize_rows(x: np.ndarray) -> Q8Rows:
    """float32 rows (M, K), K a multiple of 32 -> their int8 blocks (module docstring)."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    xb = x.reshape(m, k // QBLOCK, QBLOCK)
    finite = np.isfinite(xb).all(axis=2)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.where(finite, np.abs(np.where(np.isfinite(xb), xb, 0)).max(axis=2), np.float32(0))
        d = (amax * INV127).astype(np.float32)
        inv = np.where(amax > 0, np.float32(1) / np.where(d > 0, d, 1), np.float32(0)).astype(np.float32)
        q = np.clip(np.rint(np.where(finite[..., None], xb, 0) * inv[..., None]), -127, 127).astype(np.int8)
    d = np.where(finite, d, np.float32(np.nan)).astype(np.float32)
    sums = q.reshape(m, k // 16, 16).sum(axis=2, dtype=np.int32)
    return Q8Rows(q.reshape(m, k), d, sums)


def _ties(x: np.ndarray, slack: float) -> npt.NDArray[np.bool_]:
    """(M, K) where x * (1 / d) lies within `slack` of a half-integer (module docstring)."""
    m, k = x.shape
    xb = np.asarray(x, np.float32).reshape(m, k // QBLOCK, QBLOCK).astype(np.float64)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(amax > 0, xb * 127.0 / np.where(amax > 0, amax, 1), 0.0)
    frac = np.abs(t - np.floor(t) - 0.5)
    return (frac <= slack).reshape(m, k)


def q8_product(x: np.ndarray, w: QuantWeight, slack: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """x (M, K) float32 times w (N, K).T with int8 activations: (y float64 (M, N), bound float64 (M,
    N)), y exact in its integer sums and added in float64, bound the rounding-tie allowance (module
    docstring). K must be whole blocks of w's type."""
    x = np.asarray(x, np.float32)
    n, k = w.shape
    if x.ndim != 2 or x.shape[1] != k or k != w.padded_k:
        raise ValueError(f"q8_product: x {x.shape} against a {w.qtype} weight {w.shape} of whole blocks")
    t = w.block
    runs = RUNS[w.qtype](w.blocks.reshape(-1, t.nbytes))
    qw = runs.q.reshape(n, k // 16, 16).astype(np.int64)
    scale = runs.scale.reshape(n, k // 16).astype(np.float64)
    xq = quantize_rows(x)
    qx = xq.q.reshape(x.shape[0], k // 16, 16).astype(np.int64)
    dx = np.repeat(xq.d.astype(np.float64), 2, axis=1)  # (M, K / 16): each run's activation scale
    integer = np.einsum("mri,nri->mnr", qx, qw)  # (M, N, K / 16) exact
    terms = scale[None] * integer
    if runs.min is not None:
        terms = terms + runs.min.reshape(n, k // 16).astype(np.float64)[None] * xq.sums[:, None, :]
    y = (dx[:, None, :] * terms).sum(axis=2)
    wabs = np.abs(dequantize_runs(runs).reshape(n, k).astype(np.float64))
    dx_each = np.repeat(xq.d.astype(np.float64), QBLOCK, axis=1)  # (M, K)
    bound = (np.where(_ties(x, slack), dx_each, 0.0)) @ wabs.T
    return y, bound


__all__ = ["QBLOCK", "Q8Rows", "quantize_rows", "q8_product"]
