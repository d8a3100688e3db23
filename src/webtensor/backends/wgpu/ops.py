"""The WebGPU planners: for each op, pick the kernel variant, name its parameters, bind whole
buffers (offsets travel as parameters, so bind groups stay cached) and `ctx.launch` it.

Each planner receives validated Tensors (`webtensor.ops` checked shapes, dtypes and devices) and
returns new ones. A launch runs now, joins the enclosing dispatch scope, or is recorded into a
graph being captured: the same planners serve eager ops, the prefill and the replayed decode step.
Nothing here needs numpy except `to_numpy`, so the browser (Pyodide without numpy) can use the rest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

from ... import activations
from ... import dtypes as dt
from ...errors import BufferLimitError, DTypeError, ShapeError
from ...quant.kv import q8_words
from ...tensor import Tensor, contiguous_strides
from .context import GpuBuffer, WgpuContext
from .policy import KernelPolicy
from .storage import WgpuStorage, allocate

WG = 256  # threads per workgroup in the 1-d kernels


def _grid(n_groups: int, ctx: WgpuContext) -> tuple[int, int, int]:
    """Spread `n_groups` workgroups over x and y (kernels flatten them back) under the per-dim limit."""
    if n_groups <= ctx.max_workgroups:
        return (n_groups, 1, 1)
    y = math.ceil(n_groups / ctx.max_workgroups)
    return (math.ceil(n_groups / y), y, 1)


def _rows_grid(rows: int) -> tuple[int, int]:
    """(y, z) for kernels that number rows as wg.y * 65535 + wg.z."""
    return math.ceil(rows / 65535), min(rows, 65535)


def _ctx(t: Tensor) -> WgpuContext:
    ctx: WgpuContext = t.device.ctx
    ctx.check_alive()
    return ctx


def _buf(t: Tensor) -> GpuBuffer:
    """The one buffer behind `t`. A view across row chunks (over the binding limit) is refused here:
    the row-wise ops get blocks of rows that lie in one chunk (`rows.by_rows`), matmul's right operand
    and embedding's table are read a chunk at a time, uploads and readbacks take chunks."""
    st: WgpuStorage = t._storage
    if len(st.chunks) > 1:
        raise BufferLimitError(
            f"an operand of shape {t.shape} ({t.nbytes:,} bytes) spans {len(st.chunks)} row chunks (over this "
            f"device's binding limit of {st.ctx.max_binding_bytes:,} bytes), where this op needs it in one binding; "
            "ops take chunked tensors as their row operands (by blocks of rows), as matmul's right operand and "
            "embedding's table, and .numpy() reads them")
    return st.buffer


def _out(device: Any, shape: tuple[int, ...], dtype: dt.DType) -> Tensor:
    """A planner's result (or scratch): one buffer, as a kernel writes one binding. The backend runs
    planners on blocks of rows whose results fit (`rows.by_rows`), so this refuses only a planner
    called on more (BufferLimitError)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > device.ctx.max_binding_bytes:
        raise BufferLimitError(f"the result, shape {shape} {dtype.name} ({nbytes:,} bytes), is over this device's "
                               f"binding limit of {device.ctx.max_binding_bytes:,} bytes")
    return empty(device, shape, dtype)


def empty(device: Any, shape: tuple[int, ...], dtype: dt.DType, reuse: bool = True) -> Tensor:
    ctx = device.ctx
    if dtype is dt.float16 and not ctx.has_f16:
        raise DTypeError(f"{device.describe()} has no shader-f16 feature: float16 tensors are not supported there")
    return Tensor(device, shape, dtype, storage=allocate(ctx, shape, dtype.itemsize, reuse))


def from_bytes(device: Any, shape: tuple[int, ...], dtype: dt.DType, data: Any,
               done: Callable[[int, int], None] | None = None) -> Tensor:
    """Upload C-ordered bytes (any buffer-protocol object) into a new tensor; `done(a, b)` as bytes a..b of
    `data` have been copied (WgpuContext.upload)."""
    t = empty(device, tuple(shape), dtype, reuse=False)  # (in a capture: a constant, never a recycled buffer)
    mv = memoryview(data).cast("B")
    if mv.nbytes != t.nbytes:
        raise ShapeError(f"{mv.nbytes} bytes given for a tensor of shape {shape} {dtype.name} ({t.nbytes} bytes)")
    ctx, st = device.ctx, t._storage
    row_bytes = t.nbytes // shape[0] if shape and shape[0] else 0
    for r0, n, buf in st.chunk_ranges(shape[0] if shape else 1):
        at = r0 * row_bytes if len(st.chunks) > 1 else 0
        ctx.upload(buf, mv if len(st.chunks) == 1 else mv[at:at + n * row_bytes], fresh=True,
                   done=None if done is None else functools.partial(_shifted, done, at))
    return t


def _shifted(done: Callable[[int, int], None], at: int, a: int, b: int) -> None:
    done(at + a, at + b)


def zeros(device: Any, shape: tuple[int, ...], dtype: dt.DType) -> Tensor:
    return from_bytes(device, shape, dtype, bytes(math.prod(shape) * dtype.itemsize))


def to_bytes(t: Tensor) -> bytes:
    ctx = _ctx(t)
    st: WgpuStorage = t._storage
    if len(st.chunks) > 1:
        if not t.is_contiguous():  # a transposed view of chunked rows: read its span, stride on the host
            raw: bytes = to_numpy(t).tobytes()
            return raw
        return _read_span(t, t._offset, t._offset + t.size - 1)
    if not t.is_contiguous():
        t = copy(t)
    if t.size == 0:
        return b""
    return bytes(ctx.read(_buf(t), t._offset * t.dtype.itemsize, t.nbytes))


def _read_span(t: Tensor, lo: int, hi: int) -> bytes:
    """Elements lo..hi (inclusive) of the concatenation of t's row chunks, read chunk by chunk."""
    st: WgpuStorage = t._storage
    size = t.dtype.itemsize
    out = []
    for i, buf in enumerate(st.chunks):
        c0 = st.chunk_start(i)
        c1 = st.chunk_start(i + 1) if i + 1 < len(st.chunks) else hi + 1
        a, b = max(lo, c0), min(hi + 1, c1)
        if a < b:
            out.append(bytes(st.ctx.read(buf, (a - c0) * size, (b - a) * size)))
    return b"".join(out)


def upload_into(t: Tensor, data: Any) -> None:
    """Write C-ordered bytes into contiguous single-buffer tensor `t` (after pending work)."""
    if len(t._storage.chunks) > 1 or not t.is_contiguous():
        raise ShapeError("upload_into needs a contiguous tensor in one buffer")
    t.device.ctx.upload(_buf(t), data, t._offset * t.dtype.itemsize)


def read_async(t: Tensor) -> Any:
    """Start reading a contiguous single-buffer tensor back (with whatever is pending); `.wait()`
    gives its bytes. The CPU meanwhile may queue more work."""
    if len(t._storage.chunks) > 1 or not t.is_contiguous():
        raise ShapeError("read_async needs a contiguous tensor in one buffer")
    return t.device.ctx.read_async(_buf(t), t._offset * t.dtype.itemsize, t.nbytes)


def to_numpy(t: Tensor) -> Any:
    import numpy as np

    if len(t._storage.chunks) > 1 and not t.is_contiguous() and t.size:  # a view across chunks
        last = t._offset + sum((n - 1) * s for n, s in zip(t.shape, t._strides, strict=True))
        flat = np.frombuffer(_read_span(t, t._offset, last), dtype=t.dtype.name)
        view = np.lib.stride_tricks.as_strided(flat, t.shape, tuple(s * t.dtype.itemsize for s in t._strides))
        return np.ascontiguousarray(view)
    return np.frombuffer(to_bytes(t), dtype=t.dtype.name).reshape(t.shape).copy()


def synchronize(ctx: WgpuContext) -> None:
    probe = ctx.alloc(4)
    try:
        ctx.read(probe, 0, 4)
    finally:
        ctx.release(probe)


