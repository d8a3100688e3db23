"""webtensor's ops, named like torch.nn.functional. Each validates its inputs (shapes, dtypes,
devices, option values) here, once, for every device, then calls the method of the same name on
the tensors' backend (`backends.base.Backend`: the numpy reference or the WGSL planners). Nothing
here branches on the device kind, so both devices accept and refuse exactly the same inputs.
"""

from __future__ import annotations

import math
from typing import Any

from . import activations
from . import dtypes as dt
from .errors import ArgumentError, DTypeError, ShapeError
from .quant.kv import q8_head_dim, q8_words
from .quant.types import Quantized
from .tensor import Tensor, check_same_device, tensor


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
    return dev.backend.binary(op, a, b, shape, _result_dtype(a, b))


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
    return x.device.backend.gelu(x)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up elementwise (silu(g) = g * sigmoid(g)), one launch: the gated MLP of the Llama
    family. gate and up (..., F) of one shape; either may be a strided view (the two halves of a fused
    (T, 2F) gate_up product). float32 arithmetic; float16 only when both are."""
    dev = check_same_device("swiglu", gate, up)
    _need_float("swiglu", gate, up)
    if gate.shape != up.shape:
        raise ShapeError(f"swiglu: gate {gate.shape} and up {up.shape} must have the same shape")
    return dev.backend.swiglu(gate, up, _result_dtype(gate, up))


def cast(x: Tensor, dtype: dt.DType) -> Tensor:
    dtype = dt.as_dtype(dtype)
    if dtype is x.dtype:
        return x
    if dtype is dt.int32 or x.dtype is dt.int32:
        raise DTypeError(f"cast between {x.dtype.name} and {dtype.name} is not supported (float types only)")
    if dtype is dt.float16 and not x.device.has_f16:
        raise DTypeError(f"{x.device.describe()} has no shader-f16 feature: float16 tensors are not supported there")
    return x.device.backend.cast(x, dtype)


def copy(x: Tensor) -> Tensor:
    """A contiguous copy."""
    return x.device.backend.copy(x)


def copy_into(dst: Tensor, src: Tensor) -> None:
    """dst[...] = src, where dst is usually a slice view (e.g. rows of a KV cache)."""
    check_same_device("copy_into", dst, src)
    if dst.shape != src.shape:
        raise ShapeError(f"copy_into: destination shape {dst.shape} != source shape {src.shape}")
    if dst.dtype is not src.dtype and not (dst.dtype.is_float and src.dtype.is_float):
        raise DTypeError(f"copy_into: cannot copy {src.dtype.name} into {dst.dtype.name}")
    dst.device.backend.copy_into(dst, src)


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
    eps = _check_eps("layer_norm", eps)
    return x.device.backend.layer_norm(x, weight, bias, float(eps))


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight, in float32 arithmetic, the
    result a new contiguous tensor in x's dtype. x (..., C) may be a strided view, e.g. the q heads
    (T, H, D) of a fused qkv output with weight (D,) (Qwen3's QK-norm), read where it lies."""
    check_same_device("rms_norm", x, weight)
    _need_float("rms_norm", x, weight)
    C = x.shape[-1] if x.shape else None
    if x.ndim < 1 or weight.shape != (C,):
        raise ShapeError(f"rms_norm: x {x.shape} needs weight of shape ({C},), got {weight.shape}")
    eps = _check_eps("rms_norm", eps)
    return x.device.backend.rms_norm(x, weight, eps)


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis."""
    _need_float("softmax", x)
    if x.ndim < 1:
        raise ShapeError(f"softmax needs at least 1 dim, got shape {x.shape}")
    return x.device.backend.softmax(x)


def argmax(x: Tensor) -> Tensor:
    """Index of the largest value along the last axis (int32; first among ties; NaN wins)."""
    _need_float("argmax", x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ShapeError(f"argmax needs a non-empty last axis, got shape {x.shape}")
    return x.device.backend.argmax(x)


def token_mask(x: Tensor, bits: Tensor) -> Tensor:
    """x (..., V) where each column's bit is set, -inf elsewhere (a grammar's allowed tokens applied to logits
    rows before the argmax and the readback): bits int32 (..., ceil(V / 32)), column c's bit is bit c % 32
    (least significant first) of word c // 32 of its row's words (llguidance's bit masks). A new tensor in x's
    dtype; NaN logits stay NaN where allowed."""
    check_same_device("token_mask", x, bits)
    _need_float("token_mask", x)
    if x.ndim < 1 or bits.dtype is not dt.int32:
        raise DTypeError(f"token_mask: x (..., V) float and bits int32, got {x.dtype.name} {x.shape} and "
                         f"{bits.dtype.name} {bits.shape}")
    words = (x.shape[-1] + 31) // 32
    if bits.shape != x.shape[:-1] + (words,):
        raise ShapeError(f"token_mask: bits must be {x.shape[:-1] + (words,)} for x {x.shape}, got {bits.shape}")
    return x.device.backend.token_mask(x, bits)


# -- rotary position embedding -------------------------------------------------------------------
def rope(x: Tensor, pos: Any, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotary position embedding of x (T, H, D) (a strided view is read where it lies: the q and k
    heads of a fused qkv output) by the positions pos (int32 (T,)) -> a new contiguous (T, H, D) in
    x's dtype, float32 arithmetic.

    cos, sin: float32 (P, R/2) tables, row p for position p, R <= D even: dims 0..R-1 rotate, the
    rest pass through. interleaved=False pairs dims (i, i + R/2) (HF's rotate_half): for i < R/2,
    out[i] = x[i] cos - x[i + R/2] sin and out[i + R/2] = x[i + R/2] cos + x[i] sin, with cos, sin
    of row pos[t], column i; True pairs (2i, 2i + 1) the same way (GPT-J, llama.cpp's "normal").

    Positions given as host data (lists, numpy) are checked against P here, a CPU tensor's by the
    CPU backend (on every call and graph replay); positions on a WebGPU device are not (that would
    need a readback): there a position outside 0..P-1 is clamped to P - 1 (rope.wgsl)."""
    if not isinstance(x, Tensor) or not isinstance(cos, Tensor) or not isinstance(sin, Tensor):
        raise DTypeError("rope: x, cos and sin must be Tensors")
    _need_float("rope", x)
    if x.ndim != 3:
        raise ShapeError(f"rope: x must be (T, H, D), got {x.shape}")
    T, _, D = x.shape
    if cos.dtype is not dt.float32 or sin.dtype is not dt.float32:
        raise DTypeError(f"rope: cos and sin must be float32 tables, got {cos.dtype.name} and {sin.dtype.name}")
    if cos.ndim != 2 or sin.shape != cos.shape or cos.shape[0] < 1 or cos.shape[1] < 1:
        raise ShapeError(f"rope: cos and sin must be tables of one shape (P, R/2) with P, R/2 >= 1, "
                         f"got {cos.shape} and {sin.shape}")
    P, half = cos.shape
    if 2 * half > D:
        raise ShapeError(f"rope: tables of {half} columns rotate R = {2 * half} dims, more than the head dim {D}")
    if not isinstance(pos, Tensor):
        _check_host_positions(pos, P)
        pos = tensor(pos, device=x.device, dtype=dt.int32)
    _int_vector("rope", "pos", pos, T)
    check_same_device("rope", x, pos, cos, sin)
    if not isinstance(interleaved, bool):
        raise ArgumentError(f"rope: interleaved must be True or False, got {interleaved!r}")
    return x.device.backend.rope(x, pos, cos, sin, interleaved)


