"""WebGPU implementations of webtensor's ops: pick the kernel variant, pack its parameters,
bind whole buffers (offsets travel as parameters, so bind groups stay cached), dispatch.

Shapes and devices are validated by `webtensor.ops` before these are called. Nothing here needs
numpy except `to_numpy`, so the browser (Pyodide without numpy) can use the rest.
"""

from __future__ import annotations

import math
from typing import Any

from ... import activations
from ... import dtypes as dt
from ...errors import DTypeError, ShapeError
from ...tensor import Tensor, contiguous_strides
from .context import WgpuContext
from .storage import WgpuStorage, allocate

WG = 256  # threads per workgroup in the 1-d kernels


def _grid(n_groups: int, ctx: WgpuContext) -> tuple[int, int, int]:
    """Spread `n_groups` workgroups over x and y (kernels flatten them back) under the per-dim limit."""
    if n_groups <= ctx.max_workgroups:
        return (n_groups, 1, 1)
    y = math.ceil(n_groups / ctx.max_workgroups)
    return (math.ceil(n_groups / y), y, 1)


def _ctx(t: Tensor) -> WgpuContext:
    ctx = t.device.ctx
    ctx.check_alive()
    return ctx


def empty(device: Any, shape: tuple[int, ...], dtype: dt.DType) -> Tensor:
    ctx = device.ctx
    if dtype is dt.float16 and not ctx.has_f16:
        raise DTypeError(f"{device.describe()} has no shader-f16 feature: float16 tensors are not supported there")
    return Tensor(device, shape, dtype, storage=allocate(ctx, shape, dtype.itemsize))


def from_host(device: Any, shape: tuple[int, ...], dtype: dt.DType, data: Any) -> Tensor:
    """Upload C-ordered bytes (any buffer-protocol object) into a new tensor."""
    t = empty(device, tuple(shape), dtype)
    mv = memoryview(data).cast("B")
    if mv.nbytes != t.nbytes:
        raise ShapeError(f"{mv.nbytes} bytes given for a tensor of shape {shape} {dtype.name} ({t.nbytes} bytes)")
    ctx, st = device.ctx, t._storage
    row_bytes = t.nbytes // shape[0] if shape and shape[0] else 0
    for r0, n, buf in st.chunk_ranges(shape[0] if shape else 1):
        if len(st.chunks) == 1:
            ctx.upload(buf, mv)
        else:
            ctx.upload(buf, mv[r0 * row_bytes:(r0 + n) * row_bytes])
    return t


def to_bytes(t: Tensor) -> bytes:
    ctx = _ctx(t)
    st: WgpuStorage = t._storage
    if len(st.chunks) > 1:
        if not t.is_contiguous():  # a transposed view of chunked rows: read rows, transpose on host
            return to_numpy(t).tobytes()
        row_bytes = t.nbytes // t.shape[0]
        return b"".join(bytes(ctx.read(b, 0, n * row_bytes)) for _, n, b in st.chunk_ranges(t.shape[0]))
    if not t.is_contiguous():
        t = copy(t)
    if t.size == 0:
        return b""
    return bytes(ctx.read(t._storage.buffer, t._offset * t.dtype.itemsize, t.nbytes))


def to_numpy(t: Tensor) -> Any:
    import numpy as np

    if len(t._storage.chunks) > 1 and not t.is_contiguous():
        base = Tensor(t.device, tuple(reversed(t.shape)), t.dtype, storage=t._storage)
        return np.ascontiguousarray(to_numpy(base).T)
    return np.frombuffer(to_bytes(t), dtype=t.dtype.name).reshape(t.shape).copy()


def synchronize(device: Any) -> None:
    ctx = device.ctx
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


_BINARY = {"add": "0u", "mul": "1u", "sub": "2u", "div": "3u"}


