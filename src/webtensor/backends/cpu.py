"""The CPU reference backend: each op written plainly in numpy, for clarity over speed.

Every WebGPU kernel is tested against these functions. Arithmetic is done in float32 (float16
inputs are widened first, outputs rounded back), mirroring the WGSL kernels, which compute in f32.
`CpuBackend` (at the end) implements `backends.base.Backend` with them: a CPU tensor's storage is
one flat numpy array (`CpuStorage`) and a tensor is a strided view of it, as on the GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import DeviceMismatchError

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


def cache_write(cache: np.ndarray, src: np.ndarray, pos: np.ndarray, slot: np.ndarray) -> None:
    # cache: (n_slots, n_ctx, H, D) float32; src: (T, H, D); row t goes to cache[slot[t], pos[t]]
    # (rows whose position is past the context are skipped, as in cache_write.wgsl)
    for t in range(src.shape[0]):
        if 0 <= pos[t] < cache.shape[1]:
            cache[slot[t], pos[t]] = _f32(src[t])


def cached_attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: np.ndarray, slot: np.ndarray,
                     scale: float) -> np.ndarray:
    # q: (T, H, D); kc, vc: (n_slots, n_ctx, H, D); row t attends to positions 0..pos[t] of slot[t]
    # (each row as `attention` computes one query, non-causal: the same numpy operations in the same
    # order, without its conversions and masks)
    out = np.empty(q.shape, F32)
    qh = _f32(q)[:, :, None, :]  # (T, H, 1, D)
    sc = F32(scale)
    for t in range(q.shape[0]):
        n = min(int(pos[t]) + 1, kc.shape[1])
        k, v = kc[slot[t], :n].transpose(1, 0, 2), vc[slot[t], :n].transpose(1, 0, 2)  # (H, n, D)
        scores = (qh[t] @ k.transpose(0, 2, 1)) * sc  # (H, 1, n)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out[t] = ((e / e.sum(axis=-1, keepdims=True)) @ v)[:, 0]
    return out


def advance_tokens(new: np.ndarray, ids: np.ndarray, pos: np.ndarray, tokens: np.ndarray,
                   count: np.ndarray) -> None:
    # the end of a decode step (advance_tokens.wgsl): new tokens become the next ids, positions
    # move on, and the tokens are appended to the ring `tokens` (ring, B) at step count[0]
    n, B = int(count[0]), new.shape[0]
    ids[:] = new
    pos += 1
    if n < tokens.size // max(B, 1):
        tokens.reshape(-1, B)[n] = new
    count[0] = n + 1


# -- the Backend ---------------------------------------------------------------------------------
class CpuStorage:
    """A CPU tensor's memory: one flat numpy array (`chunks` is for the GPU's row chunking)."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array: np.ndarray):
        self.array = array  # 1-d, contiguous

    @property
    def chunks(self) -> tuple[np.ndarray]:
        return (self.array,)


def view(t: Any) -> np.ndarray:
    """The numpy view of tensor `t` (shares its memory: writing to it writes the tensor)."""
    a = t._storage.array
    if t.size == 0:
        return np.empty(t.shape, a.dtype)
    # (np.ndarray over the storage's buffer: the same view as as_strided, several times cheaper,
    # which counts at ~140 views a decode step)
    return np.ndarray(t.shape, a.dtype, a, t._offset * a.itemsize, tuple(s * a.itemsize for s in t._strides))


class _Replay:
    """The CPU's 'graph': the captured function, called on each replay (like WebGPU's, capturing
    runs nothing; a replay returns the function's outputs)."""

    def __init__(self, fn: Any):
        self.fn, self.outputs = fn, None
        self.n_dispatches, self.names = 0, []

    def replay(self, times: int = 1) -> Any:
        for _ in range(times):
            self.outputs = self.fn()
        return self.outputs

    def release(self) -> None:
        self.fn = None


_DTYPES: dict[Any, Any] = {}  # numpy dtype -> webtensor DType, and "Tensor" -> the Tensor class (CpuBackend._wrap)