def _check_host_positions(pos: Any, P: int) -> None:
    try:
        import numpy as np
    except ImportError:  # the browser without numpy: the kernel clamps
        return
    a = np.asarray(pos)
    if not a.size:
        return
    if a.dtype.kind not in "iu":
        raise DTypeError(f"rope: positions must be integers, got {a.dtype}")
    if a.min() < 0 or a.max() >= P:
        bad = a[(a < 0) | (a >= P)].reshape(-1)[0]
        raise ShapeError(f"rope: position {bad} is outside the cos / sin tables of {P} rows")


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
    out = dev.backend.matmul(a, b, _result_dtype(a, b))
    return out.reshape(out.shape[:-2] + out.shape[-1:]) if squeeze else out


def linear(x: Tensor, weight: Any, bias: Tensor | None = None, act: str | None = None,
           residual: Tensor | None = None, ln: tuple[Tensor, Tensor, float] | None = None,
           rms: tuple[Tensor, float] | None = None, glu: str | None = None) -> Tensor:
    """Fused (layer_norm(x) if ln, rms_norm(x) if rms, swiglu of x's halves if glu) @ weight (+ bias)
    (-> act) (+ residual), one kernel where the device can (the GEMV of a decode step takes the norm
    or the gating in its prologue; elsewhere they run as their own launch first, with the same result).

    x: (..., K), weight: (K, N) (HF Conv1D layout; pass `w.T` for torch Linear's (N, K)),
    bias: (N,), residual: (..., N), ln: (weight (K,), bias (K,), eps), rms: (weight (K,), eps)
    (at most one of ln and rms). act: None or a name in `webtensor.activations.CODES` ("gelu" is
    "gelu_tanh"). glu="swiglu": x is (..., 2K), the gate and up halves [g | u] of a fused gate_up
    product, and the product's input is swiglu(g, u) = silu(g) * u (..., K) (the gated MLP's down
    projection; not with ln or rms).

    weight may also be a quantized weight of shape (N, K), nn.Linear's layout, in any of
    `quant.TYPES` (`quant.QuantWeight`, or its upload `backends.wgpu.quant_ops.QuantGpu`):
    dequantized on WebGPU as the kernels read it (in registers, or tile by tile in workgroup memory), by
    the numpy reference on the CPU; the result is float32."""
    quantized = _is_quant("linear", "weight", weight)
    if not isinstance(x, Tensor):
        raise DTypeError(f"linear: x must be a Tensor, got {type(x).__name__}")
    if glu is not None and glu != "swiglu":
        raise ArgumentError(f"linear: glu must be None or 'swiglu', got {glu!r}")
    if glu is not None and (ln is not None or rms is not None):
        raise ArgumentError("linear: glu (a gated input) does not combine with a norm prologue (ln, rms)")
    width = 2 if glu is not None else 1  # x's last axis: K values a row, 2K with glu (gate | up)
    ts = [t for t in (x, None if quantized else weight, bias, residual) if t is not None]
    if ln is not None and rms is not None:
        raise ArgumentError("linear: give ln (a layer-norm prologue) or rms (an RMS-norm one), not both")
    if ln is not None:
        if not (isinstance(ln, tuple) and len(ln) == 3 and all(isinstance(t, Tensor) for t in ln[:2])):
            raise ArgumentError("linear: ln must be (weight, bias, eps)")
        ts += list(ln[:2])
    if rms is not None:
        if not (isinstance(rms, tuple) and len(rms) == 2 and isinstance(rms[0], Tensor)):
            raise ArgumentError("linear: rms must be (weight, eps)")
        ts.append(rms[0])
    dev = check_same_device("linear", *ts)
    _need_float("linear", *ts)
    if quantized:
        N, K = weight.shape
        if x.ndim < 1 or x.shape[-1] != width * K:
            raise ShapeError(f"linear: x {x.shape} @ a {weight.qtype} weight of shape {weight.shape} (N, K): "
                             f"needs {'2K' if glu else 'K'} = x.shape[-1]")
    else:
        if x.ndim < 1 or weight.ndim != 2 or x.shape[-1] != width * weight.shape[0]:
            raise ShapeError(f"linear: x {x.shape} @ weight {weight.shape}: needs weight (K, N) with "
                             f"{'2K' if glu else 'K'} = x.shape[-1]")
        K, N = weight.shape
    if bias is not None and bias.shape != (N,):
        raise ShapeError(f"linear: bias must have shape ({N},), got {bias.shape}")
    out_shape = (*x.shape[:-1], N)
    if residual is not None and residual.shape != out_shape:
        raise ShapeError(f"linear: residual must have the output's shape {out_shape}, got {residual.shape}")
    if ln is not None:
        if ln[0].shape != (K,) or ln[1].shape != (K,):
            raise ShapeError(f"linear: ln weight and bias must have shape ({K},), got {ln[0].shape}, {ln[1].shape}")
        ln = (ln[0], ln[1], _check_eps("linear", ln[2]))
    if rms is not None:
        if rms[0].shape != (K,):
            raise ShapeError(f"linear: rms weight must have shape ({K},), got {rms[0].shape}")
        rms = (rms[0], _check_eps("linear", rms[1]))
    if quantized:
        return dev.backend.quant_linear(x, weight, bias, activations.canonical(act), residual, ln, rms, glu)
    act = activations.canonical(act)
    return dev.backend.linear(x, weight, bias, act, residual, ln, _result_dtype(x, weight), rms, glu)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None) -> Tensor:
    """Scaled dot-product attention. q: (T, H, D), k and v: (S, KVH, D), S >= T -> (T, H, D).

    Grouped-query attention where KVH < H (H % KVH == 0): query head h reads key / value head
    h // (H // KVH); KVH = 1 is multi-query attention, KVH = H the plain multi-head case.
    With `causal`, query t sees keys 0 .. t + (S - T): the queries are the last T positions of a
    sequence of S, so `k`, `v` may be the first S rows of a KV cache. scale defaults to 1/sqrt(D)."""
    check_same_device("attention", q, k, v)
    _need_float("attention", q, k, v)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ShapeError(f"attention: q, k, v must be (T, H, D) / (S, KVH, D); got {q.shape}, {k.shape}, {v.shape}")
    T, H, D = q.shape
    S = k.shape[0]
    if k.shape[2] != D or v.shape != k.shape:
        raise ShapeError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} disagree on the head dim, "
                         "or k and v differ")
    _check_heads("attention", H, k.shape[1])
    if causal and S < T:
        raise ShapeError(f"attention: causal attention needs at least as many keys as queries (S={S} < T={T})")
    if S == 0:
        raise ShapeError("attention: no keys (S = 0)")
    return q.device.backend.attention(q, k, v, bool(causal), _scale(scale, D))