def binary(op: str, a: Tensor, b: Tensor, out_shape: tuple[int, ...], out_dtype: dt.DType) -> Tensor:
    ctx = _ctx(a)
    out = empty(a.device, out_shape, out_dtype)
    sa, sb = _broadcast_strides(a, out_shape), _broadcast_strides(b, out_shape)
    shape, (sa2, sb2, _) = _collapse(out_shape, sa, sb, contiguous_strides(out_shape))
    if len(shape) > 4 and not (a.is_contiguous() and b.is_contiguous()):
        return binary(op, a.contiguous(), b.contiguous(), out_shape, out_dtype)  # contiguous dims merge
    if len(shape) > 4:
        raise ShapeError(f"{op}: broadcasting over more than 4 dims that cannot be merged is not supported "
                         f"on WebGPU ({a.shape} and {b.shape}); make the operands contiguous or reshape them")
    shape, (sa2, sb2) = _pad4(shape, [sa2, sb2])
    k = ctx.kernel("elementwise", 3, {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TO": out_dtype.wgsl, "OP": _BINARY[op]})
    ctx.dispatch(k, (*shape, *sa2, *sb2, a._offset, b._offset, 0, out.size),
                 [a._storage.buffer, b._storage.buffer, out._storage.buffer], _grid(math.ceil(out.size / WG), ctx))
    return out


_UNARY = {"copy": "0u", "gelu": "1u", "scale": "2u"}


def unary(op: str, x: Tensor, out_dtype: dt.DType | None = None, alpha: float = 1.0,
          out: Tensor | None = None) -> Tensor:
    """out = op(x) elementwise; `out` may be a strided view (copy into a slice), else a new tensor."""
    ctx = _ctx(x)
    if out is None:
        out = empty(x.device, x.shape, out_dtype or x.dtype)
    if x.size == 0:
        return out
    shape, (si, so) = _collapse(x.shape, x._strides, out._strides)
    if len(shape) > 4:  # peel the outermost dim: one dispatch per index (rare: >4-d permuted views)
        for i in range(x.shape[0]):
            unary(op, x[i], alpha=alpha, out=out[i])
        return out
    shape, (si, so) = _pad4(shape, [si, so])
    k = ctx.kernel("unary", 2, {"TI": x.dtype.wgsl, "TO": out.dtype.wgsl, "OP": _UNARY[op]})
    ctx.dispatch(k, (*shape, *si, *so, x._offset, out._offset, x.size, float(alpha)),
                 [x._storage.buffer, out._storage.buffer], _grid(math.ceil(x.size / WG), ctx))
    return out


def copy(x: Tensor, dtype: dt.DType | None = None) -> Tensor:
    return unary("copy", x, dtype)


def copy_into(dst: Tensor, src: Tensor) -> None:
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
    out = empty(x.device, x.shape, x.dtype)
    k = ctx.kernel("layer_norm", 4, {"TX": x.dtype.wgsl, "TW": w.dtype.wgsl, "TO": out.dtype.wgsl})
    if b.dtype is not w.dtype:
        b = copy(b, w.dtype)
    ctx.dispatch(k, (rows, cols, x._offset, ld, 0, float(eps), w._offset, b._offset),
                 [x._storage.buffer, w._storage.buffer, b._storage.buffer, out._storage.buffer], _grid(rows, ctx))
    return out


def _rowwise(file: str, x: Tensor, out_dtype: dt.DType, out_shape: tuple[int, ...]) -> Tensor:
    ctx = _ctx(x)
    x, rows, cols, ld = _rows(x)
    out = empty(x.device, out_shape, out_dtype)
    defs = {"TX": x.dtype.wgsl} if file == "argmax" else {"TX": x.dtype.wgsl, "TO": out_dtype.wgsl}
    ctx.dispatch(ctx.kernel(file, 2, defs), (rows, cols, x._offset, ld, 0),
                 [x._storage.buffer, out._storage.buffer], _grid(rows, ctx))
    return out


def softmax(x: Tensor) -> Tensor:
    return _rowwise("softmax", x, x.dtype, x.shape)


def argmax(x: Tensor) -> Tensor:
    return _rowwise("argmax", x, dt.int32, x.shape[:-1])


# -- matmul -------------------------------------------------------------------------------------
def matmul(a: Tensor, b: Tensor, out_dtype: dt.DType, bias: Tensor | None = None, act: str | None = None,
           residual: Tensor | None = None) -> Tensor:
    """a: (..., M, K) @ b: (K, N) or (..., K, N) with the same batch dims -> (..., M, N).
    With b 2-d, the fused epilogue may add `bias` (N,), apply the activation `act` (a canonical
    name of `webtensor.activations`), then add `residual` (..., M, N)."""
    ctx = _ctx(a)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch_shape = a.shape[:-2]
    out = empty(a.device, (*batch_shape, M, N), out_dtype)
    if out.size == 0:
        return out
    if K == 0:
        return empty_zero(out)
    if a._strides[-1] != 1 and K > 1:
        a = a.contiguous()
    batch = math.prod(batch_shape)
    if b.ndim == 2:
        # fold a's batch into M when its rows are evenly strided: one (batch*M, K) product
        shape, (st,) = _collapse(a.shape[:-1], a._strides[:-1])
        if len(shape) > 1:
            a = a.contiguous()
            shape, (st,) = _collapse(a.shape[:-1], a._strides[:-1])
        lda = st[0] if st else K
        epi = _Epilogue(out, bias, act, residual)
        _matmul_2d(ctx, a, lda, batch * M, K, b, out, epi)
        return out
    # batched b: same batch dims as a, each operand one batch stride
    a = a if _one_batch_stride(a) else a.contiguous()
    b = b if _one_batch_stride(b) else b.contiguous()
    lda = a._strides[-2] if M > 1 else K
    nb = len(batch_shape)
    a_bs = a._strides[nb - 1] if nb else 0  # the batch dims collapse to one stride: the innermost's
    b_bs = b._strides[nb - 1] if nb else 0
    k = _mm_kernel(ctx, a, b, out, out, b._strides[-2] == 1)
    ctx.dispatch(k, (M, N, K, 0, a._offset, lda, b._offset, b._strides[-2], b._strides[-1], 0, N, a_bs, b_bs, M * N,
                     0, 0, 0, 0),
                 [a._storage.buffer, b._storage.buffer, out._storage.buffer, out._storage.buffer,
                  out._storage.buffer],
                 (math.ceil(N / 64), math.ceil(M / 64), batch))
    return out


def empty_zero(out: Tensor) -> Tensor:
    """A zero-filled tensor like `out` (uploaded: rare, used only for empty reductions)."""
    import array

    return from_host(out.device, out.shape, out.dtype, array.array(out.dtype.struct_code, [0]) * out.size)


def _one_batch_stride(t: Tensor) -> bool:
    nb = t.ndim - 2
    shape, _ = _collapse(t.shape[:nb], t._strides[:nb])
    return len(shape) <= 1


def _mm_kernel(ctx: WgpuContext, a: Tensor, b: Tensor, out: Tensor, bias: Tensor, kmajor: bool) -> Any:
    defs = {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TC": out.dtype.wgsl, "TBIAS": bias.dtype.wgsl,
            "B_KMAJOR": "true" if kmajor else "false"}
    return ctx.kernel("matmul", 5, defs)


GEMV_MAX_ROWS = 8  # up to this many rows of A, a bandwidth-bound GEMV beats the tiled kernel
FLASH_MIN_QUERIES = 2  # attention over this many queries or more takes attention_flash.wgsl
GPU_STYLE_ON_SOFTWARE = False  # tests set this to run the GPU kernel variants on lavapipe


def gemv_lanes(ctx: WgpuContext, K: int, ln: bool = False) -> int:
    """Threads per output row in gemv.wgsl. CPU-backed adapters: 1 (no reduction, no barriers).
    GPUs: enough lanes that each keeps at most ~4 vec4 loads, 32 to 256; with the fused layer norm
    32 (8 rows a workgroup), since every workgroup pays for the norm's statistics."""
    if ctx.info.is_software and not GPU_STYLE_ON_SOFTWARE:
        return 1
    if ln:
        return 32
    lanes, k4 = 32, K // 4
    while lanes < 256 and k4 > 4 * lanes:
        lanes *= 2
    return lanes


def gemv_kernel(ctx: WgpuContext, a_dtype: dt.DType, w_dtype: dt.DType, out_dtype: dt.DType, bias_dtype: dt.DType,
                K: int, ln: bool = False) -> tuple[Any, int]:
    """The gemv variant for these dtypes and K, and how many outputs one workgroup computes."""
    lanes = gemv_lanes(ctx, K, ln)
    if ln and lanes == 1:
        raise ValueError("the fused layer-norm prologue needs lanes > 1")
    sg = ctx.subgroup_size if 1 < ctx.subgroup_size <= lanes else 0
    k = ctx.kernel("gemv", 7, {"TA": a_dtype.wgsl, "TB": w_dtype.wgsl, "TC": out_dtype.wgsl,
                               "TBIAS": bias_dtype.wgsl, "LN": "true" if ln else "false", "LANES": f"{lanes}u",
                               "SG": f"{sg}u"})
    return k, 256 // lanes


def epilogue_bits(bias: bool, act: str | None, residual: bool) -> int:
    """epilogue.wgsl's p.epi: bit 1 bias, bit 4 residual, the activation's code from bit 8."""
    return (1 if bias else 0) | (4 if residual else 0) | (activations.code(act) << 8)


class _Epilogue:
    """What the fused matmul epilogue adds: bias (N,), an activation, residual (rows with one stride)."""

    def __init__(self, out: Tensor, bias: Tensor | None, act: str | None, residual: Tensor | None):
        self.bits = epilogue_bits(bias is not None, act, residual is not None)
        self.bias = bias.contiguous() if bias is not None else out
        if residual is not None:
            residual, _, _, self.r_ld = _rows(residual)
        else:
            self.r_ld = 0
        self.res = residual if residual is not None else out


def _matmul_2d(ctx: WgpuContext, a: Tensor, lda: int, M: int, K: int, b: Tensor, out: Tensor,
               epi: _Epilogue) -> None:
    N = b.shape[1]
    bufs_tail = [epi.bias._storage.buffer, epi.res._storage.buffer]
    st: WgpuStorage = b._storage
    if len(st.chunks) == 1:
        parts = [(0, K, 0, N, b._offset, b._strides[0], b._strides[1], st.buffer)]
    elif b._strides == (b.shape[1], 1):  # b (K, N) stored in chunks of K-rows: accumulate partial products
        parts = [(r0, n, 0, N, 0, N, 1, buf) for r0, n, buf in st.chunk_ranges(K)]
    else:  # b = table.T, table (N, K) stored in chunks of N-rows: each chunk fills a column block
        parts = [(0, K, r0, n, 0, 1, K, buf) for r0, n, buf in st.chunk_ranges(N)]
    kmajor = parts[0][5] == 1
    vec_ok = (kmajor and K % 4 == 0 and lda % 4 == 0 and a._offset % 4 == 0
              and all(pt[4] % 4 == 0 and pt[6] == K for pt in parts))
    gemv = M <= GEMV_MAX_ROWS and vec_ok
    regs = not gemv and vec_ok and ctx.info.is_software and not GPU_STYLE_ON_SOFTWARE
    if not gemv and not regs and engine_fits(ctx, a, lda, parts):
        _matmul_engine(ctx, a, lda, M, b.dtype, parts, out, epi)
        return
    if gemv:
        k, rows_per_wg = gemv_kernel(ctx, a.dtype, b.dtype, out.dtype, epi.bias.dtype, K)
    elif regs:  # CPU-backed adapters: no workgroup memory, no barriers
        k = ctx.kernel("matmul_regs", 5, {"TA": a.dtype.wgsl, "TB": b.dtype.wgsl, "TC": out.dtype.wgsl,
                                          "TBIAS": epi.bias.dtype.wgsl})
    else:
        k = _mm_kernel(ctx, a, b, out, epi.bias, kmajor)
    for i, (k0, kn, n0, nn, b_off, ldb_k, ldb_n, buf) in enumerate(parts):
        acc = 1 if k0 > 0 else 0
        last = i == len(parts) - 1 or n0 > 0 or parts[-1][2] > 0  # K-chunks: epilogue on the last only
        bits = epi.bits if last else 0
        bufs = [a._storage.buffer, buf, out._storage.buffer, *bufs_tail]
        if gemv:  # (kn == K here: k-major chunks split N, never K)
            x, y, _ = _grid(math.ceil(nn / rows_per_wg), ctx)
            ctx.dispatch(k, (M, nn, K // 4, acc, a._offset // 4, lda // 4, b_off // 4, n0, N, bits,
                             epi.bias._offset + n0, epi.res._offset + n0, epi.r_ld, 0.0),
                         bufs + [out._storage.buffer] * 2, (x, y, M))
        elif regs:
            ctx.dispatch(k, (M, nn, K // 4, acc, a._offset // 4, lda // 4, b_off // 4, n0, N, bits,
                             epi.bias._offset + n0, epi.res._offset + n0, epi.r_ld),
                         bufs, (math.ceil(nn / 256), math.ceil(M / 4), 1))
        else:
            ctx.dispatch(k, (M, nn, kn, acc, a._offset + k0, lda, b_off, ldb_k, ldb_n, n0, N, 0, 0, 0,
                             bits, epi.bias._offset + n0, epi.res._offset + n0, epi.r_ld),
                         bufs, (math.ceil(nn / 64), math.ceil(M / 64), 1))


# -- matmul engine: matmul_engine.wgsl, the register-tiled kernel for GPUs ------------------------
ENGINE = True  # False: GPUs use matmul.wgsl for M > GEMV_MAX_ROWS (the benchmark compares both)
ENGINE_F16_CHUNKED = True  # float16: packed f16 FMAs summed into f32 every BK step; False: f32 FMAs
ENGINE_WAVE = 264  # a larger tile is taken only when its grid has this many workgroups (H200: 2 x 132 SMs)
_Part = tuple[int, int, int, int, int, int, int, Any]  # (k0, kn, n0, nn, b_off, ldb_k, ldb_n, buffer)


def engine_tile(M: int, N: int) -> tuple[int, int]:
    """(MT, NT): the workgroup tile is (64 MT) x (64 NT); the largest whose grid fills the GPU."""
    for mt, nt in ((2, 2), (1, 2)):
        if math.ceil(M / (64 * mt)) * math.ceil(N / (64 * nt)) >= ENGINE_WAVE:
            return mt, nt
    return 1, 1


def engine_fits(ctx: WgpuContext, a: Tensor, lda: int, parts: list[_Part]) -> bool:
    """Whether matmul_engine.wgsl can run this product: a GPU (or tests asking for GPU kernels on a
    CPU adapter), vec4-aligned rows and offsets, and B with a unit stride along K or along N."""
    if not ENGINE or (ctx.info.is_software and not GPU_STYLE_ON_SOFTWARE):
        return False
    if lda % 4 or any((a._offset + pt[0]) % 4 for pt in parts):
        return False
    for _, _, _, _, b_off, ldb_k, ldb_n, _ in parts:
        ldb = ldb_n if ldb_k == 1 else ldb_k if ldb_n == 1 else 1
        if (ldb_k != 1 and ldb_n != 1) or ldb % 4 or b_off % 4:
            return False
    return True


def engine_kernel(ctx: WgpuContext, a_dtype: dt.DType, b_dtype: dt.DType, c_dtype: dt.DType,
                  bias_dtype: dt.DType, kmajor: bool, tile: tuple[int, int]) -> Any:
    """The matmul_engine variant: float16 operands get f16 workgroup tiles and BK = 16 (16 KiB of
    workgroup memory either way), and packed f16 FMAs when ENGINE_F16_CHUNKED."""
    f16 = a_dtype is dt.float16 and b_dtype is dt.float16
    chunked = f16 and ENGINE_F16_CHUNKED
    defs = {"TA": a_dtype.wgsl, "TB": b_dtype.wgsl, "TC": c_dtype.wgsl, "TBIAS": bias_dtype.wgsl,
            "TS": "f16" if f16 else "f32", "CT": "f16" if chunked else "f32", "MT": f"{tile[0]}u",
            "NT": f"{tile[1]}u", "BK": "16u" if f16 else "8u", "B_KMAJOR": "true" if kmajor else "false",
            "CHUNKED": "true" if chunked else "false"}
    return ctx.kernel("matmul_engine", 5, defs)


def _matmul_engine(ctx: WgpuContext, a: Tensor, lda: int, M: int, b_dtype: dt.DType, parts: list[_Part],
                   out: Tensor, epi: _Epilogue) -> None:
    """out (M, N) = epilogue(a @ b): a's rows `lda` apart, b given as `parts` (see _matmul_2d), one
    dispatch per part."""
    N = out.shape[-1]
    for i, (k0, kn, n0, nn, b_off, ldb_k, ldb_n, buf) in enumerate(parts):
        kmajor = ldb_k == 1
        tile = engine_tile(M, nn)
        k = engine_kernel(ctx, a.dtype, b_dtype, out.dtype, epi.bias.dtype, kmajor, tile)
        last = i == len(parts) - 1 or n0 > 0 or parts[-1][2] > 0  # K-chunks: epilogue on the last only
        ctx.dispatch(k, (M, nn, kn, 1 if k0 > 0 else 0, (a._offset + k0) // 4, lda // 4, b_off // 4,
                         (ldb_n if kmajor else ldb_k) // 4, n0, N, epi.bits if last else 0,
                         epi.bias._offset + n0, epi.res._offset + n0, epi.r_ld),
                     [a._storage.buffer, buf, out._storage.buffer, epi.bias._storage.buffer, epi.res._storage.buffer],
                     (math.ceil(nn / (64 * tile[1])), math.ceil(M / (64 * tile[0])), 1))


# -- attention and embedding --------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
    """q: (T, H, D), k, v: (S, H, D) -> (T, H, D)."""
    ctx = _ctx(q)
    q, k, v = (t if t._strides[-1] == 1 else t.contiguous() for t in (q, k, v))
    T, H, D = q.shape
    S = k.shape[0]
    if D > 256:
        raise ShapeError(f"attention on WebGPU supports head dims up to 256, got {D}")
    out = empty(q.device, (T, H, D), q.dtype)
    if T == 0 or H == 0:
        return out
    vec = [q._offset, *q._strides[:2], k._offset, *k._strides[:2], v._offset, *v._strides[:2]]
    if T >= FLASH_MIN_QUERIES and prefill_fits(ctx, q, k, v, vec):
        _attention_prefill(ctx, q, k, v, out, causal, scale)
        return out
    if (T >= FLASH_MIN_QUERIES and D % 4 == 0 and D <= 64 and all(x % 4 == 0 for x in vec)
            and q.dtype is k.dtype is v.dtype is dt.float32):
        kern = ctx.kernel("attention_flash", 4, {"D4": f"{D // 4}u"})
        q4 = [x // 4 for x in vec]
        ctx.dispatch(kern, (T, S, 1 if causal else 0, float(scale), *q4, H * D // 4, D // 4),
                     [q._storage.buffer, k._storage.buffer, v._storage.buffer, out._storage.buffer],
                     (math.ceil(T / 64), H, 1))
        return out
    kern = ctx.kernel("attention", 4, {"TQ": q.dtype.wgsl, "TK": k.dtype.wgsl, "TO": out.dtype.wgsl})
    if v.dtype is not k.dtype:
        v = copy(v, k.dtype)
    ctx.dispatch(kern, (T, S, H, D,
                        q._offset, q._strides[0], q._strides[1], 1 if causal else 0,
                        k._offset, k._strides[0], k._strides[1], float(scale),
                        v._offset, v._strides[0], v._strides[1], 0,
                        H * D, D),
                 [q._storage.buffer, k._storage.buffer, v._storage.buffer, out._storage.buffer], (T, H, 1))
    return out


# -- prefill attention: attention_prefill.wgsl, the flash-style kernel for GPUs -----------------
PREFILL = True  # False: GPUs use attention_flash.wgsl / attention.wgsl for T > 1


def prefill_fits(ctx: WgpuContext, q: Tensor, k: Tensor, v: Tensor, offsets: list[int]) -> bool:
    """Whether attention_prefill.wgsl runs this: a GPU (or tests asking for GPU kernels on a CPU
    adapter), one dtype, head dim a multiple of 16 up to 128, vec4-aligned offsets and strides."""
    if not PREFILL or (ctx.info.is_software and not GPU_STYLE_ON_SOFTWARE):
        return False
    D = q.shape[2]
    return (D % 16 == 0 and D <= 128 and q.dtype is k.dtype is v.dtype and all(x % 4 == 0 for x in offsets)
            and prefill_keys_per_tile(ctx, D, q.dtype) > 0)


PREFILL_SUBGROUPS = True  # False: the partial scores go through workgroup memory even with subgroups


def prefill_subgroups(ctx: WgpuContext) -> bool:
    """Whether attention_prefill sums partial scores with subgroup shuffles (needs the feature)."""
    return PREFILL_SUBGROUPS and ctx.has_subgroups


def prefill_keys_per_tile(ctx: WgpuContext, D: int, dtype: dt.DType) -> int:
    """BKV: the most keys a tile (32, 16, 8 or 4) whose workgroup memory fits the device's limit
    (K and V tiles, plus 64 x (BKV + 1) vec4 partial scores without subgroups); 0 if none does."""
    limit = int(ctx.api.limits.get("max-compute-workgroup-storage-size", 16384))
    tile_item = 2 if dtype is dt.float16 else 4
    sg = prefill_subgroups(ctx)
    for bkv in (32, 16, 8, 4):
        if 2 * bkv * D * tile_item + (16 if sg else 64 * (bkv + 1) * 16) <= limit:
            return bkv
    return 0


def _attention_prefill(ctx: WgpuContext, q: Tensor, k: Tensor, v: Tensor, out: Tensor, causal: bool,
                       scale: float) -> None:
    T, H, D = q.shape
    S = k.shape[0]
    ts = "f16" if q.dtype is dt.float16 else "f32"
    kern = ctx.kernel("attention_prefill", 4, {"TQ": q.dtype.wgsl, "TO": out.dtype.wgsl, "TS": ts,
                                               "D4": f"{D // 4}u", "DT": f"{D // 16}u",
                                               "BKV": f"{prefill_keys_per_tile(ctx, D, q.dtype)}u",
                                               "SG": "true" if prefill_subgroups(ctx) else "false"})
    vec = [x // 4 for x in (q._offset, *q._strides[:2], k._offset, *k._strides[:2], v._offset, *v._strides[:2])]
    ctx.dispatch(kern, (T, S, 1 if causal else 0, float(scale), *vec, out._offset // 4, H * D // 4, D // 4),
                 [q._storage.buffer, k._storage.buffer, v._storage.buffer, out._storage.buffer],
                 (math.ceil(T / 64), H, 1))


def embedding(table: Tensor, ids: Tensor) -> Tensor:
    """table: (V, C), possibly row-chunked; ids: int32 (...) -> (..., C)."""
    ctx = _ctx(table)
    ids = ids.contiguous()
    V, C = table.shape
    out = empty(table.device, (*ids.shape, C), table.dtype)
    n = ids.size
    if n == 0:
        return out
    kern = ctx.kernel("embedding", 3, {"TT": table.dtype.wgsl, "TO": out.dtype.wgsl})
    for r0, rows, buf in table._storage.chunk_ranges(V):
        t_off = table._offset if len(table._storage.chunks) == 1 else 0
        ctx.dispatch(kern, (n, C, r0, rows, ids._offset, 0, t_off),
                     [buf, ids._storage.buffer, out._storage.buffer], _grid(n, ctx))
    return out