# -- strided elementwise ------------------------------------------------------------------------
def _collapse(shape: tuple[int, ...], *stride_sets: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims that are contiguous with each other in every operand; drop size-1 dims."""
    dims = [i for i, n in enumerate(shape) if n != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in stride_sets]
    for i in dims:
        if out_shape and all(s[-1] == st[i] * shape[i] for s, st in zip(out_strides, stride_sets, strict=True)):
            out_shape[-1] *= shape[i]
            for s, st in zip(out_strides, stride_sets, strict=True):
                s[-1] = st[i]
        else:
            out_shape.append(shape[i])
            for s, st in zip(out_strides, stride_sets, strict=True):
                s.append(st[i])
    return out_shape, out_strides


def _pad4(shape: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    k = 4 - len(shape)
    return [1] * k + shape, [[0] * k + s for s in strides]


def _broadcast_strides(t: Tensor, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    k = len(out_shape) - t.ndim
    return tuple(0 if d < k or t.shape[d - k] == 1 else t._strides[d - k] for d in range(len(out_shape)))


_BINARY = {"add": "0u", "mul": "1u", "sub": "2u", "div": "3u", "swiglu": "4u", "geglu": "5u"}  # elementwise's OP
GLU = {None: "0u", "swiglu": "1u", "geglu": "2u"}  # the gemv kernels' GLU: a gated prologue's kind


def binary(op: str, a: Tensor, b: Tensor, out_shape: tuple[int, ...], out_dtype: dt.DType) -> Tensor:
    ctx = _ctx(a)
    out = _out(a.device, out_shape, out_dtype)
    sa, sb = _broadcast_strides(a, out_shape), _broadcast_strides(b, out_shape)
    shape, (sa2, sb2, _) = _collapse(out_shape, sa, sb, contiguous_strides(out_shape))
    if len(shape) > 4 and not (a.is_contiguous() and b.is_contiguous()):
        return binary(op, a.contiguous(), b.contiguous(), out_shape, out_dtype)  # contiguous dims merge
    if len(shape) > 4:
        raise ShapeError(f"{op}: broadcasting over more than 4 dims that cannot be merged is not supported "
                         f"on WebGPU ({a.shape} and {b.shape}); make the operands contiguous or reshape them")
    shape, (sa2, sb2) = _pad4(shape, [sa2, sb2])
    k = ctx.kernel("elementwise", {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TO": out_dtype.wgsl, "OP": _BINARY[op]})
    ctx.launch(k, dict(shape=shape, sa=sa2, sb=sb2, a_off=a._offset, b_off=b._offset, n=out.size),
               dict(a=_buf(a), b=_buf(b), o=_buf(out)), _grid(math.ceil(out.size / WG), ctx))
    return out


_UNARY = {"copy": "0u", "gelu": "1u", "scale": "2u", "softcap": "3u"}


def unary(op: str, x: Tensor, out_dtype: dt.DType | None = None, alpha: float = 1.0,
          out: Tensor | None = None) -> Tensor:
    """out = op(x) elementwise; `out` may be a strided view (copy into a slice), else a new tensor."""
    ctx = _ctx(x)
    if out is None:
        out = _out(x.device, x.shape, out_dtype or x.dtype)
    if x.size == 0:
        return out
    shape, (si, so) = _collapse(x.shape, x._strides, out._strides)
    if len(shape) > 4:  # peel the outermost dim: one dispatch per index (rare: >4-d permuted views)
        for i in range(x.shape[0]):
            unary(op, x[i], alpha=alpha, out=out[i])
        return out
    shape, (si, so) = _pad4(shape, [si, so])
    k = ctx.kernel("unary", {"TI": x.dtype.wgsl, "TO": out.dtype.wgsl, "OP": _UNARY[op]})
    ctx.launch(k, dict(shape=shape, si=si, so=so, i_off=x._offset, o_off=out._offset, n=x.size, alpha=alpha),
               dict(x=_buf(x), o=_buf(out)), _grid(math.ceil(x.size / WG), ctx))
    return out


def copy(x: Tensor, dtype: dt.DType | None = None) -> Tensor:
    return unary("copy", x, dtype)


def copy_into(dst: Tensor, src: Tensor) -> None:
    if _buf(src) is _buf(dst):  # a binding that is written may not alias: go through a copy
        src = copy(src)
    unary("copy", src, out=dst)


# -- row-wise kernels ---------------------------------------------------------------------------
def _rows(x: Tensor) -> tuple[Tensor, int, int, int]:
    """View x as (rows, cols) with unit column stride and one row stride: (x, rows, cols, ld)."""
    cols = x.shape[-1] if x.shape else 1
    rows = x.size // cols if cols else 0
    if x.ndim >= 1 and (x._strides[-1] == 1 or cols == 1):
        shape, (st,) = _collapse(x.shape[:-1], x._strides[:-1])
        if len(shape) == 0:
            return x, rows, cols, cols
        if len(shape) == 1:
            return x, rows, cols, st[0]
    x = x.contiguous()
    return x, rows, cols, cols


def layer_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    ctx = _ctx(x)
    x, rows, cols, ld = _rows(x)
    w, b = w.contiguous(), b.contiguous()
    if b.dtype is not w.dtype:
        b = copy(b, w.dtype)
    out = _out(x.device, x.shape, x.dtype)
    k = ctx.kernel("layer_norm", {"TX": x.dtype.wgsl, "TW": w.dtype.wgsl, "TO": out.dtype.wgsl})
    ctx.launch(k, dict(rows=rows, cols=cols, x_off=x._offset, x_ld=ld, eps=eps, w_off=w._offset, b_off=b._offset),
               dict(x=_buf(x), w=_buf(w), bias=_buf(b), o=_buf(out)), _grid(rows, ctx))
    return out


def _rows2(x: Tensor) -> tuple[Tensor, int, int, int, int, int]:
    """View x as (rows, cols) with unit column stride and two levels of row strides: row r starts at
    x's offset + (r // n_in) * ld_out + (r % n_in) * ld_in -> (x, rows, cols, n_in, ld_in, ld_out).
    The q heads (T, H, D) of a fused (T, H + 2 KVH, D) qkv are n_in = H rows D apart in rows
    (H + 2 KVH) D apart, read in place; x is copied only where its leading dims do not collapse to
    two levels (or its last dim is strided)."""
    cols = x.shape[-1] if x.shape else 1
    rows = x.size // cols if cols else 0
    if x.ndim >= 1 and (x._strides[-1] == 1 or cols == 1):
        shape, (st,) = _collapse(x.shape[:-1], x._strides[:-1])
        if len(shape) == 0:
            return x, rows, cols, 1, cols, cols
        if len(shape) == 1:
            return x, rows, cols, 1, st[0], st[0]
        if len(shape) == 2:
            return x, rows, cols, shape[1], st[1], st[0]
    x = x.contiguous()
    return x, rows, cols, 1, cols, cols


def norm_lanes(cols: int) -> int:
    """Threads per row in rms_norm.wgsl: a power of two with ~4 columns each, 1 to 256 (a 64-wide
    head takes 16, so a workgroup normalises 16 heads)."""
    return min(256, 1 << max(0, math.ceil(cols / 4) - 1).bit_length())


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x (..., C), any view whose rows collapse to two strides (_rows2), w (C,) -> (..., C) in x's
    dtype: one rms_norm.wgsl launch."""
    ctx = _ctx(x)
    x, rows, cols, n_in, ld_in, ld_out = _rows2(x)
    w = w.contiguous()
    out = _out(x.device, x.shape, x.dtype)
    if out.size == 0:
        return out
    lanes = norm_lanes(cols)
    k = ctx.kernel("rms_norm", {"TX": x.dtype.wgsl, "TW": w.dtype.wgsl, "TO": out.dtype.wgsl, "LANES": f"{lanes}u"})
    ctx.launch(k, dict(rows=rows, cols=cols, x_off=x._offset, n_in=n_in, ld_in=ld_in, ld_out=ld_out, eps=eps,
                       w_off=w._offset),
               dict(x=_buf(x), w=_buf(w), o=_buf(out)), _grid(math.ceil(rows / (256 // lanes)), ctx))
    return out


def normalize(x: Tensor, norm: tuple[Tensor, Tensor | None, float]) -> Tensor:
    """A linear's norm prologue as its own launch: norm = (weight, bias, eps) layer-normalises x's
    rows, (weight, None, eps) RMS-normalises them."""
    w, b, eps = norm
    return rms_norm(x, w, eps) if b is None else layer_norm(x, w, b, eps)


def rope(x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """x (T, H, D) (a view with unit stride along D is read in place), pos int32 (T,), cos, sin
    float32 (P, R/2) -> a new (T, H, D) in x's dtype: one rope.wgsl launch."""
    ctx = _ctx(x)
    if x._strides[-1] != 1:
        x = x.contiguous()
    T, H, D = x.shape
    out = _out(x.device, (T, H, D), x.dtype)
    if out.size == 0:
        return out
    pos, cos, sin = pos.contiguous(), cos.contiguous(), sin.contiguous()
    P, half = cos.shape
    k = ctx.kernel("rope", {"TX": x.dtype.wgsl, "TO": out.dtype.wgsl,
                            "INTERLEAVED": "true" if interleaved else "false"})
    n = T * H * (D - half)  # one thread a rotated pair or a passed-through dim
    ctx.launch(k, dict(T=T, H=H, D=D, half=half, x_off=x._offset, x_ts=x._strides[0], x_hs=x._strides[1],
                       pos_off=pos._offset, P=P, c_off=cos._offset, s_off=sin._offset),
               dict(x=_buf(x), pos=_buf(pos), cos_t=_buf(cos), sin_t=_buf(sin), o=_buf(out)),
               _grid(math.ceil(n / WG), ctx))
    return out


def softmax(x: Tensor) -> Tensor:
    ctx = _ctx(x)
    x, rows, cols, ld = _rows(x)
    out = _out(x.device, x.shape, x.dtype)
    k = ctx.kernel("softmax", {"TX": x.dtype.wgsl, "TO": out.dtype.wgsl})
    ctx.launch(k, dict(rows=rows, cols=cols, x_off=x._offset, x_ld=ld), dict(x=_buf(x), o=_buf(out)),
               _grid(rows, ctx))
    return out


def token_mask(x: Tensor, bits: Tensor) -> Tensor:
    """token_mask.wgsl: one thread an element, workgroups (column block, row)."""
    ctx = _ctx(x)
    x, rows, cols, ld = _rows(x)
    out = _out(x.device, x.shape, x.dtype)
    if rows == 0 or cols == 0:
        return out
    words = (cols + 31) // 32
    bits = _at0(bits)
    y, z = _rows_grid(rows)
    ctx.launch(ctx.kernel("token_mask", {"TX": x.dtype.wgsl}),
               dict(rows=rows, cols=cols, words=words, x_off=x._offset, x_ld=ld),
               dict(x=_buf(x), bits=_buf(bits), o=_buf(out)), (math.ceil(cols / 256), y, z))
    return out


def argmax_parts(ctx: WgpuContext, cols: int) -> int:
    """The column parts of a row (a long row, GPT-2's 50,257 logits, over up to 64 workgroups)."""
    return max(1, min(64, math.ceil(cols / ctx.policy.argmax_cols_per_part)))


def argmax_scratch_bytes(ctx: WgpuContext, cols: int) -> int:
    """The scratch one row of argmax needs: a (value, index) pair per part."""
    return argmax_parts(ctx, cols) * 8


def argmax(x: Tensor) -> Tensor:
    """Two launches: each row's column parts reduce to (value, index) pairs, then the pairs."""
    ctx = _ctx(x)
    x, rows, cols, ld = _rows(x)
    out = _out(x.device, x.shape[:-1], dt.int32)
    if rows == 0:
        return out
    parts = argmax_parts(ctx, cols)
    pairs = ctx.alloc(rows * argmax_scratch_bytes(ctx, cols))
    try:
        y, z = _rows_grid(rows)
        ctx.launch(ctx.kernel("argmax", {"TX": x.dtype.wgsl}),
                   dict(rows=rows, cols=cols, x_off=x._offset, x_ld=ld, parts=parts),
                   dict(x=_buf(x), o=pairs), (parts, y, z))
        ctx.launch(ctx.kernel("argmax_parts"), dict(rows=rows, parts=parts), dict(part=pairs, o=_buf(out)),
                   (min(rows, 65535), math.ceil(rows / 65535), 1))
    finally:
        ctx.release(pairs)  # (pooled after the submit that reads it: the pool reuses it in order)
    return out


# -- matmul -------------------------------------------------------------------------------------
def matmul(a: Tensor, b: Tensor, out_dtype: dt.DType, bias: Tensor | None = None, act: str | None = None,
           residual: Tensor | None = None, ln: tuple[Tensor, Tensor, float] | None = None,
           rms: tuple[Tensor, float] | None = None, glu: str | None = None) -> Tensor:
    """a: (..., M, K) @ b: (K, N) or (..., K, N) with the same batch dims -> (..., M, N).
    With b 2-d, the fused epilogue may add `bias` (N,), apply the activation `act` (a canonical
    name of `webtensor.activations`), then add `residual` (..., M, N); `ln` = (weight, bias, eps)
    layer-normalises a's rows first, `rms` = (weight, eps) RMS-normalises them (fused into the
    GEMV's prologue where it can be); `glu` ("swiglu" / "geglu", b 2-d): a is (..., M, 2K), the product's
    input is that gate of its halves (in the GEMV's prologue where it can be, else one elementwise launch
    first)."""
    ctx = _ctx(a)
    M, K, N = a.shape[-2], a.shape[-1] // (2 if glu else 1), b.shape[-1]
    batch_shape = a.shape[:-2]
    out = _out(a.device, (*batch_shape, M, N), out_dtype)
    if out.size == 0:
        return out
    if K == 0:
        return zeros(out.device, out.shape, out.dtype)
    if a._strides[-1] != 1 and (K > 1 or glu):
        a = a.contiguous()
    batch = math.prod(batch_shape)
    if b.ndim == 2:
        # fold a's batch into M when its rows are evenly strided: one (batch*M, K) product; a stack
        # of one-row matrices (..., 1, K) keeps each row's M = 1 result (see gemv_group)
        stack = M == 1 and a.ndim > 2 and not stack_goes_tiled(ctx, batch, b.dtype)
        shape, (st,) = _collapse(a.shape[:-1], a._strides[:-1])
        if len(shape) > 1:
            a = a.contiguous()
            shape, (st,) = _collapse(a.shape[:-1], a._strides[:-1])
        lda = st[0] if st else K
        norm = ln if rms is None else (rms[0], None, rms[1])
        _matmul_2d(ctx, a, lda, batch * M, K, b, out, _Epilogue(out, bias, act, residual), norm, stack, glu)
        return out
    # batched b: same batch dims as a, each operand one batch stride
    a = a if _one_batch_stride(a) else a.contiguous()
    b = b if _one_batch_stride(b) else b.contiguous()
    lda = a._strides[-2] if M > 1 else K
    nb = len(batch_shape)
    k = _mm_kernel(ctx, a, b, out, out, b._strides[-2] == 1)
    ctx.launch(k, dict(M=M, N=N, K=K, a_off=a._offset, lda=lda, b_off=b._offset, ldb_k=b._strides[-2],
                       ldb_n=b._strides[-1], ldc=N, a_bs=a._strides[nb - 1] if nb else 0,
                       b_bs=b._strides[nb - 1] if nb else 0, c_bs=M * N),
               dict(a=_buf(a), b=_buf(b), c=_buf(out)), (math.ceil(N / 64), math.ceil(M / 64), batch))
    return out


def _one_batch_stride(t: Tensor) -> bool:
    nb = t.ndim - 2
    shape, _ = _collapse(t.shape[:nb], t._strides[:nb])
    return len(shape) <= 1


def _mm_kernel(ctx: WgpuContext, a: Tensor, b: Tensor, out: Tensor, bias: Tensor, kmajor: bool) -> Any:
    defs = {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TC": out.dtype.wgsl, "TBIAS": bias.dtype.wgsl,
            "B_KMAJOR": "true" if kmajor else "false"}
    return ctx.kernel("matmul", defs)


def _gpu_style(ctx: WgpuContext) -> bool:
    return ctx.policy.gpu_style


def gemv_lanes(ctx: WgpuContext, K: int, ln: bool = False) -> int:
    """Threads per output row in gemv.wgsl. CPU-backed adapters: 1 (no reduction, no barriers).
    GPUs: enough lanes that each keeps at most ~4 vec4 loads, 32 to 256; with the fused layer norm
    32 (8 rows a workgroup), since every workgroup pays for the norm's statistics."""
    if not _gpu_style(ctx):
        return 1
    if ln:
        return 32
    lanes, k4 = 32, K // 4
    while lanes < 256 and k4 > 4 * lanes:
        lanes *= 2
    return lanes


def stack_goes_tiled(ctx: WgpuContext, rows: int, w_dtype: dt.DType | str) -> bool:
    """Whether a stack of `rows` one-row products with `w_dtype` weights (a dtype, or a quantized
    weight's ggml type name) runs as one plain (rows, K) product (the tiled engine) instead of the
    row-exact GEMV: on GPUs, over policy.gemv_stack_f16_max_rows rows for float16 weights and over
    policy.gemv_stack_quant_max_rows for quantized ones; float32 weights never."""
    policy = ctx.policy
    lim = (policy.gemv_stack_quant_max_rows if isinstance(w_dtype, str)
           else policy.gemv_stack_f16_max_rows if w_dtype is dt.float16 else None)
    return lim is not None and rows > lim and _gpu_style(ctx)


def gemv_group(ctx: WgpuContext, M: int, stack: bool) -> int:
    """MR, the rows of A one gemv workgroup takes (gemv.wgsl, gemv_q8.wgsl; W is read once per
    group), or 0 where the product does not go to the GEMV by its rows. A stack of one-row products
    ((T, 1, K): decode rows, the forward's batch-invariant layout) of any T goes to the GEMV: one
    row as the M = 1 launch (MR = 1: a lone decode step keeps its kernel), more rows policy.gemv_group a
    workgroup. Each row's sum is computed in the M = 1 launch's order either way, so a row of a
    step is bit for bit that row alone (tests/test_gemv_stack.py); rows over gemv_group x the
    grid limit go to the tiled kernels. A plain product of up to policy.gemv_max_rows rows takes M
    rounded up to a power of two."""
    group = ctx.policy.gemv_group
    if math.ceil(M / group) > ctx.max_workgroups:
        return 0
    if M == 1 or M <= ctx.policy.gemv_max_rows and not stack:
        return min(group, 1 << (M - 1).bit_length())
    return group if stack else 0


def gemv_kernel(ctx: WgpuContext, a_dtype: dt.DType, w_dtype: dt.DType, out_dtype: dt.DType, bias_dtype: dt.DType,
                K: int, ln: bool = False, mr: int = 1, rms: bool = False, glu: str | None = None) -> tuple[Any, int]:
    """The gemv variant for these dtypes and K, taking `mr` rows of A a workgroup, and how many
    outputs one workgroup computes; `ln`: a norm prologue, an RMS norm if `rms`, else a layer norm;
    `glu`: the gated prologue, "swiglu" or "geglu" (A's rows are 2K wide, [gate | up]).
    The subgroup reduction is built in only on devices with the feature and a fixed subgroup size."""
    lanes = gemv_lanes(ctx, K, ln)
    if ln and lanes == 1:
        raise ValueError("the fused layer-norm prologue needs lanes > 1")
    sg = ctx.subgroup_size if 1 < ctx.subgroup_size <= lanes else 0
    pack = ctx.policy.gemv_packed_f16 and w_dtype is dt.float16
    k = ctx.kernel("gemv", {"TA": a_dtype.wgsl, "TB": "u32" if pack else w_dtype.wgsl, "TC": out_dtype.wgsl,
                            "TBIAS": bias_dtype.wgsl, "LN": "true" if ln else "false", "LANES": f"{lanes}u",
                            "SG": f"{sg}u", "WPACK": "true" if pack else "false", "MR": f"{mr}u",
                            "RMS": "true" if ln and rms else "false", "GLU": GLU[glu]})
    return k, 256 // lanes


def epilogue_bits(bias: bool, act: str | None, residual: bool) -> int:
    """epilogue.wgsl's p.epi: bit 1 bias, bit 4 residual, the activation's code from bit 8."""
    return (1 if bias else 0) | (4 if residual else 0) | (activations.code(act) << 8)


class _Epilogue:
    """What the fused matmul epilogue adds: bias (N,), an activation, residual (rows with one stride)."""

    def __init__(self, out: Tensor, bias: Tensor | None, act: str | None, residual: Tensor | None):
        self.bits = epilogue_bits(bias is not None, act, residual is not None)
        self.bias = bias.contiguous() if bias is not None else None
        self.bias_dtype = self.bias.dtype if self.bias is not None else out.dtype
        self.r_ld = 0
        if residual is not None:
            if residual.dtype is not out.dtype:  # the kernels read the residual as the output's type
                residual = copy(residual, out.dtype)
            residual, _, _, self.r_ld = _rows(residual)
        self.res = residual

    def params(self, n0: int, last: bool) -> dict[str, int]:
        """The epilogue's parameters for the column block starting at n0 (applied on the last
        K-chunk only)."""
        return dict(epi=self.bits if last else 0,
                    bias_off=(self.bias._offset if self.bias is not None else 0) + n0,
                    r_off=(self.res._offset if self.res is not None else 0) + n0, r_ld=self.r_ld)

    def buffers(self) -> dict[str, GpuBuffer | None]:
        return dict(bias=None if self.bias is None else _buf(self.bias),
                    res=None if self.res is None else _buf(self.res))


_Part = tuple[int, int, int, int, int, int, int, Any]  # (k0, kn, n0, nn, b_off, ldb_k, ldb_n, buffer)


def _parts(b: Tensor, K: int, N: int) -> list[_Part]:
    """b (K, N) as the pieces its storage holds: one, K-row chunks, or (b = table.T) N-row chunks."""
    st: WgpuStorage = b._storage
    if len(st.chunks) == 1:
        return [(0, K, 0, N, b._offset, b._strides[0], b._strides[1], st.buffer)]
    if b._offset == 0 and b._strides == (N, 1) and st.holds_whole(K, N):
        # b (K, N) stored in chunks of K-rows: accumulate partial products
        return [(r0, n, 0, N, 0, N, 1, buf) for r0, n, buf in st.chunk_ranges(K)]
    if b._offset == 0 and b._strides == (1, K) and st.holds_whole(N, K):  # b = table.T: chunks fill column blocks
        return [(0, K, r0, n, 0, 1, K, buf) for r0, n, buf in st.chunk_ranges(N)]
    raise BufferLimitError(
        f"matmul: the right operand, shape {b.shape}, is a view of part of a tensor stored in row chunks (over this "
        f"device's binding limit of {st.ctx.max_binding_bytes:,} bytes); it is read chunk by chunk only when it is "
        "the whole tensor or its transpose (.contiguous() makes a view whole)")


def norm_fusable(norm: tuple[Tensor, Tensor | None, float]) -> bool:
    """Whether a norm's weight and bias can be bound as the GEMV prologue reads them: float32,
    contiguous, from the start of their buffers."""
    return all(t.dtype is dt.float32 and t._offset == 0 and t.is_contiguous() and len(t._storage.chunks) == 1
               for t in norm[:2] if t is not None)


def _matmul_2d(ctx: WgpuContext, a: Tensor, lda: int, M: int, K: int, b: Tensor, out: Tensor,
               epi: _Epilogue, ln: tuple[Tensor, Tensor | None, float] | None, stack: bool = False,
               glu: str | None = None) -> None:
    """out (M, N) = epilogue(norm(a) @ b), a's rows `lda` apart; `ln` = (weight, bias, eps) a layer
    norm, (weight, None, eps) an RMS norm; `stack`: the rows are a stack of one-row products (see
    gemv_group); `glu`: a's rows are 2K wide and the input is that gate of their halves (the GEMV's
    prologue, else one elementwise launch first)."""
    N = b.shape[1]
    parts = _parts(b, K, N)
    kmajor = parts[0][5] == 1
    vec_ok = (kmajor and K % 4 == 0 and lda % 4 == 0 and a._offset % 4 == 0
              and all(pt[4] % 4 == 0 and pt[6] == K for pt in parts))
    mr = gemv_group(ctx, M, stack)
    gemv = mr > 0 and vec_ok
    fuse_ln = ln is not None and gemv and gemv_lanes(ctx, K, True) > 1 and norm_fusable(ln)
    if glu is not None and not gemv:  # the gated input as its own launch: the gate of the halves, (M, K)
        x = Tensor(a.device, (M, 2 * K), a.dtype, storage=a._storage, strides=(lda, 1), offset=a._offset)
        a = binary(glu, x[:, :K], x[:, K:], (M, K), a.dtype)
        lda, glu = K, None
        vec_ok = vec_ok or (kmajor and K % 4 == 0 and all(pt[4] % 4 == 0 and pt[6] == K for pt in parts))
        gemv = mr > 0 and vec_ok
    if ln is not None and not fuse_ln:  # a separate norm, then the product of its output
        x = Tensor(a.device, (M, K), a.dtype, storage=a._storage, strides=(lda, 1), offset=a._offset)
        a = normalize(x, ln)
        lda = K
        vec_ok = vec_ok or (kmajor and K % 4 == 0 and all(pt[4] % 4 == 0 and pt[6] == K for pt in parts))
        gemv = mr > 0 and vec_ok
    regs = not gemv and vec_ok and not _gpu_style(ctx)
    if not gemv and not regs and engine_fits(ctx, a, lda, parts):
        matmul_engine(ctx, a, lda, M, b.dtype, parts, out, epi)
        return
    if gemv:
        k, rows_per_wg = gemv_kernel(ctx, a.dtype, b.dtype, out.dtype, epi.bias_dtype, K, fuse_ln, mr,
                                     rms=ln is not None and ln[1] is None, glu=glu)
    elif regs:  # CPU-backed adapters: no workgroup memory, no barriers
        k = ctx.kernel("matmul_regs", {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TC": out.dtype.wgsl,
                                       "TBIAS": epi.bias_dtype.wgsl})
    else:
        defs = {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TC": out.dtype.wgsl, "TBIAS": epi.bias_dtype.wgsl,
                "B_KMAJOR": "true" if kmajor else "false"}
        k = ctx.kernel("matmul", defs)
    for i, (k0, kn, n0, nn, b_off, ldb_k, ldb_n, buf) in enumerate(parts):
        acc = 1 if k0 > 0 else 0
        last = i == len(parts) - 1 or n0 > 0 or parts[-1][2] > 0  # K-chunks: epilogue on the last only
        bufs = dict(a=_buf(a), c=_buf(out), **epi.buffers())
        prm: dict[str, float] = dict(M=M, N=nn, acc=acc, c_off=n0, ldc=N, **epi.params(n0, last))
        if gemv:  # (kn == K here: k-major chunks split N, never K)
            gx, gy, _ = _grid(math.ceil(nn / rows_per_wg), ctx)
            if fuse_ln and ln is not None:  # (fuse_ln: ln is given)
                bufs.update(lnw=_buf(ln[0]), lnb=None if ln[1] is None else _buf(ln[1]))
                prm["eps"] = ln[2]
            ctx.launch(k, dict(prm, K4=K // 4, a_off4=a._offset // 4, lda4=lda // 4, b_off4=b_off // 4),
                       dict(bufs, w=buf), (gx, gy, math.ceil(M / mr)))
        elif regs:
            ctx.launch(k, dict(prm, K4=K // 4, a_off4=a._offset // 4, lda4=lda // 4, b_off4=b_off // 4),
                       dict(bufs, w=buf), (math.ceil(nn / 256), math.ceil(M / 4), 1))
        else:
            ctx.launch(k, dict(prm, K=kn, a_off=a._offset + k0, lda=lda, b_off=b_off, ldb_k=ldb_k, ldb_n=ldb_n),
                       dict(bufs, b=buf), (math.ceil(nn / 64), math.ceil(M / 64), 1))


# -- matmul engine: matmul_engine.wgsl, the register-tiled kernel for GPUs ------------------------
# the workgroup tile and split-K, from a sweep of every tile x S = 1, 2, 4, 8 on GPT-2, GPT-2 xl and
# SmolLM2 shapes at M = 64 .. 4,096 (tools/h200/engine_sweep.py on the H200, 132 SMs), in units of
# the policy's compute_units (the GPU's multiprocessors):
# - M < policy.engine_deep_m rows (a batched decode step): 64-row tiles, 64 x 128 where that grid has 2
#   workgroups an SM, else 64 x 64; a grid under 1 an SM cuts K into enough slices for 2 an SM;
# - from engine_deep_m: 128 x 64 tiles from 256 rows (64 x 64 below, or where 128-row tiles would
#   pad more than M / 8 rows); a grid under 2 workgroups an SM doubles its slices (2, 4, 8) until
#   it has 8 an SM.
# Slices are at least policy.engine_split_min_k long; partial products go to a scratch (S, M, N) float32
# buffer that matmul_splitk_sum.wgsl adds up. Against the best of the 16 variants of each case:
# 1.045x on average, worst 1.23x (the rule before, which took the larger tiles first and split only
# under 1 workgroup an SM: 1.124x, worst 1.78x); GPU time summed over the 57 cases 31.5 -> 29.7 ms


def engine_tile(M: int, N: int, policy: KernelPolicy) -> tuple[int, int]:
    """(MT, NT): the workgroup tile is (64 MT) x (64 NT) (the rule above)."""
    if M < policy.engine_deep_m:
        return (1, 2) if math.ceil(M / 64) * math.ceil(N / 128) >= 2 * policy.compute_units else (1, 1)
    extra = math.ceil(M / 128) * 128 - math.ceil(M / 64) * 64  # padding rows 128-row tiles add
    return (2, 1) if M >= 256 and extra * 8 <= M else (1, 1)


def engine_split(M: int, N: int, K: int, tile: tuple[int, int], policy: KernelPolicy) -> tuple[int, int]:
    """(S, ks): K in S slices of ks (a multiple of 16, so of every BK); (1, 0) when not split (the
    rule above)."""
    grid = math.ceil(M / (64 * tile[0])) * math.ceil(N / (64 * tile[1]))
    most = K // max(policy.engine_split_min_k, 1)  # slices of at least engine_split_min_k
    units = policy.compute_units
    if not policy.engine_split_k:
        return 1, 0
    if M < policy.engine_deep_m:
        want = min(math.ceil(2 * units / grid), most) if grid < units else 1
    else:
        want = 1
        while grid < 2 * units and grid * want < 8 * units and 2 * want <= min(8, most):
            want *= 2
    if want < 2:
        return 1, 0
    ks = math.ceil(math.ceil(K / want) / 16) * 16
    return math.ceil(K / ks), ks


def engine_fits(ctx: WgpuContext, a: Tensor, lda: int, parts: list[_Part]) -> bool:
    """Whether matmul_engine.wgsl can run this product: a GPU (or tests asking for GPU kernels on a
    CPU adapter), vec4-aligned rows and offsets, and B with a unit stride along K or along N."""
    if not ctx.policy.engine or not _gpu_style(ctx):
        return False
    if lda % 4 or any((a._offset + pt[0]) % 4 for pt in parts):
        return False
    for _, _, _, _, b_off, ldb_k, ldb_n, _ in parts:
        ldb = ldb_n if ldb_k == 1 else ldb_k if ldb_n == 1 else 1
        if (ldb_k != 1 and ldb_n != 1) or ldb % 4 or b_off % 4:
            return False
    return True


class QuantB(NamedTuple):
    """The engine's B when it is a quantized weight W (N, K) (quant_ops: its GPU layout): W's ggml type and
    the u32 words of heads a row of it has (the kernels' d_ld). Its parts (see _parts) are W's row chunks
    (0, K, n0, rows, 0, 1, K, (quants, scales)): k-major, each chunk's buffers starting at its first row."""

    qtype: str
    d_ld: int


def engine_kernel(ctx: WgpuContext, a_dtype: dt.DType, b_dtype: dt.DType | QuantB, c_dtype: dt.DType,
                  bias_dtype: dt.DType, kmajor: bool, tile: tuple[int, int], even_out: bool = False,
                  split: bool = False) -> Any:
    """The matmul_engine variant. A float16 operand is read as u32 words when the policy's
    engine_f16_words, a float16 output (and residual) written as words when engine_f16_out_words
    and `even_out` (its offset and row stride are even);
    float16 x float16 products compute as engine_f16_math says (f16 tiles take BK = 16: 16 KiB of
    workgroup memory either way); any other pair (float32 activations x float16 weights, as GPT-2
    in float16 runs) in f32 tiles with f32 FMAs. A quantized B (QuantB: float32 A, float32 C) is
    matmul_engine_quant.wgsl, f32 tiles and FMAs. `split`: split-K's first pass (raw float32 partial
    products of the launch's K slices, no epilogue)."""
    policy = ctx.policy
    common = {"TC": "f32" if split else c_dtype.wgsl, "TBIAS": bias_dtype.wgsl, "MT": f"{tile[0]}u",
              "NT": f"{tile[1]}u", "SPLIT": "true" if split else "false"}
    bk32 = f"{engine_bk(ctx, tile)}u"  # (f32 tiles)
    if isinstance(b_dtype, QuantB):
        return ctx.kernel("matmul_engine_quant", {b_dtype.qtype: "true", "TA": "f32", "TS": "f32", "CT": "f32",
                                                  "BK": bk32, "B_KMAJOR": "true", "CHUNKED": "false", **common})
    f16 = a_dtype is dt.float16 and b_dtype is dt.float16
    math_ = policy.engine_f16_math if f16 else "f32"
    tiles16, chunked = math_ != "f32", math_ == "chunked"

    def words(t: dt.DType) -> str:
        return "true" if policy.engine_f16_words and t is dt.float16 else "false"

    packed = policy.engine_f16_out_words and even_out and c_dtype is dt.float16 and not split
    defs = {"TA": a_dtype.wgsl, "TB": b_dtype.wgsl, "TS": "f16" if tiles16 else "f32",
            "CT": "f16" if chunked else "f32", "BK": "16u" if tiles16 else bk32,
            "B_KMAJOR": "true" if kmajor else "false", "CHUNKED": "true" if chunked else "false",
            "APACK": words(a_dtype), "BPACK": words(b_dtype),
            "CPACK": "true" if packed else "false", **common}
    return ctx.kernel("matmul_engine", defs)


def engine_bk(ctx: WgpuContext, tile: tuple[int, int]) -> int:
    """The K step of the engine's f32 tiles: policy.engine_bk where the device's workgroup memory holds the two
    double-buffered tiles of 64 MT and 64 NT rows at that depth (2 BK (64 MT + 64 NT) 4 bytes), else 8 (16 KiB
    at most: WebGPU's default limit)."""
    bk = ctx.policy.engine_bk
    limit = ctx.workgroup_limit
    return bk if 2 * bk * 64 * (tile[0] + tile[1]) * 4 <= limit else 8


def _engine_b(b_dtype: dt.DType | QuantB, part: _Part) -> tuple[dict[str, int], dict[str, Any]]:
    """The parameters and bindings that give a launch B's `part`: a float matrix's offset and row stride
    (in vec4s) and buffer, or a quantized weight's heads a row and its row chunk's two buffers."""
    _, _, _, _, b_off, ldb_k, ldb_n, buf = part
    if isinstance(b_dtype, QuantB):
        return dict(d_ld=b_dtype.d_ld), dict(qs=buf[0], scales=buf[1])
    return dict(b_off4=b_off // 4, ldb4=(ldb_n if ldb_k == 1 else ldb_k) // 4), dict(b=buf)


def matmul_engine(ctx: WgpuContext, a: Tensor, lda: int, M: int, b_dtype: dt.DType | QuantB, parts: list[_Part],
                  out: Tensor, epi: _Epilogue) -> None:
    """out (M, N) = epilogue(a @ b): a's rows `lda` apart, b (a float matrix of `b_dtype`, or a quantized
    weight: QuantB) given as `parts` (see _parts, QuantB), one launch per part, or split-K (one part)."""
    N = out.shape[-1]
    if len(parts) == 1 and _engine_split_k(ctx, a, lda, M, b_dtype, parts[0], out, epi):
        return
    for i, part in enumerate(parts):
        k0, kn, n0, nn, _, ldb_k, _, _ = part
        tile = engine_tile(M, nn, ctx.policy)
        k = engine_kernel(ctx, a.dtype, b_dtype, out.dtype, epi.bias_dtype, ldb_k == 1, tile,
                          even_out=n0 % 2 == 0 and N % 2 == 0)  # (out: a new tensor, offset 0)
        last = i == len(parts) - 1 or n0 > 0 or parts[-1][2] > 0  # K-chunks: epilogue on the last only
        b_prm, b_bufs = _engine_b(b_dtype, part)
        ctx.launch(k, dict(M=M, N=nn, K=kn, acc=1 if k0 > 0 else 0, a_off4=(a._offset + k0) // 4, lda4=lda // 4,
                           c_off=n0, ldc=N, **b_prm, **epi.params(n0, last)),
                   dict(a=_buf(a), c=_buf(out), **b_bufs, **epi.buffers()),
                   (math.ceil(nn / (64 * tile[1])), math.ceil(M / (64 * tile[0])), 1))


def _engine_split_k(ctx: WgpuContext, a: Tensor, lda: int, M: int, b_dtype: dt.DType | QuantB, part: _Part,
                    out: Tensor, epi: _Epilogue) -> bool:
    """out (M, N) = epilogue(a @ b) by split-K when engine_split cuts K (b in one piece): the
    engine's S slices into a scratch (S, rows, N) float32, then matmul_splitk_sum adds them and
    applies the epilogue; a block of rows at a time when the scratch of all M rows is over the
    binding limit. False (nothing launched) when K is not cut or one row's scratch is too big."""
    _, K, _, N, _, ldb_k, _, _ = part
    tile = engine_tile(M, N, ctx.policy)
    S, ks = engine_split(M, N, K, tile, ctx.policy)
    step = min(M, ctx.max_binding_bytes // (S * N * 4))  # rows whose scratch fits one binding
    if S < 2 or step < 1:
        return False
    k = engine_kernel(ctx, a.dtype, b_dtype, dt.float32, epi.bias_dtype, ldb_k == 1, tile, split=True)
    b_prm, b_bufs = _engine_b(b_dtype, part)
    even = N % 2 == 0
    packed = ctx.policy.engine_f16_out_words and even and out.dtype is dt.float16
    ks_kernel = ctx.kernel("matmul_splitk_sum", {"TC": out.dtype.wgsl, "TBIAS": epi.bias_dtype.wgsl,
                                                 "CPACK": "true" if packed else "false"})
    for r0 in range(0, M, step):
        m = min(step, M - r0)
        scratch = _out(out.device, (S, m, N), dt.float32)
        ctx.launch(k, dict(M=m, N=N, K=K, a_off4=(a._offset + r0 * lda) // 4, lda4=lda // 4, ldc=N, ks=ks,
                           c_zs=m * N, **b_prm),
                   dict(a=_buf(a), c=_buf(scratch), **b_bufs),
                   (math.ceil(N / (64 * tile[1])), math.ceil(m / (64 * tile[0])), S))
        epi_prm = epi.params(0, True)
        epi_prm["r_off"] += r0 * epi.r_ld
        ctx.launch(ks_kernel, dict(M=m, N=N, S=S, ld_s=m * N, c_off=r0 * N, ldc=N, **epi_prm),
                   dict(part=_buf(scratch), c=_buf(out), **epi.buffers()), (math.ceil(math.ceil(N / 4) / 64), m, 1))
    return True


# -- attention ------------------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None = None,
              softcap: float | None = None) -> Tensor:
    """q: (T, H, D), k, v: (S, KVH, D) -> (T, H, D); query head h reads kv head h // (H // KVH)
    (every kernel takes the group size H // KVH as a parameter). A sliding `window` and a score
    `softcap` are taken by every kernel but attention_prefill.wgsl (not asked for them)."""
    ctx = _ctx(q)
    q, k, v = (t if t._strides[-1] == 1 else t.contiguous() for t in (q, k, v))
    T, H, D = q.shape
    S = k.shape[0]
    group = H // k.shape[1] if k.shape[1] else 1
    if D > 256:
        raise ShapeError(f"attention on WebGPU supports head dims up to 256, got {D}")
    out = _out(q.device, (T, H, D), q.dtype)
    if T == 0 or H == 0:
        return out
    vec = [q._offset, *q._strides[:2], k._offset, *k._strides[:2], v._offset, *v._strides[:2]]
    views = dict(q_off=q._offset, q_ts=q._strides[0], q_hs=q._strides[1], k_off=k._offset, k_ts=k._strides[0],
                 k_hs=k._strides[1], v_off=v._offset, v_ts=v._strides[0], v_hs=v._strides[1],
                 o_ts=H * D, o_hs=D)
    bufs = dict(q=_buf(q), k=_buf(k), v=_buf(v), o=_buf(out))
    policy = ctx.policy
    extra = dict(window=window or 0, softcap=softcap or 0.0)
    plain = window is None and softcap is None  # (attention_prefill knows neither)
    bk = tiled_keys_per_tile(ctx, q, k, v, vec) if T >= policy.tiled_min_queries else 0
    if bk:
        f16 = q.dtype is dt.float16
        kern = ctx.kernel("attention_tiled", {
            "TS": "f16" if f16 else "f32", "D4": f"{D // 4}u", "KG": f"{bk // 4}u", "F16": "true" if f16 else "false",
            "SG": "true" if 0 < bk // 4 <= ctx.subgroup_size else "false"})
        prm = {n: x // 4 for n, x in views.items() if n != "o_off"}
        ctx.launch(kern, dict(prm, T=T, S=S, causal=int(causal), scale=scale, G=group, **extra), bufs,
                   (math.ceil(T / 64), H, 1))
        return out
    if plain and T >= policy.prefill_min_queries and prefill_fits(ctx, q, k, v, vec):
        kern = ctx.kernel("attention_prefill", {
            "TQ": q.dtype.wgsl, "TO": out.dtype.wgsl, "TS": "f16" if q.dtype is dt.float16 else "f32",
            "D4": f"{D // 4}u", "DT": f"{D // 16}u", "BKV": f"{prefill_keys_per_tile(ctx, D, q.dtype)}u",
            "SG": "true" if prefill_subgroups(ctx) else "false"})
        ctx.launch(kern, dict({n: x // 4 for n, x in views.items()}, T=T, S=S, causal=int(causal), scale=scale,
                              group=group), bufs, (math.ceil(T / 64), H, 1))
        return out
    if (T >= policy.flash_min_queries and D % 4 == 0 and D <= 64 and all(x % 4 == 0 for x in vec)
            and q.dtype is k.dtype is v.dtype is dt.float32):
        kern = ctx.kernel("attention_flash", {"D4": f"{D // 4}u"})
        ctx.launch(kern, dict({n: x // 4 for n, x in views.items()}, T=T, S=S, causal=int(causal), scale=scale,
                              group=group, **extra), bufs, (math.ceil(T / 64), H, 1))
        return out
    if v.dtype is not k.dtype:
        v = copy(v, k.dtype)
        bufs["v"] = _buf(v)
        views.update(v_off=v._offset, v_ts=v._strides[0], v_hs=v._strides[1])
    kern = ctx.kernel("attention", {"TQ": q.dtype.wgsl, "TK": k.dtype.wgsl, "TO": out.dtype.wgsl})
    ctx.launch(kern, dict(views, T=T, S=S, H=H, D=D, causal=int(causal), scale=scale, group=group, **extra), bufs,
               (T, H, 1))
    return out


def prefill_fits(ctx: WgpuContext, q: Tensor, k: Tensor, v: Tensor, offsets: list[int]) -> bool:
    """Whether attention_prefill.wgsl runs this: a GPU (or tests asking for GPU kernels on a CPU
    adapter), one dtype, head dim a multiple of 16 up to 128, vec4-aligned offsets and strides."""
    if not ctx.policy.prefill or not _gpu_style(ctx):
        return False
    D = q.shape[2]
    return (D % 16 == 0 and D <= 128 and q.dtype is k.dtype is v.dtype and all(x % 4 == 0 for x in offsets)
            and prefill_keys_per_tile(ctx, D, q.dtype) > 0)


def tiled_keys_per_tile(ctx: WgpuContext, q: Tensor, k: Tensor, v: Tensor, offsets: list[int]) -> int:
    """BK, the keys a tile of attention_tiled.wgsl (64, 32 or 16: the largest whose tiles fit the
    device's workgroup memory and divide D), or 0 where it does not run: CPU adapters (unless tests
    ask for GPU kernels), mixed or other dtypes, head dims that are not a multiple of 16,
    offsets or strides that are not 4-aligned, heads that do not share KV heads evenly."""
    if not (q.dtype is k.dtype is v.dtype and q.dtype in (dt.float32, dt.float16)) or q.shape[1] % k.shape[1]:
        return 0
    return _tiled_keys(ctx, q.shape[2], q.dtype.itemsize, offsets)


# workgroup memory attention_cache_rows.wgsl adds to attention_tiled_main.wgsl's tiles in attention_tiled_cache.wgsl:
# key_rows (64 u32) and two u32, each variable counted as 16-byte aligned (workgroup_memory.py; a test checks it)
TILED_CACHE_EXTRA_BYTES = 256 + 2 * 16


def tiled_tile_bytes(bk: int, D: int, tile_item: int) -> int:
    """attention_tiled_main.wgsl's workgroup memory for tiles of bk keys of head dim D, `tile_item` bytes a value:
    K^T and V tiles, and P (bk x 64 rows of float32)."""
    return bk * (2 * D * tile_item + 256)


def _tiled_keys(ctx: WgpuContext, D: int, tile_item: int, offsets: list[int], extra_bytes: int = 0) -> int:
    """attention_tiled_main.wgsl's BK for head dim D and tiles of `tile_item` bytes a value (0: it does
    not run: a CPU adapter, D not a multiple of 16, offsets or strides not 4-aligned, no tile fits), its includer
    declaring `extra_bytes` of workgroup memory besides the tiles."""
    if not ctx.policy.tiled or not _gpu_style(ctx) or D % 16 or any(x % 4 for x in offsets):
        return 0
    limit = ctx.workgroup_limit - ctx.policy.tiled_reserved_bytes
    for bk in ctx.policy.tiled_keys:
        if D % bk == 0 and tiled_tile_bytes(bk, D, tile_item) + extra_bytes <= limit:
            return bk
    return 0


def prefill_subgroups(ctx: WgpuContext) -> bool:
    """Whether attention_prefill sums partial scores with subgroup shuffles (needs the feature)."""
    return ctx.policy.prefill_subgroups and ctx.has_subgroups


def prefill_keys_per_tile(ctx: WgpuContext, D: int, dtype: dt.DType) -> int:
    """BKV: the most keys a tile (32, 16, 8 or 4) whose workgroup memory fits the device's limit
    (K and V tiles, plus 64 x (BKV + 1) vec4 partial scores without subgroups); 0 if none does."""
    limit = ctx.workgroup_limit
    tile_item = 2 if dtype is dt.float16 else 4
    sg = prefill_subgroups(ctx)
    for bkv in (32, 16, 8, 4):
        if 2 * bkv * D * tile_item + (16 if sg else 64 * (bkv + 1) * 16) <= limit:
            return bkv
    return 0


# -- embedding and the KV cache -------------------------------------------------------------------
def embedding(table: Tensor, ids: Tensor) -> Tensor:
    """table: (V, C), possibly row-chunked; ids: int32 (...) -> (..., C)."""
    ctx = _ctx(table)
    ids = ids.contiguous()
    V, C = table.shape
    out = _out(table.device, (*ids.shape, C), table.dtype)
    n = ids.size
    if n == 0:
        return out
    if len(table._storage.chunks) == 1:
        table = table.contiguous()
    elif table._offset or not table.is_contiguous() or not table._storage.holds_whole(V, C):
        raise BufferLimitError(
            f"embedding: the table, shape {table.shape}, is a view of part of a tensor stored in row chunks (over this "
            f"device's binding limit of {table.device.max_binding_bytes():,} bytes); a chunked table is read chunk "
            "by chunk only whole (.contiguous() makes a view whole)")
    kern = ctx.kernel("embedding", {"TT": table.dtype.wgsl, "TO": out.dtype.wgsl})
    for r0, rows, buf in table._storage.chunk_ranges(V):
        t_off = table._offset if len(table._storage.chunks) == 1 else 0
        ctx.launch(kern, dict(n_ids=n, cols=C, row0=r0, rows=rows, ids_off=ids._offset, t_off=t_off),
                   dict(table=buf, ids=_buf(ids), o=_buf(out)), _grid(n, ctx))
    return out


def _at0(t: Tensor) -> Tensor:
    """t itself if it starts its buffer contiguously (the small int kernels index from 0), else a copy."""
    return t if t._offset == 0 and t.is_contiguous() else unary("copy", t)


def _rope_code(rope: tuple[Tensor, Tensor, bool] | None) -> str:
    """The kernels' const ROPE: 0 none, 1 rotate_half, 2 interleaved."""
    return "0u" if rope is None else "2u" if rope[2] else "1u"


def _pos_slot(pos: Tensor, slot: Tensor) -> tuple[GpuBuffer, int, int]:
    """Positions and slots (T,) int32 as the KV kernels bind them, one buffer: (it, pos_off, slot_off). The runner's
    are views of one tensor; others are copied into one (two copy launches)."""
    pos, slot = (t if t.is_contiguous() else t.contiguous() for t in (pos, slot))
    if len(pos._storage.chunks) == 1 and len(slot._storage.chunks) == 1 and _buf(pos) is _buf(slot):
        return _buf(pos), pos._offset, slot._offset
    T = pos.shape[0]
    both = _out(pos.device, (2, T), dt.int32)
    unary("copy", pos, out=both[0])
    unary("copy", slot, out=both[1])
    return _buf(both), 0, T


def _kv_geometry(cache: Tensor, table: Tensor | None) -> tuple[dict[str, int], dict[str, GpuBuffer | None]]:
    """The block-table parameters of kv_pages.wgsl for a cache (blocks, block_size, ...) and its table (None: a
    contiguous cache, sequence s = block s), and the table's binding."""
    n_blocks, block = cache.shape[:2]
    if table is None:
        return dict(block=block, max_blocks=0, n_seqs=n_blocks, n_blocks=n_blocks, table_off=0), dict(kv_table=None)
    return (dict(block=block, max_blocks=table.shape[1], n_seqs=table.shape[0], n_blocks=n_blocks,
                 table_off=table._offset), dict(kv_table=_buf(table)))


def _kv_type(cache: Tensor) -> dict[str, str]:
    """The kernels' defines for a pool's element type: Q8 for a q8_0 pool (int32 words), else alias KV (and KV16 for
    float16: kv_pages.wgsl rounds through pack2x16float)."""
    if cache.dtype is dt.int32:
        return {"Q8": "true"}
    return {"KV": cache.dtype.wgsl, "KV16": "true" if cache.dtype is dt.float16 else "false"}


def cache_write(cache: Tensor, src: Tensor, pos: Tensor, slot: Tensor,
                rot: tuple[Tensor, Tensor, bool] | None = None, table: Tensor | None = None) -> None:
    """cache (blocks, block_size, KVH, D or q8_0 words), contiguous; src (T, KVH, D); pos, slot (T,) int32; table
    (n_seqs, max_blocks) int32 or None; rot = (cos, sin, interleaved): src stored rotated (the same launch)."""
    ctx = _ctx(cache)
    if src._strides[-1] != 1:
        src = src.contiguous()
    T, H, D = src.shape
    if T == 0:
        return
    ps, pos_off, slot_off = _pos_slot(pos, slot)
    geo, tb = _kv_geometry(cache, table)
    prm = dict(T=T, H=H, D=D, src_off=src._offset, src_ts=src._strides[0], src_hs=src._strides[1], pos_off=pos_off,
               slot_off=slot_off, c_off=cache._offset, **geo)
    bufs = dict(src=_buf(src), ps=ps, cache=_buf(cache), **tb)
    if rot is not None:
        cos, sin = rot[0].contiguous(), rot[1].contiguous()
        prm.update(half=cos.shape[1], P=cos.shape[0], tc_off=cos._offset, ts_off=sin._offset)
        bufs.update(cos_t=_buf(cos), sin_t=_buf(sin))
    kern = ctx.kernel("cache_write", {"TS": src.dtype.wgsl, "ROPE": _rope_code(rot), **_kv_type(cache)})
    per_row = H * ((D + 63) // 64) if cache.dtype is dt.int32 else H * D  # (q8_0: a thread a scale word)
    ctx.launch(kern, prm, bufs, _grid(math.ceil(T * per_row / WG), ctx))


def cache_gather(cache: Tensor, slot: int, n: int, head_dim: int, table: Tensor | None = None) -> Tensor:
    """Positions 0 .. n - 1 of sequence `slot` of a cache, float32 (n, KVH, head_dim)."""
    ctx = _ctx(cache)
    H = cache.shape[2]
    out = _out(cache.device, (n, H, head_dim), dt.float32)
    if n == 0 or H == 0:
        return out
    geo, tb = _kv_geometry(cache, table)
    kern = ctx.kernel("cache_gather", _kv_type(cache))
    ctx.launch(kern, dict(n=n, H=H, D=head_dim, seq=slot, c_off=cache._offset, **geo),
               dict(cache=_buf(cache), o=_buf(out), **tb), _grid(math.ceil(n * H * head_dim / WG), ctx))
    return out


def _one_buffer(*ts: Tensor) -> bool:
    """Whether the tensors are views of one unchunked buffer (bound once, read at their offsets)."""
    return all(len(t._storage.chunks) == 1 and _buf(t) is _buf(ts[0]) for t in ts)


def cached_attention(q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, slot: Tensor, scale: float,
                     k_new: Tensor | None = None, v_new: Tensor | None = None,
                     rot: tuple[Tensor, Tensor, bool] | None = None, table: Tensor | None = None,
                     window: int | None = None, softcap: float | None = None) -> Tensor:
    """q (T, H, D) against caches (blocks, block_size, KVH, D or q8_0 words): row t sees positions 0..pos[t] of
    sequence slot[t] through `table` (None: a contiguous cache), query head h cache head h // (H // KVH) -> (T, H, D)
    f32, one workgroup per (head, row). With k_new, v_new (T, KVH, D) the rows' keys and values are stored at their
    positions by the same launch and attended to as stored (see cached_attention.wgsl). rot = (cos, sin,
    interleaved): q and k_new rotated first, in the launch (cached_attention_rope.wgsl) where the tables are views
    of one buffer and so are k_new and v_new, of q's dtype (8 storage bindings), else by rope launches.
    `window`: each row sees its last `window` positions; `softcap`: its scores soft-capped."""
    ctx = _ctx(q)
    if rot is not None:
        cos, sin = (t if t.is_contiguous() else t.contiguous() for t in rot[:2])
        news = [t for t in (k_new, v_new) if t is not None]
        if _one_buffer(cos, sin) and (not news or (_one_buffer(*news) and all(t.dtype is q.dtype for t in news))):
            rot = (cos, sin, rot[2])
        else:
            q = rope(q, pos, cos, sin, rot[2])
            k_new = None if k_new is None else rope(k_new, pos, cos, sin, rot[2])
            rot = None
    views = [t if t._strides[-1] == 1 else t.contiguous() for t in (q, k_new, v_new) if t is not None]
    q8 = kc.dtype is dt.int32
    T, H, D = views[0].shape
    n_blocks, block, KVH = kc.shape[:3]
    if D > 256:
        raise ShapeError(f"cached attention on WebGPU supports head dims up to 256, got {D}")
    out = _out(q.device, (T, H, D), dt.float32)
    if T == 0 or H == 0:
        return out

    def aligned(ts: list[Tensor]) -> bool:
        return D % 4 == 0 and all(x % 4 == 0 for t in ts for x in (t._offset, *t._strides[:2]))
    if q8 and not aligned(views):  # (a q8_0 pool is read a word, four dims, a lane: the vec4 variant only)
        views = [t.contiguous() for t in views]
    q = views[0]
    vec4 = q8 or (aligned(views) and kc._offset % 4 == 0 and vc._offset % 4 == 0)
    u = 4 if vec4 else 1
    cu = 1 if q8 else u  # (the pool's lanes: q8_0 words, or vec4s / scalars of its float type)
    ps, pos_off, slot_off = _pos_slot(pos, slot)
    geo, tb = _kv_geometry(kc, table)
    n_ctx = block if table is None else table.shape[1] * block
    prm = dict(T=T, H=H, D4=D // u, q_off4=q._offset // u, q_ts4=q._strides[0] // u, q_hs4=q._strides[1] // u,
               n_ctx=n_ctx, scale=scale, group=H // KVH, pos_off=pos_off, slot_off=slot_off,
               kc_off4=kc._offset // cu, vc_off4=vc._offset // cu, window=window or 0,
               softcap=softcap or 0.0, **geo)
    bufs = dict(q=_buf(q), ps=ps, kc=_buf(kc), vc=_buf(vc), o=_buf(out), **tb)
    if len(views) == 3:
        k_new, v_new = views[1], views[2]
        if k_new.dtype is not q.dtype or v_new.dtype is not q.dtype:
            k_new, v_new = copy(k_new, q.dtype), copy(v_new, q.dtype)
        prm.update(write=1, k_off4=k_new._offset // u, k_ts4=k_new._strides[0] // u, k_hs4=k_new._strides[1] // u,
                   v_off4=v_new._offset // u, v_ts4=v_new._strides[0] // u, v_hs4=v_new._strides[1] // u)
        bufs.update(kn=_buf(k_new), vn=_buf(v_new))
    defs = {"TQ": q.dtype.wgsl, "VEC4": "true" if vec4 else "false", **_kv_type(kc)}
    if rot is not None:
        cos, sin = rot[0], rot[1]
        prm.update(half=cos.shape[1], P=cos.shape[0], tc_off=cos._offset, ts_off=sin._offset)
        kn = bufs.pop("kn", None)
        bufs.pop("vn", None)
        # kv: k_new and v_new's one buffer; without them (write=0) the kernel never reads it: q's stands in
        bufs.update(kv=kn if kn is not None else bufs["q"], tab=_buf(cos))
        kern = ctx.kernel("cached_attention_rope", dict(defs, ROPE=_rope_code(rot)))
    else:
        kern = ctx.kernel("cached_attention", defs)
    y, z = _rows_grid(T)
    ctx.launch(kern, prm, bufs, (H, y, z))
    return out


def chunk_attention(q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, slot: Tensor, scale: float,
                    table: Tensor | None = None, window: int | None = None,
                    softcap: float | None = None) -> Tensor:
    """q (T, H, D) of one sequence's rows (all in sequence slot[0]) against caches (blocks, block_size, KVH, D or
    q8_0 words) read through `table` (None: a contiguous cache): row t sees positions 0..pos[t] (the last `window`
    of them where it slides, scores soft-capped by `softcap`) -> (T, H, D) f32.
    attention_tiled_cache.wgsl where it runs (GPUs: query tiles sharing key tiles, see `_tiled_keys`),
    attention_flash_cache.wgsl on CPU adapters (float32 q, D a multiple of 4 up to 64, as attention_flash), else
    cached_attention's kernel (one workgroup a row and head: the same numbers for rows of one sequence). The pool's
    values are read as stored (float16 widened, q8_0 dequantized: kv_pages.wgsl)."""
    ctx = _ctx(q)
    if q._strides[-1] != 1:
        q = q.contiguous()
    T, H, D = q.shape
    KVH = kc.shape[2]
    q8 = kc.dtype is dt.int32
    words = KVH * (q8_words(D) if q8 else D // 4) if q8 or D % 4 == 0 else 0  # (the pool's words a position)
    offsets = [q._offset, *q._strides[:2]] + ([] if q8 else [kc._offset, vc._offset])
    bk = (_tiled_keys(ctx, D, 4, offsets, TILED_CACHE_EXTRA_BYTES) if q.dtype in (dt.float32, dt.float16) and D <= 256
          else 0)
    flash = (not bk and T >= ctx.policy.flash_min_queries and D % 4 == 0 and D <= 64 and q.dtype is dt.float32
             and all(x % 4 == 0 for x in offsets))
    if not words or (not bk and not flash):
        return cached_attention(q, kc, vc, pos, slot, scale, table=table, window=window, softcap=softcap)
    out = _out(q.device, (T, H, D), dt.float32)
    if T == 0 or H == 0:
        return out
    if bk:
        kern = ctx.kernel("attention_tiled_cache", {
            "TS": "f32", "D4": f"{D // 4}u", "KG": f"{bk // 4}u", "F16": "true" if q.dtype is dt.float16 else "false",
            "SG": "true" if 0 < bk // 4 <= ctx.subgroup_size else "false", **_kv_type(kc)})
    else:
        kern = ctx.kernel("attention_flash_cache", {"D4": f"{D // 4}u", **_kv_type(kc)})
    pos, slot = _at0(pos), _at0(slot)
    geo, tb = _kv_geometry(kc, table)
    cu = 1 if q8 else 4  # (the pool's words: q8_0 u32s, or vec4s of its float type)
    n_ctx = geo["block"] if table is None else geo["max_blocks"] * geo["block"]
    n_seqs = geo["n_blocks"] if table is None else geo["n_seqs"]
    group = {"G" if bk else "group": H // KVH}
    ctx.launch(kern, dict(T=T, scale=scale, q_off=q._offset // 4, q_ts=q._strides[0] // 4, q_hs=q._strides[1] // 4,
                          o_ts=H * D // 4, o_hs=D // 4, n_ctx=n_ctx, n_slots=n_seqs, C4=words,
                          kc_off=kc._offset // cu, vc_off=vc._offset // cu, window=window or 0,
                          softcap=softcap or 0.0, **group, **geo),
               dict(q=_buf(q), pos=_buf(pos), slot=_buf(slot), kc=_buf(kc), vc=_buf(vc), o=_buf(out), **tb),
               (math.ceil(T / 64), H, 1))
    return out


def advance_tokens(new: Tensor, ids: Tensor, pos: Tensor, tokens: Tensor, count: Tensor) -> None:
    """The end of a replayed decode step (advance_tokens.wgsl): ids = new, pos += 1, the tokens
    appended to the ring `tokens` (ring, B) at step count[0], count += 1."""
    ctx = _ctx(new)
    B = new.shape[0]
    if any(t._offset or not t.is_contiguous() for t in (ids, pos, tokens, count)):
        raise ShapeError("advance_tokens writes whole tensors: ids, pos, tokens and count must not be views")
    new = _at0(new)
    ctx.launch(ctx.kernel("advance_tokens"), dict(B=B, ring=tokens.size // max(B, 1)),
               dict(next_ids=_buf(new), ids=_buf(ids), pos=_buf(pos), tokens=_buf(tokens), count=_buf(count)),
               (1, 1, 1))