def embedding(table: Tensor | Quantized, ids: Any) -> Tensor:
    """Rows of `table` (V, C) at `ids` (int32, any shape) -> (*ids.shape, C). The table may be a
    quantized weight (`quant.QuantWeight` or its upload `QuantGpu`): its rows come back
    dequantized, float32.

    Ids given as host data (lists, numpy) are range-checked here, a CPU tensor's by the CPU backend
    (on every call and graph replay); ids already on a WebGPU device are not (that would need a
    readback), and an out-of-range one there gives an unspecified row."""
    _is_quant("embedding", "table", table)
    if len(table.shape) != 2:
        raise ShapeError(f"embedding: table must be 2-d (V, C), got {table.shape}")
    V = table.shape[0]
    if isinstance(ids, Tensor):
        idx = ids
    else:
        _check_host_ids(ids, V)
        if not isinstance(table, Tensor):
            raise DTypeError(f"embedding: with a {table.qtype} table, give the ids as an int32 Tensor on the device")
        idx = tensor(ids, device=table.device, dtype=dt.int32)
    if isinstance(table, Tensor):
        check_same_device("embedding", table, idx)
    if idx.dtype is not dt.int32:
        raise DTypeError(f"embedding: ids must be int32, got {idx.dtype.name}")
    if not isinstance(table, Tensor):
        return idx.device.backend.quant_embedding(table, idx)
    return idx.device.backend.embedding(table, idx)


