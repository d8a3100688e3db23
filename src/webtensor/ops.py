"""webtensor's ops, named like torch.nn.functional. Each validates its inputs (shapes, dtypes,
devices) here, once, then runs on the tensors' device: the numpy reference (`backends.cpu`) or the
WGSL kernels (`backends.wgpu.ops`).
"""

from __future__ import annotations

import math
from typing import Any

from . import activations
from . import dtypes as dt
from .errors import ArgumentError, DTypeError, ShapeError
from .tensor import Tensor, check_same_device, tensor


def _is_cpu(t: Tensor) -> bool:
    return t.device.kind == "cpu"


def _gpu() -> Any:
    from .backends.wgpu import ops as gops

    return gops


def _cpu() -> Any:
    from .backends import cpu

    return cpu


def _wrap(device: Any, arr: Any) -> Tensor:
    return Tensor(device, arr.shape, dt.as_dtype(arr.dtype), array=arr)


def _need_float(op: str, *ts: Tensor) -> None:
    for t in ts:
        if not t.dtype.is_float:
            raise DTypeError(f"{op} needs float32 or float16 tensors, got {t.dtype.name} (shape {t.shape})")


def _result_dtype(*ts: Tensor) -> dt.DType:
    return dt.float16 if all(t.dtype is dt.float16 for t in ts) else dt.float32


def _as_operand(x: Any, like: Tensor, op: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, int | float):
        return tensor(float(x), device=like.device, dtype=like.dtype if like.dtype.is_float else dt.float32)
    raise DTypeError(f"{op}: unsupported operand {type(x).__name__}; use a Tensor or a Python number")


