"""q8_0 (int8) weights on WebGPU: their GPU layout, the upload and its inverse, and `q8_linear`.

GPU layout of a `Q8Weight` of shape (N, K) (K a multiple of 32; ggml's 34-byte blocks are not
4-byte aligned, so they are split into two arrays that bind as u32):

- quants: u32 (N, K / 4), row-major: row n holds W[n, :] as int8, four per word, little-endian
  (value k in bits 8 (k % 4) .. 8 (k % 4) + 7 of word k / 4). Each output's K values are contiguous,
  as the float GEMV reads its k-major weights; a 32-block is 8 words (two vec4<u32>).
- scales: u32 (N, d_ld), d_ld = ceil(K / 64): the float16 scales of row n, two per word (block j
  at word j / 2, the low half for even j; a last odd block leaves the high half 0), read with
  WGSL's unpack2x16float. 1 byte + 1/16 byte per weight, as in GGUF.

A weight whose quants exceed the device's storage binding limit is split by output rows into
chunks (`chunk_rows` rows each, the last fewer), quants and scales alike, each chunk its own pair
of buffers; `q8_linear` runs one dispatch per chunk, each writing its block of output columns.

Kernels (all f32 arithmetic; bindings: uniform p, then a, quants, scales, bias, residual (read),
then the output (read_write), the same `struct P` for all three):
- gemv_q8.wgsl for M <= 8 rows and for stacks of one-row products of any number (decode), MR rows a
  workgroup (`ops.gemv_group`), LANES threads per output (on CPU adapters 1, and GEMV_Q8_NR
  outputs a thread),
- matmul_q8.wgsl for M > 8 on GPUs (64x64 tiles through workgroup memory),
- matmul_q8_regs.wgsl for M > 8 on CPU adapters (no workgroup memory, no barriers).

Unused bias / residual inputs get the context's dummy buffer (see `WgpuContext.launch`).

Nothing here needs numpy except `pack` / `unpack` (and so `upload` of a numpy `Q8Weight`): the
page (Pyodide, no numpy) builds its weights with `upload_blocks` straight from ggml's bytes.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

from ... import activations
from ... import dtypes as dt
from ...errors import ArgumentError, BufferLimitError, CheckpointError, DTypeError, ShapeError
from ...tensor import Tensor
from . import ops as gops
from .context import GpuBuffer, WgpuContext
from .storage import WgpuStorage

if TYPE_CHECKING:
    import numpy as np

    from ...formats.q8_0 import Q8Weight

BLOCK = 32  # values per q8_0 block (formats.q8_0.BLOCK, ggml's QK8_0)
BLOCK_BYTES = 2 + BLOCK  # ggml's block: a float16 scale, then 32 int8 values
GEMV_MAX_ROWS = gops.GEMV_MAX_ROWS  # up to this many rows of activations, gemv_q8 (W read once for all rows)
GEMV_Q8_NR = 2  # gemv_q8's outputs a thread on CPU adapters: a unit's activations loaded once for both


# -- the layout ---------------------------------------------------------------------------------
def scale_words(k: int) -> int:
    """u32 words per row of the scale array: two float16 scales a word."""
    return -(-(k // BLOCK) // 2)


def pack(w: Q8Weight) -> tuple[np.ndarray, np.ndarray]:
    """(quants u32 (N, K / 4), scales u32 (N, d_ld)): the GPU layout of `w` (module docstring)."""
    import numpy as np

    n, k = w.shape
    if k % BLOCK:
        raise ShapeError(f"q8_0 on WebGPU needs K a multiple of {BLOCK} (whole blocks), got a weight "
                         f"of shape {w.shape}")
    quants = np.ascontiguousarray(w.qs).view("<u4")
    nb = k // BLOCK
    d = np.zeros((n, 2 * scale_words(k)), "<f2")
    d[:, :nb] = w.d
    return quants, d.view("<u4")


def unpack(quants: np.ndarray, scales: np.ndarray, shape: tuple[int, int]) -> Q8Weight:
    """The inverse of `pack`: a Q8Weight from the two u32 arrays (any of their flat forms)."""
    import numpy as np

    from ...formats.q8_0 import Q8Weight

    n, k = shape
    qs = np.ascontiguousarray(quants, "<u4").reshape(n, k // 4).view(np.int8).reshape(n, k)
    d = np.ascontiguousarray(scales, "<u4").reshape(n, scale_words(k)).view("<f2")[:, : k // BLOCK]
    return Q8Weight(qs.copy(), d.astype(np.float16), (n, k))


class Q8Gpu:
    """A q8_0 weight (N, K) on a WebGPU device, in the layout above: `quants` and `scales` are
    WgpuStorage row-chunked alike (`chunk_rows` rows per chunk). Buffers go back to the device's
    pool when this is dropped."""

    __slots__ = ("device", "shape", "quants", "scales", "chunk_rows", "__weakref__")

    def __init__(self, device: Any, shape: tuple[int, int], quants: WgpuStorage, scales: WgpuStorage,
                 chunk_rows: int):
        self.device, self.shape = device, shape
        self.quants, self.scales, self.chunk_rows = quants, scales, chunk_rows

    @property
    def nbytes(self) -> int:
        n, k = self.shape
        return n * k + n * scale_words(k) * 4

    def chunks(self) -> list[tuple[int, int, GpuBuffer, GpuBuffer]]:
        """[(first_row, n_rows, quants_buffer, scales_buffer)]."""
        n = self.shape[0]
        return [(r0, rows, q, s) for (r0, rows, q), s in zip(self.quants.chunk_ranges(n), self.scales.chunks,
                                                             strict=True)]

    def to_q8weight(self) -> Q8Weight:
        """Read the buffers back (tests: the inverse of `upload`)."""
        import numpy as np

        ctx = self.device.ctx
        n, k = self.shape
        sw = scale_words(k)
        parts = [c for c in self.chunks() if c[1]]  # (an empty weight has nothing to read)
        q = b"".join(bytes(ctx.read(qb, 0, rows * k)) for _, rows, qb, _ in parts)
        s = b"".join(bytes(ctx.read(sb, 0, rows * sw * 4)) for _, rows, _, sb in parts)
        return unpack(np.frombuffer(q, "<u4"), np.frombuffer(s, "<u4"), self.shape)

    def __repr__(self) -> str:
        return f"Q8Gpu(shape={self.shape}, chunks={len(self.quants.chunks)}, {self.device.describe()})"


def _chunk_rows(ctx: WgpuContext, shape: tuple[int, int]) -> int:
    """Rows per chunk: as many as fit the binding limit with their K bytes of quants each."""
    n, k = shape
    limit = ctx.max_binding_bytes
    if k > limit:
        raise BufferLimitError(f"one row of a q8_0 weight of shape {shape} ({k:,} bytes) is over the binding "
                               f"limit of {limit:,} bytes")
    return max(1, min(n, limit // k)) if n else 1


def _upload_chunks(device: Any, shape: tuple[int, int], parts: Any) -> Q8Gpu:
    """A Q8Gpu from `parts(r0, r1)` -> (quants bytes, scales bytes) of rows r0..r1 in the GPU layout."""
    ctx: WgpuContext = device.ctx
    n = shape[0]
    rows_per = _chunk_rows(ctx, shape)
    q_chunks, s_chunks = [], []
    for r0 in range(0, max(n, 1), rows_per):
        for data, out in zip(parts(r0, min(n, r0 + rows_per)), (q_chunks, s_chunks), strict=True):
            nbytes = memoryview(data).nbytes
            buf = ctx.alloc(max(4, nbytes))
            out.append(buf)
            if nbytes:
                ctx.upload(buf, data, fresh=True)
    return Q8Gpu(device, shape, WgpuStorage(ctx, q_chunks, rows_per), WgpuStorage(ctx, s_chunks, rows_per),
                 rows_per)


def upload(device: Any, w: Q8Weight) -> Q8Gpu:
    """`w` on WebGPU device `device`, row-chunked where its quants exceed the binding limit."""
    quants, scales = pack(w)
    return _upload_chunks(device, w.shape, lambda r0, r1: (quants[r0:r1], scales[r0:r1]))


def split_blocks(raw: bytes, rows: int, k: int) -> tuple[bytearray, bytearray]:
    """ggml's q8_0 bytes of `rows` rows of K values -> (quants, scales) in the GPU layout, without
    numpy: each of the 32 value positions and the two scale bytes is one strided slice copy."""
    nb = k // BLOCK
    quants = bytearray(rows * k)
    for j in range(BLOCK):  # value j of every block
        quants[j::BLOCK] = raw[2 + j::BLOCK_BYTES]
    d = bytearray(rows * nb * 2)  # the float16 scales, nb per row, packed
    d[0::2], d[1::2] = raw[0::BLOCK_BYTES], raw[1::BLOCK_BYTES]
    row_bytes = scale_words(k) * 4
    if row_bytes == nb * 2:
        return quants, d
    scales = bytearray(rows * row_bytes)  # an odd block count: each row ends in a zero half-word
    for r in range(rows):
        scales[r * row_bytes : r * row_bytes + nb * 2] = d[r * nb * 2 : (r + 1) * nb * 2]
    return quants, scales


def upload_blocks(device: Any, raw: Any, shape: tuple[int, int]) -> Q8Gpu:
    """A q8_0 matrix of logical shape (N, K) from ggml's bytes (a GGUF tensor: N * K / 32 blocks of
    34 bytes, row-major) straight onto `device`, without numpy (the page's loader). Equal to
    `upload(device, Q8Weight.from_blocks(raw, shape))`. CheckpointError when the bytes do not fit."""
    n, k = (int(s) for s in shape)
    if k % BLOCK or k <= 0 or n < 0:
        raise CheckpointError(f"a q8_0 tensor needs rows of a positive multiple of {BLOCK} values, got shape {(n, k)}")
    mv = memoryview(raw).cast("B")
    row_bytes = k // BLOCK * BLOCK_BYTES
    if mv.nbytes != n * row_bytes:
        raise CheckpointError(f"a q8_0 tensor of shape {(n, k)} needs {n * row_bytes} bytes, got {mv.nbytes}")
    return _upload_chunks(device, (n, k),
                          lambda r0, r1: split_blocks(bytes(mv[r0 * row_bytes : r1 * row_bytes]), r1 - r0, k))


_UPLOADED: weakref.WeakKeyDictionary[Q8Weight, dict[int, Q8Gpu]] = weakref.WeakKeyDictionary()


def on_device(device: Any, w: Q8Weight | Q8Gpu) -> Q8Gpu:
    """`w` as a Q8Gpu on `device`: a Q8Gpu as is (it must live there), a Q8Weight uploaded once per
    device and kept while the Q8Weight lives (the model's host copy keys its device copy)."""
    if isinstance(w, Q8Gpu):
        if not w.device.same_as(device):
            raise ArgumentError(f"q8_linear: the weight lives on {w.device.describe()}, the input on "
                                f"{device.describe()}")
        return w
    per_dev = _UPLOADED.setdefault(w, {})
    g = per_dev.get(id(device.ctx))
    if g is None or g.device.ctx is not device.ctx or device.ctx.released:
        g = per_dev[id(device.ctx)] = upload(device, w)
    return g


# -- kernel choice ------------------------------------------------------------------------------
def gemv_lanes(ctx: WgpuContext, K: int) -> int:
    """Threads per output in gemv_q8.wgsl: the float GEMV's rule (`ops.gemv_lanes`) with a 16-quant
    unit in place of a vec4 (1 on CPU adapters; on GPUs 32 to 256, ~4 units a lane at most)."""
    return gops.gemv_lanes(ctx, K // 4)


def gemv_outputs(ctx: WgpuContext, K: int) -> int:
    """Outputs one thread of gemv_q8.wgsl computes: GEMV_Q8_NR on CPU adapters (one lane an
    output), else 1."""
    return GEMV_Q8_NR if gemv_lanes(ctx, K) == 1 else 1


def gemv_rows_per_group(ctx: WgpuContext, K: int) -> int:
    """Outputs one workgroup (256 threads) of gemv_q8.wgsl computes."""
    return 256 * gemv_outputs(ctx, K) // gemv_lanes(ctx, K)


def kernel_for(ctx: WgpuContext, M: int, K: int, ln: bool = False, stack: bool = False,
               rms: bool = False) -> tuple[Any, str, int]:
    """(kernel, which, MR): which is "gemv" (MR rows of A a workgroup), "tiled" or "regs". `ln`:
    gemv_q8 with its norm prologue (only where it has lanes to reduce with: ln_fusable), an RMS
    norm if `rms`, else a layer norm. `stack`: the rows are a stack of one-row products
    (`ops.gemv_group`)."""
    mr = gops.gemv_group(ctx, M, stack)
    if mr:
        defs = {"LANES": f"{gemv_lanes(ctx, K)}u", "MR": f"{mr}u", "NR": f"{gemv_outputs(ctx, K)}u",
                "LN": "true" if ln else "false", "RMS": "true" if ln and rms else "false"}
        return ctx.kernel("gemv_q8", defs), "gemv", mr
    if not gops._gpu_style(ctx):
        return ctx.kernel("matmul_q8_regs"), "regs", 0
    return ctx.kernel("matmul_q8"), "tiled", 0


def _f32_rows(t: Tensor) -> tuple[Tensor, int, int, int]:
    """t as float32 rows (t, rows, cols, row stride) whose first element and stride are 4-aligned,
    in one buffer; copied where they are not."""
    if t.dtype is not dt.float32:
        t = gops.copy(t, dt.float32)
    t, rows, cols, ld = gops._rows(t)
    if t._offset % 4 or ld % 4:
        t = t.contiguous()
        ld = cols
    if len(t._storage.chunks) > 1:
        raise BufferLimitError(f"q8_linear: a tensor of shape {t.shape} is over the binding limit "
                               f"({t.device.max_binding_bytes():,} bytes); split the rows")
    return t, rows, cols, ld


def ln_fusable(ctx: WgpuContext, M: int, K: int, ln: Any, stack: bool = False) -> bool:
    """Whether q8_linear can take `ln` = (weight, bias, eps) (bias None: an RMS norm) into gemv_q8's
    prologue."""
    return (ln is not None and gops.gemv_group(ctx, M, stack) > 0 and gemv_lanes(ctx, K) > 1
            and gops.norm_fusable(ln))


def q8_linear(x: Tensor, qweight: Q8Weight | Q8Gpu, bias: Tensor | None = None, act: str | None = None,
              residual: Tensor | None = None, ln: tuple[Tensor, Tensor, float] | None = None,
              rms: tuple[Tensor, float] | None = None) -> Tensor:
    """Fused epilogue(x @ W.T) with a q8_0 weight W (N, K) (nn.Linear's layout; `Q8Weight` or
    `Q8Gpu`), like `webtensor.ops.linear`: + bias (N,), then the activation `act` (a name of
    `webtensor.activations`), then + residual (..., N). x: (..., K) on a WebGPU device, K a
    multiple of 32. Returns a new float32 tensor (..., N); float16 inputs are widened first.
    `ln` = (weight, bias, eps) layer-normalises x's rows first, `rms` = (weight, eps) RMS-normalises
    them (in gemv_q8's prologue where it can, else as a layer_norm / rms_norm launch)."""
    device = x.device
    ctx = gops._ctx(x)
    w = on_device(device, qweight)
    N, K = w.shape
    if x.ndim < 1 or x.shape[-1] != K:
        raise ShapeError(f"q8_linear: x {x.shape} against a q8_0 weight of shape {w.shape} (N, K): needs "
                         f"x.shape[-1] == {K}")
    if not x.dtype.is_float:
        raise DTypeError(f"q8_linear needs float activations, got {x.dtype.name}")
    out_shape = (*x.shape[:-1], N)
    if bias is not None and bias.shape != (N,):
        raise ShapeError(f"q8_linear: bias must have shape ({N},), got {bias.shape}")
    if residual is not None and residual.shape != out_shape:
        raise ShapeError(f"q8_linear: residual must have the output's shape {out_shape}, got {residual.shape}")
    act = activations.canonical(act)
    out = gops._out(device, out_shape, dt.float32)
    if out.size == 0:
        return out
    stack = x.ndim > 2 and x.shape[-2] == 1  # a stack of one-row products: each row its M = 1 result
    x2, M, _, lda = _f32_rows(x)
    if rms is not None:
        ln = (rms[0], None, rms[1])
    fuse = ln_fusable(ctx, M, K, ln, stack)
    if ln is not None and not fuse:
        x2, M, _, lda = _f32_rows(gops.normalize(x2, ln))
    bits = gops.epilogue_bits(bias is not None, act, residual is not None)
    b_buf, b_off = None, 0
    if bias is not None:
        b = bias.contiguous() if bias.dtype is dt.float32 else gops.copy(bias, dt.float32)
        b_buf, b_off = gops._buf(b), b._offset
    r_buf, r_off, r_ld = None, 0, 0
    if residual is not None:
        r, _, _, r_ld = _f32_rows(residual)
        r_buf, r_off = gops._buf(r), r._offset
    kern, which, mr = kernel_for(ctx, M, K, fuse, stack, rms=rms is not None)
    sw = scale_words(K)
    for n0, nn, qbuf, sbuf in w.chunks():
        params = dict(M=M, N=nn, K=K, a_off4=x2._offset // 4, lda4=lda // 4, d_ld=sw, c_off=n0, ldc=N, epi=bits,
                      bias_off=b_off + n0, r_off=r_off + n0, r_ld=r_ld)
        bufs = dict(a=gops._buf(x2), qs=qbuf, scales=sbuf, bias=b_buf, res=r_buf, c=gops._buf(out))
        if fuse:
            params["eps"] = ln[2]
            bufs.update(lnw=gops._buf(ln[0]), lnb=None if ln[1] is None else gops._buf(ln[1]))
        if which == "gemv":
            x_, y_, _ = gops._grid(math.ceil(nn / gemv_rows_per_group(ctx, K)), ctx)
            grid = (x_, y_, math.ceil(M / mr))
        elif which == "regs":
            grid = (math.ceil(nn / 256), math.ceil(M / 4), 1)
        else:
            grid = (math.ceil(nn / 64), math.ceil(M / 64), 1)
        ctx.launch(kern, params, bufs, grid)
    return out


def q8_embedding(table: Q8Weight | Q8Gpu, ids: Tensor) -> Tensor:
    """Rows of a q8_0 table (V, C) at int32 `ids` (any shape), dequantized -> float32 (..., C)."""
    device = ids.device
    ctx = gops._ctx(ids)
    w = on_device(device, table)
    V, C = w.shape
    ids = ids.contiguous()
    out = gops._out(device, (*ids.shape, C), dt.float32)
    n = ids.size
    if n == 0:
        return out
    kern = ctx.kernel("embedding_q8")
    for r0, rows, qbuf, sbuf in w.chunks():
        ctx.launch(kern, dict(n_ids=n, cols=C, row0=r0, rows=rows, ids_off=ids._offset, d_ld=scale_words(C)),
                   dict(qs=qbuf, scales=sbuf, ids=gops._buf(ids), o=gops._buf(out)), gops._grid(n, ctx))
    return out