def _is_quant(op: str, name: str, w: Any) -> bool:
    """Whether `w` is a quantized weight (`quant.types.Quantized`: a QuantWeight or its upload, a
    numpy-free check); a Tensor is not; anything else is refused."""
    if isinstance(w, Tensor):
        return False
    if not isinstance(w, Quantized):
        raise DTypeError(f"{op}: {name} must be a Tensor or a quantized weight (webtensor.quant), "
                         f"got {type(w).__name__}")
    return True


def _check_heads(op: str, H: int, KVH: int) -> None:
    """Grouped-query attention's rule: the H query heads split evenly over the KVH key / value heads."""
    if (KVH == 0 and H != 0) or (KVH and H % KVH):
        raise ShapeError(f"{op}: {H} query heads do not split evenly over {KVH} key/value heads "
                         "(needs H % KVH == 0)")


def _check_eps(op: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
        raise ArgumentError(f"{op}: eps must be a number >= 0, got {eps!r}")
    return float(eps)


def _scale(scale: Any, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D) if D else 1.0
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ArgumentError(f"attention: scale must be a finite number, got {scale!r}")
    return float(scale)


# -- the KV cache (a decode step whose positions live on the device) -----------------------------
def _int_vector(op: str, name: str, t: Any, T: int) -> None:
    if not isinstance(t, Tensor) or t.dtype is not dt.int32 or t.shape != (T,):
        got = f"{t.dtype.name} {t.shape}" if isinstance(t, Tensor) else type(t).__name__
        raise ShapeError(f"{op}: {name} must be an int32 tensor of shape ({T},), got {got}")


def _check_cache(op: str, cache: Tensor, H: int, D: int) -> None:
    """A KV cache: contiguous (n_blocks, block_size, H, D) float32 / float16, or a q8_0 pool: int32 (n_blocks,
    block_size, H, q8_words(D)) with D a multiple of 32 (`quant.kv`)."""
    q8 = cache.dtype is dt.int32
    last = q8_words(D) if q8 else D
    if (cache.ndim != 4 or cache.shape[2:] != (H, last) or cache.dtype not in (dt.float32, dt.float16, dt.int32)
            or not cache.is_contiguous() or (q8 and D % 32)):
        want = f"int32 (blocks, block_size, {H}, {last}) for q8_0" if q8 else f"(blocks, block_size, {H}, {D})"
        raise ShapeError(f"{op}: a KV cache is a contiguous float32 or float16 tensor (blocks, block_size, KVH, D) "
                         f"or a q8_0 pool int32 (blocks, block_size, KVH, D/4 + ceil(D/64)) with D % 32 == 0; "
                         f"expected {want}, got {cache.dtype.name} {cache.shape}")


def _check_table(op: str, table: Any, cache: Tensor) -> None:
    """A block table: None (a contiguous cache: slot s is block s) or an int32 (n_seqs, max_blocks) tensor on the
    cache's device, entries block ids (any other value: no block)."""
    if table is None:
        return
    if not isinstance(table, Tensor) or table.dtype is not dt.int32 or table.ndim != 2 or not table.is_contiguous():
        got = f"{table.dtype.name} {table.shape}" if isinstance(table, Tensor) else type(table).__name__
        raise ShapeError(f"{op}: a block table is a contiguous int32 tensor (n_seqs, max_blocks), got {got}")
    check_same_device(op, cache, table)


Rope = tuple[Tensor, Tensor, bool]  # (cos, sin, interleaved): `rope`'s tables and pairing


def _check_rope(op: str, rope: Any, D: int, x: Tensor) -> Rope | None:
    """A fused rotary embedding's (cos, sin, interleaved), checked as `rope` checks them."""
    if rope is None:
        return None
    if not (isinstance(rope, tuple) and len(rope) == 3 and isinstance(rope[0], Tensor)
            and isinstance(rope[1], Tensor) and isinstance(rope[2], bool)):
        raise ArgumentError(f"{op}: rope must be (cos, sin, interleaved): two float32 tables and a bool")
    cos, sin, interleaved = rope
    check_same_device(op, x, cos, sin)
    if cos.dtype is not dt.float32 or sin.dtype is not dt.float32:
        raise DTypeError(f"{op}: rope's cos and sin must be float32 tables, got {cos.dtype.name} and {sin.dtype.name}")
    if cos.ndim != 2 or sin.shape != cos.shape or cos.shape[0] < 1 or cos.shape[1] < 1:
        raise ShapeError(f"{op}: rope's cos and sin must be tables of one shape (P, R/2) with P, R/2 >= 1, "
                         f"got {cos.shape} and {sin.shape}")
    if 2 * cos.shape[1] > D:
        raise ShapeError(f"{op}: rope tables of {cos.shape[1]} columns rotate R = {2 * cos.shape[1]} dims, "
                         f"more than the head dim {D}")
    return cos, sin, interleaved


def cache_write(cache: Tensor, src: Tensor, pos: Tensor, slot: Tensor, rope: Rope | None = None,
                table: Tensor | None = None) -> None:
    """Position pos[t] of sequence slot[t] of a KV cache gets src[t] for each row t: src (T, KVH, D) into a
    cache (`_check_cache`: float32, float16, or q8_0 blocks of 32 values, rounded or quantized as stored);
    pos, slot: int32 (T,) tensors on the device (so a replayed graph writes where they say). With a block
    `table` (int32 (n_seqs, max_blocks)) the cache is a pool of blocks of block_size = cache.shape[1] positions
    and position p of sequence s is row table[s, p // block_size] * block_size + p % block_size of it; without
    one, sequence s is block s (a contiguous (n_slots, n_ctx, ...) cache). Rows whose position is negative or
    past the table (past n_ctx) are skipped; a slot outside the table (the cache) or a position whose block is
    not in the pool: the CPU raises a ShapeError, a WebGPU kernel skips the row (GPU data is not read back).
    With rope = (cos, sin, interleaved), src is stored rotated: `rope(src, pos, cos, sin, interleaved)` (its
    rules for the tables and positions), in the same launch."""
    check_same_device("cache_write", cache, src, pos, slot)
    _need_float("cache_write", src)
    if src.ndim != 3:
        raise ShapeError(f"cache_write: src must be (T, H, D), got {src.shape}")
    T, H, D = src.shape
    _check_cache("cache_write", cache, H, D)
    _check_table("cache_write", table, cache)
    _int_vector("cache_write", "pos", pos, T)
    _int_vector("cache_write", "slot", slot, T)
    cache.device.backend.cache_write(cache, src, pos, slot, _check_rope("cache_write", rope, D, src), table)


def cached_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, slot: Tensor,
                     scale: float | None = None, k_new: Tensor | None = None, v_new: Tensor | None = None,
                     rope: Rope | None = None, table: Tensor | None = None) -> Tensor:
    """Attention of query rows against KV caches: q (T, H, D), caches (`cache_write`'s: blocks of KVH heads)
    with H % KVH == 0 (query head h reads cache head h // (H // KVH)); row t sees positions 0..pos[t] of
    sequence slot[t] (the rows may belong to different sequences), through the block `table` where given
    (`cache_write`) -> (T, H, D) float32.

    With `k_new`, `v_new` (T, KVH, D), each row's key and value are stored at its position of its
    sequence (`cache_write`) by the same launch, and the row attends to them as stored (rounded to the
    cache's type); the rows must then have distinct slots (a decode step over several sequences), since
    no row waits for another's store. Slots and blocks out of range: as in `cache_write`.

    With rope = (cos, sin, interleaved), q and k_new are rotated at their rows' positions first
    (`rope(q, pos, cos, sin, interleaved)`, its rules for the tables and positions), so the rotated
    key is the one stored and attended to; the cache's rows are taken as they are (stored rotated).
    One launch on WebGPU where the tables are views of one buffer (e.g. of one (2, P, R/2) tensor),
    else rope launches first."""
    news = [t for t in (k_new, v_new) if t is not None]
    if len(news) == 1:
        raise ArgumentError("cached_attention: give both k_new and v_new, or neither")
    T, KVH, D = _check_attention_rows("cached_attention", q, k_cache, v_cache, pos, slot, table, *news)
    _need_float("cached_attention", *news)
    if any(t.shape != (T, KVH, D) for t in news):
        raise ShapeError(f"cached_attention: k_new and v_new must be (T, KVH, D) = {(T, KVH, D)}, "
                         f"got {[t.shape for t in news]}")
    rope = _check_rope("cached_attention", rope, D, q)
    return q.device.backend.cached_attention(q, k_cache, v_cache, pos, slot, _scale(scale, D), k_new, v_new, rope,
                                             table)