def broadcast_shapes(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"{op}: shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


# -- elementwise --------------------------------------------------------------------------------
def _binary(op: str, a: Any, b: Any) -> Tensor:
    like = a if isinstance(a, Tensor) else b
    a, b = _as_operand(a, like, op), _as_operand(b, like, op)
    dev = check_same_device(op, a, b)
    _need_float(op, a, b)
    shape = broadcast_shapes(op, a.shape, b.shape)
    out_dtype = _result_dtype(a, b)
    if _is_cpu(a):
        return _wrap(dev, getattr(_cpu(), op)(a._array, b._array, out_dtype.name))
    return _gpu().binary(op, a, b, shape, out_dtype)


def add(a: Any, b: Any) -> Tensor:
    """a + b with numpy broadcasting."""
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    return _binary("sub", a, b)


def mul(a: Any, b: Any) -> Tensor:
    """a * b with numpy broadcasting."""
    return _binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    return _binary("div", a, b)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation (GPT-2's `gelu_new`)."""
    _need_float("gelu", x)
    if _is_cpu(x):
        return _wrap(x.device, _cpu().gelu(x._array))
    return _gpu().unary("gelu", x)


def cast(x: Tensor, dtype: dt.DType) -> Tensor:
    if dtype is x.dtype:
        return x
    if _is_cpu(x):
        return _wrap(x.device, _cpu().cast(x._array, dtype.name))
    if dtype is dt.int32 or x.dtype is dt.int32:
        raise DTypeError(f"cast between {x.dtype.name} and {dtype.name} is not supported on WebGPU")
    return _gpu().copy(x, dtype)


def copy(x: Tensor) -> Tensor:
    """A contiguous copy."""
    if _is_cpu(x):
        return _wrap(x.device, x._array.copy())
    return _gpu().copy(x)


def copy_into(dst: Tensor, src: Tensor) -> None:
    """dst[...] = src, where dst is usually a slice view (e.g. rows of a KV cache)."""
    check_same_device("copy_into", dst, src)
    if dst.shape != src.shape:
        raise ShapeError(f"copy_into: destination shape {dst.shape} != source shape {src.shape}")
    if dst.dtype is not src.dtype and not (dst.dtype.is_float and src.dtype.is_float):
        raise DTypeError(f"copy_into: cannot copy {src.dtype.name} into {dst.dtype.name}")
    if _is_cpu(dst):
        dst._array[...] = src._array.astype(dst._array.dtype)
    else:
        _gpu().copy_into(dst, src)


# -- reductions over the last axis --------------------------------------------------------------
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    check_same_device("layer_norm", x, weight, bias)
    _need_float("layer_norm", x, weight, bias)
    C = x.shape[-1] if x.shape else None
    if x.ndim < 1 or weight.shape != (C,) or bias.shape != (C,):
        raise ShapeError(
            f"layer_norm: x {x.shape} needs weight and bias of shape ({C},), got {weight.shape} and {bias.shape}"
        )
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
        raise ArgumentError(f"layer_norm: eps must be a number >= 0, got {eps!r}")
    if _is_cpu(x):
        return _wrap(x.device, _cpu().layer_norm(x._array, weight._array, bias._array, eps))
    return _gpu().layer_norm(x, weight, bias, eps)


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis."""
    _need_float("softmax", x)
    if x.ndim < 1:
        raise ShapeError(f"softmax needs at least 1 dim, got shape {x.shape}")
    if _is_cpu(x):
        return _wrap(x.device, _cpu().softmax(x._array))
    return _gpu().softmax(x)


def argmax(x: Tensor) -> Tensor:
    """Index of the largest value along the last axis (int32; first among ties; NaN wins)."""
    _need_float("argmax", x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ShapeError(f"argmax needs a non-empty last axis, got shape {x.shape}")
    if _is_cpu(x):
        return _wrap(x.device, _cpu().argmax(x._array))
    return _gpu().argmax(x)


# -- matmul, attention, embedding ---------------------------------------------------------------
def matmul(a: Any, b: Any) -> Tensor:
    """a @ b: (..., M, K) @ (K, N) or (..., K, N) with the same leading dims -> (..., M, N).
    A 1-d `a` is treated as one row (M = 1) and the row dim dropped from the result."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise DTypeError(f"matmul: both operands must be Tensors, got {type(a).__name__} @ {type(b).__name__}")
    dev = check_same_device("matmul", a, b)
    _need_float("matmul", a, b)
    squeeze = a.ndim == 1
    if squeeze:
        a = a.reshape(1, a.shape[0])
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul: needs a of at least 1 dim and b of at least 2, got {a.shape} @ {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dims differ: {a.shape} @ {b.shape} ({a.shape[-1]} != {b.shape[-2]})")
    if b.ndim > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"matmul: batch dims differ: {a.shape} @ {b.shape} (b must be 2-d or share a's batch dims)")
    out_dtype = _result_dtype(a, b)
    if _is_cpu(a):
        out = _wrap(dev, _cpu().matmul(a._array, b._array, out_dtype.name))
    else:
        out = _gpu().matmul(a, b, out_dtype)
    return out.reshape(out.shape[:-2] + out.shape[-1:]) if squeeze else out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, act: str | None = None,
           residual: Tensor | None = None) -> Tensor:
    """Fused x @ weight (+ bias) (-> act) (+ residual), one kernel on WebGPU.

    x: (..., K), weight: (K, N) (HF Conv1D layout; pass `w.T` for torch Linear's (N, K)),
    bias: (N,), residual: (..., N). act: None or a name in `webtensor.activations.CODES`
    ("gelu" is "gelu_tanh").

    weight may also be a q8_0 (int8) weight of shape (N, K), nn.Linear's layout: a
    `formats.q8_0.Q8Weight`, or a `backends.wgpu.q8_ops.Q8Gpu` on x's device (see _q8_linear)."""
    if not isinstance(weight, Tensor):  # q8_0 weights
        return _q8_linear(x, weight, bias, act, residual)
    ts = [t for t in (x, weight, bias, residual) if t is not None]
    check_same_device("linear", *ts)
    _need_float("linear", *ts)
    if x.ndim < 1 or weight.ndim != 2 or x.shape[-1] != weight.shape[0]:
        raise ShapeError(f"linear: x {x.shape} @ weight {weight.shape}: needs weight (K, N) with K = x.shape[-1]")
    N = weight.shape[1]
    if bias is not None and bias.shape != (N,):
        raise ShapeError(f"linear: bias must have shape ({N},), got {bias.shape}")
    out_shape = (*x.shape[:-1], N)
    if residual is not None and residual.shape != out_shape:
        raise ShapeError(f"linear: residual must have the output's shape {out_shape}, got {residual.shape}")
    act = activations.canonical(act)
    out_dtype = _result_dtype(x, weight)
    if _is_cpu(x):
        arr = _cpu().linear(x._array, weight._array, None if bias is None else bias._array, act,
                            None if residual is None else residual._array, out_dtype.name)
        return _wrap(x.device, arr)
    x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
    out = _gpu().matmul(x2, weight, out_dtype, bias=bias, act=act,
                        residual=None if residual is None else residual.reshape(x2.shape[:-1] + (N,)))
    return out.reshape(out_shape)


# -- q8_0 (int8) weights in `linear`: a self-contained addition ---------------------------------
def _q8_linear(x: Tensor, weight: Any, bias: Tensor | None, act: str | None, residual: Tensor | None) -> Tensor:
    """linear(x, weight) for a q8_0 weight (N, K): float32 out on either device. CPU: the numpy
    reference (`backends.cpu.q8_linear`); WebGPU: `backends.wgpu.q8_ops.q8_linear` (a Q8Weight is
    uploaded once per device and kept while it lives)."""
    from .formats.q8_0 import Q8Weight

    gpu_weight = type(weight).__name__ == "Q8Gpu"  # (importing q8_ops needs a WebGPU-capable install)
    if not isinstance(weight, Q8Weight) and not gpu_weight:
        raise DTypeError(f"linear: weight must be a Tensor or a q8_0 weight, got {type(weight).__name__}")
    if not isinstance(x, Tensor):
        raise DTypeError(f"linear: x must be a Tensor, got {type(x).__name__}")
    ts = [t for t in (x, bias, residual) if t is not None]
    check_same_device("linear", *ts)
    _need_float("linear", *ts)
    N, K = weight.shape
    if x.ndim < 1 or x.shape[-1] != K:
        raise ShapeError(f"linear: x {x.shape} @ a q8_0 weight of shape {weight.shape} (N, K): needs K = x.shape[-1]")
    if bias is not None and bias.shape != (N,):
        raise ShapeError(f"linear: bias must have shape ({N},), got {bias.shape}")
    out_shape = (*x.shape[:-1], N)
    if residual is not None and residual.shape != out_shape:
        raise ShapeError(f"linear: residual must have the output's shape {out_shape}, got {residual.shape}")
    act = activations.canonical(act)
    if _is_cpu(x):
        if gpu_weight:
            raise DTypeError("linear: a q8_0 weight on a WebGPU device cannot multiply a CPU tensor")
        arr = _cpu().q8_linear(x._array, weight, None if bias is None else bias._array, act,
                               None if residual is None else residual._array)
        return _wrap(x.device, arr)
    from .backends.wgpu import q8_ops

    return q8_ops.q8_linear(x, weight, bias, act, residual)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None) -> Tensor:
    """Scaled dot-product attention. q: (T, H, D), k and v: (S, H, D), S >= T -> (T, H, D).

    With `causal`, query t sees keys 0 .. t + (S - T): the queries are the last T positions of a
    sequence of S, so `k`, `v` may be the first S rows of a KV cache. scale defaults to 1/sqrt(D)."""
    check_same_device("attention", q, k, v)
    _need_float("attention", q, k, v)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ShapeError(f"attention: q, k, v must be (T, H, D) / (S, H, D); got {q.shape}, {k.shape}, {v.shape}")
    T, H, D = q.shape
    S = k.shape[0]
    if k.shape[1:] != (H, D) or v.shape != k.shape:
        raise ShapeError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} disagree on heads / head dim")
    if causal and S < T:
        raise ShapeError(f"attention: causal attention needs at least as many keys as queries (S={S} < T={T})")
    if S == 0:
        raise ShapeError("attention: no keys (S = 0)")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if _is_cpu(q):
        return _wrap(q.device, _cpu().attention(q._array, k._array, v._array, causal, scale))
    return _gpu().attention(q, k, v, causal, scale)