class CpuBackend:
    """The numpy reference device (see backends/base.py for the protocol)."""

    name = "cpu"
    kmajor_weights = False  # matrices as the checkpoint has them
    host_memory = True  # tensors live in host memory (reading them is free)

    def _wrap(self, device: Any, arr: np.ndarray) -> Any:
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            arr = arr.copy(order="C")
        dtype = _DTYPES.get(arr.dtype)
        if dtype is None:  # (imports and dtype lookups cached: a decode step wraps ~30 results)
            from ..dtypes import as_dtype
            from ..tensor import Tensor

            dtype = _DTYPES[arr.dtype] = as_dtype(arr.dtype)
            _DTYPES["Tensor"] = Tensor
        return _DTYPES["Tensor"](device, arr.shape, dtype, storage=CpuStorage(arr.reshape(-1)))

    def from_numpy(self, device: Any, arr: np.ndarray, owned: bool) -> Any:
        """`arr` as a tensor: kept as it is when `owned` (a fresh array nobody else holds), else copied."""
        return self._wrap(device, arr if owned else arr.copy())

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, device: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._wrap(device, np.empty(shape, dtype.name))

    def zeros(self, device: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._wrap(device, np.zeros(shape, dtype.name))

    def from_bytes(self, device: Any, shape: tuple[int, ...], dtype: Any, data: memoryview) -> Any:
        return self._wrap(device, np.frombuffer(data, dtype.name).reshape(shape).copy())

    def to_bytes(self, t: Any) -> bytes:
        return np.ascontiguousarray(view(t)).tobytes()

    def to_numpy(self, t: Any) -> np.ndarray:
        return np.array(view(t))

    def upload_into(self, t: Any, data: bytes) -> None:
        view(t)[...] = np.frombuffer(data, t.dtype.name).reshape(t.shape)

    def read_async(self, t: Any) -> Any:
        data = self.to_bytes(t)
        return _Ready(data)

    # -- ops ------------------------------------------------------------------------------------
    def binary(self, op: str, a: Any, b: Any, shape: tuple[int, ...], out_dtype: Any) -> Any:
        fn = {"add": add, "sub": sub, "mul": mul, "div": div}[op]
        return self._wrap(a.device, fn(view(a), view(b), out_dtype.name))

    def gelu(self, x: Any) -> Any:
        return self._wrap(x.device, gelu(view(x)))

    def cast(self, x: Any, dtype: Any) -> Any:
        return self._wrap(x.device, cast(view(x), dtype.name))

    def copy(self, x: Any) -> Any:
        return self._wrap(x.device, view(x).copy())

    def copy_into(self, dst: Any, src: Any) -> None:
        d = view(dst)
        d[...] = view(src).astype(d.dtype)  # (numpy handles overlapping views by buffering)

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        return self._wrap(x.device, layer_norm(view(x), view(w), view(b), eps))

    def softmax(self, x: Any) -> Any:
        return self._wrap(x.device, softmax(view(x)))

    def argmax(self, x: Any) -> Any:
        return self._wrap(x.device, argmax(view(x)))

    def matmul(self, a: Any, b: Any, out_dtype: Any) -> Any:
        return self._wrap(a.device, matmul(view(a), view(b), out_dtype.name))

    def linear(self, x: Any, w: Any, bias: Any, act: str | None, residual: Any, ln: Any, out_dtype: Any) -> Any:
        xa = view(x)
        if ln is not None:
            xa = layer_norm(_f32(xa), view(ln[0]), view(ln[1]), ln[2])
        arr = linear(xa, view(w), None if bias is None else view(bias), act,
                     None if residual is None else view(residual), out_dtype.name)
        return self._wrap(x.device, arr)

    def q8_linear(self, x: Any, w: Any, bias: Any, act: str | None, residual: Any, ln: Any) -> Any:
        if type(w).__name__ != "Q8Weight":
            raise DeviceMismatchError(f"linear: the q8_0 weight lives on {w.device.describe()}, the input on the CPU; "
                                      "pass the Q8Weight (it is uploaded where it is used)")
        xa = view(x) if ln is None else layer_norm(_f32(view(x)), view(ln[0]), view(ln[1]), ln[2])
        return self._wrap(x.device, q8_linear(xa, w, None if bias is None else view(bias), act,
                                              None if residual is None else view(residual)))

    def q8_embedding(self, table: Any, ids: Any) -> Any:
        if type(table).__name__ != "Q8Weight":
            raise DeviceMismatchError(f"embedding: the q8_0 table lives on {table.device.describe()}, "
                                      "the ids on the CPU")
        idx = view(ids)
        rows = table.dequantize(idx.reshape(-1))  # (n, C) float32
        return self._wrap(ids.device, rows.reshape(*idx.shape, table.shape[1]))

    def attention(self, q: Any, k: Any, v: Any, causal: bool, scale: float) -> Any:
        return self._wrap(q.device, attention(view(q), view(k), view(v), causal, scale))

    def embedding(self, table: Any, ids: Any) -> Any:
        return self._wrap(table.device, embedding(view(table), view(ids)))

    def cache_write(self, cache: Any, src: Any, pos: Any, slot: Any) -> None:
        cache_write(view(cache), view(src), view(pos), view(slot))

    def cached_attention(self, q: Any, kc: Any, vc: Any, pos: Any, slot: Any, scale: float,
                         k_new: Any = None, v_new: Any = None) -> Any:
        if k_new is not None:
            self.cache_write(kc, k_new, pos, slot)
            self.cache_write(vc, v_new, pos, slot)
        return self._wrap(q.device, cached_attention(view(q), view(kc), view(vc), view(pos), view(slot), scale))

    def advance_tokens(self, new: Any, ids: Any, pos: Any, tokens: Any, count: Any) -> None:
        advance_tokens(view(new), view(ids), view(pos), view(tokens), view(count))

    # -- execution ------------------------------------------------------------------------------
    def scope(self) -> Any:
        return contextlib.nullcontext()

    def capture(self, fn: Any) -> _Replay:
        return _Replay(fn)

    def synchronize(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return dict(dispatches=0, submits=0, readbacks=0, bytes_uploaded=0, bytes_read=0, bytes_in_use=0)

    def describe(self) -> str:
        return "CPU (reference)"

    def max_binding_bytes(self) -> int:
        return 2**63 - 1

    def has_f16(self) -> bool:
        return True

    def has_subgroups(self) -> bool:
        return False

    def same_as(self, other: Any) -> bool:
        return isinstance(other, CpuBackend)

    def empty_cache(self) -> None:
        pass

    def release(self) -> None:
        pass


class _Ready:
    """A readback that is already complete (the CPU's answer to WebGPU's read_async)."""

    def __init__(self, data: bytes):
        self.data = data

    def wait(self) -> memoryview:
        return memoryview(self.data)