def cache_gather(cache: Tensor, slot: int, n: int, table: Tensor | None = None, head_dim: int | None = None) -> Tensor:
    """The values at positions 0 .. n - 1 of sequence `slot` (a host int) of a KV cache (`cache_write`'s, through
    the block `table` where given) as stored, widened to float32: (n, KVH, D) — the contiguous keys or values a
    prompt's `attention` reads. `head_dim` is D (needed for a q8_0 cache only, whose last axis is its words;
    inferred when None). A position whose block is not in the pool: the CPU raises a ShapeError, WebGPU reads
    zeros."""
    if not isinstance(cache, Tensor) or cache.ndim != 4:
        raise ShapeError(f"cache_gather: a KV cache is (blocks, block_size, KVH, D), got "
                         f"{cache.shape if isinstance(cache, Tensor) else type(cache).__name__}")
    KVH = cache.shape[2]
    if head_dim is None:
        head_dim = q8_head_dim(cache.shape[3]) if cache.dtype is dt.int32 else cache.shape[3]
        if head_dim is None:
            raise ShapeError(f"cache_gather: an int32 (q8_0) cache's last axis {cache.shape[3]} is no head dim's "
                             "words")
    _check_cache("cache_gather", cache, KVH, head_dim)
    _check_table("cache_gather", table, cache)
    n_seqs, n_pos = (cache.shape[0], cache.shape[1]) if table is None else \
        (table.shape[0], table.shape[1] * cache.shape[1])
    for name, v, hi in (("slot", slot, n_seqs - 1), ("n", n, n_pos)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise ArgumentError(f"cache_gather: {name} must be an int in [0, {hi}], got {v!r}")
    return cache.device.backend.cache_gather(cache, slot, n, head_dim, table)


def chunk_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, slot: Tensor,
                    scale: float | None = None, table: Tensor | None = None) -> Tensor:
    """`cached_attention` of rows that are one sequence's (a prompt chunk): q (T, H, D), caches
    (`cache_write`'s: pools of blocks read through the block `table`, or contiguous without one), pos
    and slot int32 (T,) with every row in sequence slot[0]; row t sees positions 0..pos[t] of that
    sequence (a position past the table: every position it has) -> (T, H, D) float32, the numbers
    `cached_attention` gives each row. The rows' own keys and values must be in
    the cache already (`cache_write` first), since every row reads the ones before it. On GPUs the
    rows share key and value tiles (attention_tiled_cache.wgsl: query tiles of 64 rows, each tile of
    keys loaded once for all of them), positions and slot read on the device, so one captured graph
    serves every chunk of every prompt. The CPU checks that the slots agree (a ShapeError naming
    two that do not) and are in range; WebGPU reads slot[0], and gives zeros for every row when it is out
    of range and for a row at a negative position (device data is not read back to be checked)."""
    _check_attention_rows("chunk_attention", q, k_cache, v_cache, pos, slot, table)
    return q.device.backend.chunk_attention(q, k_cache, v_cache, pos, slot, _scale(scale, q.shape[2]), table)


