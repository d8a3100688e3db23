"""How a parity test compares two results: `assert_close`, and the input scales its floor is made of.

A parity test holds a result (a WebGPU kernel's, a fused path's, a model's logits) against a reference
computed from the same inputs in another order (the numpy backend, or float64 numpy). Both are rounded;
the tolerance says how much rounding can explain. `assert_close(got, want, scale, rtol=...)` checks,
norm-wise over all elements and in float64,

    ||got - want||  <=  rtol * ||want||  +  FLOOR_ULPS * unit * ||scale||

and says on failure which term fell short and where the worst element is.

Why the second term (the floor). A sum s = t_1 + ... + t_n (a dot product's products, plus a bias or a
residual) evaluated in floating point in any order obeys

    |fl(s) - s|  <=  gamma_n * (|t_1| + ... + |t_n|),   gamma_n = n u / (1 - n u)

(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5; u the unit roundoff of the
arithmetic, 2^-24 in float32). The error is bounded by the magnitude of the terms, S = sum |t_i|, not by
the result: where the terms cancel (a 1 x 1 product summing to 1e-27; a one-dim attention head averaging
hundreds of values; GELU's tail, whose relative slope amplifies its input's absolute error) the result has
no relative precision left and `rtol * ||want||` alone fails correct code on a fresh random seed. The
floor is that error measured in S: `scale` is S for every output element (`linear_scale`: |x| @ |w| +
|bias| + |residual|; `attention_scale` for attention), and a result within FLOOR_ULPS units of roundoff
of its terms' magnitude is accepted whatever its size.

Why FLOOR_ULPS = 32. gamma_n is the worst case (every rounding the same way). Rounding errors of random
data add like a random walk instead, ~ lambda sqrt(n) u S (Higham and Mary, SIAM J. Sci. Comput. 41(5),
2019), and for terms of random sign the partial sums stay well below S, so two float32 results of one
sum differ by a few u S. Measured here (lavapipe against the numpy reference and both against float64,
n from 1 to 1,100 with and without GELU; attention over 1..300 keys, head dims 1..128): at most 2.6 u S.
Reference BLAS's Level 3 tester (DMMCH in dblat3.f) scores |C - C_ref| / (eps G) with G = |A| |B| (+ |beta
C|) and eps = 2u (Fortran's EPSILON), and its data file passes a ratio under 16: the same 32 u G. The
floor is below the worst-case bound from n = 32 terms on, and ~10x what fresh seeds reach.

What the floor costs. Where nothing cancels, ||scale|| is ~0.64 sqrt(n) ||want|| for n random terms, so
the floor adds ~1.2e-6 sqrt(n) ||want|| to rtol * ||want||: for float32's rtol = 1e-5 the bound is at most
1.5x as loose as before for n <= 16, 2x for n = 64 and 3x for n = 300. Errors of a wrong index, a dropped
term or a wrongly scaled operand (~||want|| / sqrt(n) and more) still fail by orders of magnitude, and so
does a float32 path that rounds an operand through float16 (~3e-4 ||want||).

Activations: GELU's and SiLU's slopes are at most 1.13 and 1.1, so an activation keeps its input's scale
(`linear_scale` of the pre-activation); their own rounding is relative to the output, inside rtol. A norm
prologue (layer norm, RMS norm) scales by the normalised rows: pass them (float64) as `x`.

`unit` is the roundoff of the arithmetic, not of the storage: float16 operands summed in float32 keep
U32 (the products of halves are exact in float32); a kernel that accumulates in float16 passes U16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

U32 = 2.0 ** -24  # float32's unit roundoff
U16 = 2.0 ** -11  # float16's
FLOOR_ULPS = 32  # see the module docstring


def _f64(a: Any) -> np.ndarray:
    return np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float64)


def assert_close(got: Any, want: Any, scale: Any = None, *, rtol: float = 1e-5, unit: float = U32,
                 what: object = "") -> None:
    """Assert ||got - want|| <= rtol ||want|| + FLOOR_ULPS unit ||scale|| (norm-wise, float64; the module
    docstring derives it). got and want are arrays (or tensors) of one shape; scale (broadcast to it) is the
    magnitude of the terms each element sums, None where nothing cancels (no floor: plain relative error).
    NaN or inf anywhere fails. `what` goes into the message (the case's parameters)."""
    g, w = _f64(got), _f64(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != the reference's {w.shape}"
    s = np.zeros(()) if scale is None else np.broadcast_to(np.abs(_f64(scale)), w.shape)
    diff = np.abs(g - w)
    err, n_want, n_scale = (float(np.linalg.norm(a)) for a in (diff, w, s))
    bound = rtol * n_want + FLOOR_ULPS * unit * n_scale
    if err <= bound:  # (False for NaN)
        return
    where = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf))), w.shape) if w.size else ()
    raise AssertionError(
        f"{what}: ||got - want|| = {err:.3g} > {rtol:g} * ||want|| ({n_want:.3g}) + {FLOOR_ULPS} * {unit:.3g} * "
        f"||scale|| ({n_scale:.3g}) = {bound:.3g}; relative error {err / n_want if n_want else float('inf'):.3g}; "
        f"worst element {tuple(int(i) for i in where)}: got {g[where]!r}, want {w[where]!r}, shape {w.shape}")