def embedding(table: Tensor, ids: Any) -> Tensor:
    """Rows of `table` (V, C) at `ids` (int32, any shape) -> (*ids.shape, C).

    Ids given as host data (lists, numpy) or as a CPU tensor are range-checked; ids already on a
    WebGPU device are not (that would need a readback), and an out-of-range one there gives an
    unspecified row."""
    if table.ndim != 2:
        raise ShapeError(f"embedding: table must be 2-d (V, C), got {table.shape}")
    V = table.shape[0]
    if not isinstance(ids, Tensor):
        _check_host_ids(ids, V)
        ids = tensor(ids, device=table.device, dtype=dt.int32)
    check_same_device("embedding", table, ids)
    if ids.dtype is not dt.int32:
        raise DTypeError(f"embedding: ids must be int32, got {ids.dtype.name}")
    if _is_cpu(table):
        _check_host_ids(ids._array, V)
        return _wrap(table.device, _cpu().embedding(table._array, ids._array))
    return _gpu().embedding(table.contiguous() if len(table._storage.chunks) == 1 else table, ids)


def _check_host_ids(ids: Any, V: int) -> None:
    try:
        import numpy as np
    except ImportError:  # the browser without numpy: the kernel skips out-of-range ids
        return
    a = np.asarray(ids)
    if not a.size:
        return
    if a.dtype.kind not in "iu":
        raise DTypeError(f"embedding: ids must be integers, got {a.dtype}")
    if a.min() < 0 or a.max() >= V:
        bad = a[(a < 0) | (a >= V)].reshape(-1)[0]
        raise ShapeError(f"embedding: id {bad} is out of range for a table of {V} rows")