def _check_attention_rows(op: str, q: Tensor, k_cache: Tensor, v_cache: Tensor, pos: Tensor, slot: Tensor,
                          table: Tensor | None, *more: Tensor) -> tuple[int, int, int]:
    """The checks `cached_attention` and `chunk_attention` share: query rows, caches (pools of one type and
    shape), their block table, positions and slots. (T, KVH, D)."""
    check_same_device(op, q, k_cache, v_cache, pos, slot, *more)
    _need_float(op, q)
    if q.ndim != 3:
        raise ShapeError(f"{op}: q must be (T, H, D), got {q.shape}")
    T, H, D = q.shape
    if k_cache.ndim != 4:
        raise ShapeError(f"{op}: a KV cache is (blocks, block_size, KVH, D), got {k_cache.shape}")
    KVH = k_cache.shape[2]
    _check_heads(op, H, KVH)
    _check_cache(op, k_cache, KVH, D)
    if v_cache.shape != k_cache.shape or v_cache.dtype is not k_cache.dtype:
        raise ShapeError(f"{op}: k and v caches differ: {k_cache.dtype.name} {k_cache.shape} vs "
                         f"{v_cache.dtype.name} {v_cache.shape}")
    _check_cache(op, v_cache, KVH, D)
    _check_table(op, table, k_cache)
    _int_vector(op, "pos", pos, T)
    _int_vector(op, "slot", slot, T)
    return T, KVH, D


def advance_tokens(new: Tensor, ids: Tensor, pos: Tensor, tokens: Tensor, count: Tensor) -> None:
    """The end of a decode step on the device: ids[:] = new, pos += 1, and `new` appended to the
    ring `tokens` (n_steps * B,) at step count[0], then count[0] += 1 (steps past the ring are
    not recorded). All int32; B = new.shape[0]."""
    check_same_device("advance_tokens", new, ids, pos, tokens, count)
    if new.ndim != 1:
        raise ShapeError(f"advance_tokens: new must be 1-d (B,), got {new.shape}")
    B = new.shape[0]
    for name, t, shape in (("new", new, (B,)), ("ids", ids, (B,)), ("pos", pos, (B,)), ("count", count, (1,))):
        _int_vector("advance_tokens", name, t, shape[0])
    if tokens.dtype is not dt.int32 or tokens.ndim != 1 or (B and tokens.shape[0] % B):
        raise ShapeError(f"advance_tokens: tokens must be int32 (n_steps * {B},), "
                         f"got {tokens.dtype.name} {tokens.shape}")
    new.device.backend.advance_tokens(new, ids, pos, tokens, count)


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