def linear_scale(x: Any, w: Any, bias: Any = None, residual: Any = None) -> np.ndarray:
    """|x| @ |w| (+ |bias|) (+ |residual|) in float64: the magnitude of the terms each output of
    x @ w + bias + residual sums (x (..., K), w (K, N); a quantized weight as its dequantized (K, N))."""
    s = np.abs(_f64(x)) @ np.abs(_f64(w))
    for extra in (bias, residual):
        if extra is not None:
            s = s + np.abs(_f64(extra))
    return s


def attention_scale(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """The magnitude attention's outputs are rounded against, (T, H, D) in float64: P |V| (P the softmax
    weights) for the weighted sum of values, times (1 + M), M the row's largest sum of |q| |k| scale: a
    score rounded by u M moves its weight by u M relatively. q (T, H, D), k and v (S, KVH, D), query head
    h reading KV head h // (H // KVH); causal aligns the T queries with the last T keys."""
    q64, k64, v64 = _f64(q), _f64(k), _f64(v)
    (T, H, D), (S, KVH, _) = q64.shape, k64.shape
    kv = np.arange(H) // (H // KVH)
    k64, v64 = k64[:, kv], v64[:, kv]
    c = D ** -0.5 if scale is None else scale
    s = np.einsum("thd,shd->hts", q64, k64) * c  # (H, T, S)
    m = np.einsum("thd,shd->hts", np.abs(q64), np.abs(k64)) * abs(c)
    if causal:
        keep = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
        s, m = np.where(keep, s, -np.inf), np.where(keep, m, 0.0)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    pv = np.einsum("hts,shd->thd", p, np.abs(v64))
    return pv * (1.0 + m.max(-1).T[:, :, None])


def layer_norm_scale(x: Any, g: Any, beta: Any, eps: float) -> np.ndarray:
    """|x^ g| + |beta| in float64, x^ the rows of x normalised (mean 0, variance 1): the magnitude of the
    two terms each output of layer_norm(x, g, beta) sums; as `x` of linear_scale, a layer-norm prologue's."""
    v = _f64(x)
    xhat = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps)
    return np.abs(xhat * _f64(g)) + np.abs(_f64(beta))


def cached_attention_scale(q: Any, k_cache: Any, v_cache: Any, pos: Any, slot: Any,
                           scale: float | None = None) -> np.ndarray:
    """attention_scale for cached_attention: row t of q (T, H, D) attends to the first min(pos[t] + 1, n_ctx)
    positions of slot slot[t] of the caches (slots, n_ctx, KVH, D), as they are after the step's writes."""
    q64, kc, vc = _f64(q), _f64(k_cache), _f64(v_cache)
    rows = []
    for t, (p, s) in enumerate(zip(np.asarray(pos).tolist(), np.asarray(slot).tolist(), strict=True)):
        n = min(p + 1, kc.shape[1])
        rows.append(attention_scale(q64[t:t + 1], kc[s, :n], vc[s, :n], scale=scale)[0])
    return np.stack(rows) if rows else np.zeros(q64.shape)
