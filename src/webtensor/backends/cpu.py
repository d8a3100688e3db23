"""The CPU reference backend: each op written plainly in numpy, for clarity over speed.

Every WebGPU kernel is tested against these functions. Arithmetic is done in float32 (float16
inputs are widened first, outputs rounded back), mirroring the WGSL kernels, which compute in f32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

F32 = np.float32


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(F32, copy=False)


def add(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) + _f32(b)).astype(out_dtype)


def sub(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) - _f32(b)).astype(out_dtype)


def mul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) * _f32(b)).astype(out_dtype)


def div(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (_f32(a) / _f32(b)).astype(out_dtype)


def matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    # a: (..., M, K), b: (..., K, N) -> (..., M, N)
    return np.matmul(_f32(a), _f32(b)).astype(out_dtype)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
           out_dtype: np.dtype) -> np.ndarray:
    # x: (..., K) @ w: (K, N) + b: (N,) -> act -> + residual: (..., N)
    return _epilogue(_f32(x) @ _f32(w), b, act, residual, out_dtype)


def q8_linear(x: np.ndarray, w: Any, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
              out_dtype: np.dtype = F32) -> np.ndarray:
    # `linear` with a q8_0 weight w (a Q8Weight of shape (N, K)): x (..., K) @ dequantize(w).T,
    # in float32, then the same epilogue
    from ..formats.q8_0 import q8_matmul

    return _epilogue(q8_matmul(_f32(x), w), b, act, residual, out_dtype)


def _epilogue(y: np.ndarray, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
              out_dtype: np.dtype) -> np.ndarray:
    # linear's fused epilogue on the float32 product y: + bias, the activation, + residual
    if b is not None:
        y = y + _f32(b)
    if act is not None:
        y = activation(act, y)
    if residual is not None:
        y = y + _f32(residual)
    return y.astype(out_dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    # GPT-2's tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
    # written as the identical x * sigmoid(2u): no cancellation where tanh(u) is near -1
    # (below u = -40 the value is under 1e-33 in magnitude and is -0.0, as in the WGSL kernel; gelu(-inf) = -0.0)
    v = _f32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        u = F32(np.sqrt(2.0 / np.pi)) * (v + F32(0.044715) * v * v * v)
        y = np.where(u < -40, F32(-0.0), v / (F32(1.0) + np.exp(F32(-2.0) * np.maximum(u, -40))))
    return y.astype(x.dtype)


def _erfc(x: np.ndarray) -> np.ndarray:
    # erfc to ~1.2e-7 relative, the Chebyshev fit epilogue.wgsl uses (numpy has no erf); in float64
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(-z * z + poly)
    return np.where(x >= 0, r, 2.0 - r)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))  # torch's threshold of 20


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow of exp(-x)


def _gelu_erf(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * _erfc(-v / np.sqrt(2.0))


_ACTS = {  # the activations of webtensor.activations.CODES (gelu_tanh is `gelu` above), in float64
    "gelu_erf": _gelu_erf,
    "gelu_erf_clip10": lambda v: np.clip(_gelu_erf(v), -10.0, 10.0),
    "quick_gelu": lambda v: v * _sigmoid(1.702 * v),
    "relu": lambda v: np.maximum(v, 0.0),
    "relu2": lambda v: np.maximum(v, 0.0) ** 2,
    "relu6": lambda v: np.clip(v, 0.0, 6.0),
    "leaky_relu": lambda v: np.where(v >= 0, v, 0.01 * v),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda v: v * _sigmoid(v),
    "hardswish": lambda v: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0,
    "mish": lambda v: v * np.tanh(_softplus(v)),
    "laplace": lambda v: 0.5 * _erfc(-(v - 0.707107) / (0.282095 * np.sqrt(2.0))),
    "sqrt_softplus": lambda v: np.sqrt(_softplus(v)),
}


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """The activation `name` (a key of webtensor.activations.CODES) elementwise, in x's dtype."""
    if name == "gelu_tanh":
        return gelu(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return _ACTS[name](x.astype(np.float64)).astype(x.dtype)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    # x: (..., C); normalise over C, then scale by w (C,) and shift by b (C,). Statistics in
    # float64: no overflow of the variance for any float32 input.
    v = x.astype(np.float64)
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (v - mean) / np.sqrt(var + eps)
    return (y * w.astype(np.float64) + b.astype(np.float64)).astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    v = _f32(x)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    # q: (T, H, D), k and v: (S, H, D) with S >= T; query t sees keys j <= t + (S - T) if causal
    T, S = q.shape[0], k.shape[0]
    qh, kh, vh = (_f32(t).transpose(1, 0, 2) for t in (q, k, v))  # (H, T, D), (H, S, D)
    scores = (qh @ kh.transpose(0, 2, 1)) * F32(scale)  # (H, T, S)
    if causal:
        visible = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
        scores = np.where(visible[None], scores, -np.inf)
    probs = softmax(scores)
    return (probs @ vh).transpose(1, 0, 2).astype(q.dtype)  # (T, H, D)


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    # table: (V, C), ids: (...) -> (..., C)
    return table[ids]


def argmax(x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=-1).astype(np.int32)


def cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return x.astype(dtype)
