"""Quantized weights on WebGPU (ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS): their GPU
layout, the upload (from ggml's bytes, by numpy where it is there and without it in the page, or from a
`QuantWeight`) and its inverse, and the ops
`quant_linear` and `quant_embedding`.

GPU layout of a weight (N, K) of block type T (K a multiple of T's block of QK values, nb = K / QK
blocks a row). ggml's blocks (34, 18, 20, 22, 24, 84, 110, 144, 176, 210 and 136 bytes) are mostly not 16-byte
aligned and mix quants with scales, so each is cut into planes: its *quants* (the packed integers), a
multiple of 16 bytes, and its *head* fields (the float16 numbers, Q5's high-bit word, the K-quants'
sub-block scales), each field to its own section, byte for byte as stored:

    type  block  quants: bytes of the block        head fields: bytes of the block        heads a row (u32 words)
    Q8_0    34   2..33    (32 int8)                 0..1 d                                 ceil(nb / 2)
    Q4_0    18   2..17    (16 bytes of nibbles)     0..1 d                                 ceil(nb / 2)
    Q4_1    20   4..19    (16 bytes of nibbles)     0..3 (d, m)                            nb
    Q5_0    22   6..21    (16 bytes of nibbles)     0..1 d;  2..5 qh                       ceil(nb / 2) + nb
    Q5_1    24   8..23    (16 bytes of nibbles)     0..3 (d, m);  4..7 qh                  nb + nb
    Q4_K   144   16..143  (128 bytes of nibbles)    0..15 (d, dmin, 12 bytes of scales)    4 nb
    Q6_K   210   0..191   (ql[128], qh[64])         192..207 scales (int8);  208..209 d    4 nb + ceil(nb / 2)
    Q5_K   176   16..175  (qh[32], qs[128])         0..15 (d, dmin, 12 bytes of scales)    4 nb
    Q3_K   110   0..95    (hmask[32], qs[64])       96..107 scales;  108..109 d            3 nb + ceil(nb / 2)
    Q2_K    84   16..79   (qs[64])                  0..15 scales;  80..83 (d, dmin)        4 nb + nb
    IQ4_NL  18   2..17    (16 bytes of nibbles)     0..1 d                                 ceil(nb / 2)
    IQ4_XS 136   8..135   (128 bytes of nibbles)    0..7 (d, scales_h, scales_l[4])        2 nb

- quants: u32 (N, nb * quants / 4), row-major: each row's blocks' quants in order, read by the kernels
  as vec4<u32> (every block's quants are whole vec4s, so every row and block starts on one, and a
  warp's lanes reading consecutive vec4s read the same kind of bytes);
- scales: u32 (N, d_ld): each row's heads, one section per field, in block order within it, each
  section padded to whole words (float16 values two a word, the low half first, an odd count
  leaving the section's last high half 0, read with unpack2x16float; Q5's qh one word a block; the
  K-quants' 16 bytes of scales four words a block).

The bytes per value (quants + heads) are ggml's: nothing is widened.

A weight whose quants exceed the device's storage binding limit is split by output rows into chunks
(`chunk_rows` rows each, the last fewer), quants and scales alike, each chunk its own pair of
buffers; `quant_linear` runs one dispatch per chunk, each writing its block of output columns, and
`quant_embedding` one per chunk, each writing the rows whose ids fall in it.

Kernels (one per role, the block type chosen by a define that includes its dequantizer, see
kernels/quant_dequant.wgsl; all f32 arithmetic, dequantized values exactly the numpy reference's):
- gemv_quant.wgsl for M <= 8 rows and for stacks of one-row products (decode; up to the policy's
  gemv_stack_quant_max_rows on GPUs, any number on CPU adapters), MR rows a
  workgroup (`ops.gemv_group`), LANES threads per output (on CPU adapters 1, and the policy's gemv_quant_nr outputs a
  thread), with the layer-norm or RMS-norm prologue of gemv_norm.wgsl (`ln=` / `rms=`),
- gemv_quant_dot4.wgsl in its place on GPUs whose WGSL has dot4I8Packed (`WgpuContext.has_dot4`) while the
  policy's gemv_quant_dot4 is on: the activations quantized to int8 blocks of 32 (q8_act.wgsl, through the
  same prologues) and dotted with the weights' integers (`kernel_for`: "dot4"); with gemv_dot4_prequant they are
  quantized once by quantize_q8.wgsl (`quantize_rows`) for every chunk's launch ("dot4q"),
- matmul_engine_quant.wgsl for M > 8 on GPUs, and for stacks of more than the policy's
  gemv_stack_quant_max_rows one-row products: the float matmul engine (matmul_engine_core.wgsl: its tiles,
  split-K, epilogue; `ops.matmul_engine` plans it) with each K step's tile of W dequantized on its way into
  workgroup memory (the type file's wvec),
- matmul_quant.wgsl for M > 8 on GPUs whose policy turns the engine off (64x64 tiles, dequantized into the
  tile of W),
- matmul_quant_regs.wgsl for M > 8 on CPU adapters (no workgroup memory, no barriers),
- embedding_quant.wgsl for row gathers.

Unused bias / residual inputs get the context's dummy buffer (see `WgpuContext.launch`).

Nothing here needs numpy except `pack` / `unpack` (and so `upload` of a numpy `QuantWeight`): the
page (Pyodide, no numpy) builds its weights with `upload_blocks` straight from a GGUF tensor's bytes.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import activations
from ... import dtypes as dt
from ...errors import ArgumentError, BufferLimitError, DTypeError, ShapeError
from ...quant import types as qtypes
from ...tensor import Tensor
from . import ops as gops
from .context import GpuBuffer, WgpuContext
from .storage import WgpuStorage

if TYPE_CHECKING:
    import numpy as np

    from ...quant.weight import QuantWeight


class Layout(NamedTuple):
    """Where a block's quants (`body`) and head fields lie in ggml's block: (first byte, bytes) each
    (module docstring); the fields in the order of their sections in a row's heads."""

    body: tuple[int, int]
    heads: tuple[tuple[int, int], ...]


LAYOUTS: dict[str, Layout] = {
    "Q8_0": Layout((2, 32), ((0, 2),)), "Q4_0": Layout((2, 16), ((0, 2),)), "Q4_1": Layout((4, 16), ((0, 4),)),
    "Q5_0": Layout((6, 16), ((0, 2), (2, 4))), "Q5_1": Layout((8, 16), ((0, 4), (4, 4))),
    "Q4_K": Layout((16, 128), ((0, 16),)), "Q6_K": Layout((0, 192), ((192, 16), (208, 2))),
    "Q5_K": Layout((16, 160), ((0, 16),)), "Q3_K": Layout((0, 96), ((96, 12), (108, 2))),
    "Q2_K": Layout((16, 64), ((0, 16), (80, 4))), "IQ4_NL": Layout((2, 16), ((0, 2),)),
    "IQ4_XS": Layout((8, 128), ((0, 8),)),
}


# -- the layout ---------------------------------------------------------------------------------
def quant_words(qtype: str, k: int) -> int:
    """u32 words per row of the quants array (block bodies)."""
    return k // qtypes.TYPES[qtype].values * LAYOUTS[qtype].body[1] // 4


def _sections(qtype: str, k: int) -> list[tuple[int, int, int]]:
    """[(first byte in the block, bytes, first byte in the row's heads)] of each head field."""
    nb = k // qtypes.TYPES[qtype].values
    out, at = [], 0
    for off, size in LAYOUTS[qtype].heads:
        out.append((off, size, at))
        at += -(-nb * size // 4) * 4
    return out


def scale_words(qtype: str, k: int) -> int:
    """u32 words per row of the scales array (block heads), p.d_ld of the kernels."""
    nb = k // qtypes.TYPES[qtype].values
    return sum(-(-nb * size // 4) for _, size in LAYOUTS[qtype].heads)


def _gpu_shape(qtype: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(N, K) of a weight the kernels can run: K whole blocks (ShapeError otherwise)."""
    n, k = (int(s) for s in shape)
    q = qtypes.block_type(qtype, ShapeError).values
    if k % q or k <= 0:
        raise ShapeError(f"{qtype} on WebGPU needs K a positive multiple of {q} (whole blocks), got a weight of "
                         f"shape {(n, k)}")
    return n, k


def pack(w: QuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """(quants u32 (N, quant_words), scales u32 (N, scale_words)): the GPU layout of `w` (module
    docstring); ShapeError where K is not whole blocks."""
    import numpy as np

    n, k = _gpu_shape(w.qtype, w.shape)
    t, lay = w.block, LAYOUTS[w.qtype]
    nb = k // t.values
    b = w.blocks.reshape(n, nb, t.nbytes)
    bo, bl = lay.body
    quants = np.ascontiguousarray(b[:, :, bo : bo + bl]).reshape(n, nb * bl).view("<u4")
    heads = np.zeros((n, 4 * scale_words(w.qtype, k)), np.uint8)
    for off, size, at in _sections(w.qtype, k):
        heads[:, at : at + nb * size] = b[:, :, off : off + size].reshape(n, nb * size)
    return quants, heads.view("<u4")


def unpack(qtype: str, quants: np.ndarray, scales: np.ndarray, shape: tuple[int, int]) -> QuantWeight:
    """The inverse of `pack`: a QuantWeight from the two u32 arrays (any of their flat forms)."""
    import numpy as np

    from ...quant.weight import QuantWeight

    n, k = _gpu_shape(qtype, shape)
    t, lay = qtypes.TYPES[qtype], LAYOUTS[qtype]
    nb = k // t.values
    bo, bl = lay.body
    blocks = np.zeros((n, nb, t.nbytes), np.uint8)
    blocks[:, :, bo : bo + bl] = np.ascontiguousarray(quants, "<u4").view(np.uint8).reshape(n, nb, bl)
    heads = np.ascontiguousarray(scales, "<u4").view(np.uint8).reshape(n, 4 * scale_words(qtype, k))
    for off, size, at in _sections(qtype, k):
        blocks[:, :, off : off + size] = heads[:, at : at + nb * size].reshape(n, nb, size)
    return QuantWeight(qtype, blocks.reshape(n, nb * t.nbytes), (n, k))


def split_blocks(qtype: str, raw: Any, rows: int, k: int) -> tuple[bytearray, bytearray]:
    """ggml's bytes of `rows` rows of K values of `qtype` -> (quants, scales) in the GPU layout,
    without numpy: each byte position of the body and of each head field is one strided slice copy
    (and a row's head sections are placed by one slice copy each where they need padding)."""
    t, lay = qtypes.TYPES[qtype], LAYOUTS[qtype]
    nb, bb = k // t.values, t.nbytes
    bo, bl = lay.body
    src = memoryview(raw).cast("B")
    if bl == bb:
        quants = bytearray(src)
    else:
        quants = bytearray(rows * nb * bl)
        for j in range(bl):  # byte j of every block's body
            quants[j::bl] = src[bo + j :: bb]
    row_bytes = 4 * scale_words(qtype, k)
    scales = bytearray(rows * row_bytes)
    for off, size, at in _sections(qtype, k):
        field = bytearray(rows * nb * size)  # the field of every block, nb * size bytes a row
        for j in range(size):
            field[j::size] = src[off + j :: bb]
        if row_bytes == nb * size:  # the only section, no padding: the rows as they are
            scales = field
            continue
        span = nb * size
        if span < rows:  # the fewer slice copies: one per byte position of a row's section ...
            for q in range(span):
                scales[at + q :: row_bytes] = field[q::span]
        else:  # ... or one per row
            for r in range(rows):
                scales[r * row_bytes + at : r * row_bytes + at + span] = field[r * span : (r + 1) * span]
    return quants, scales


class QuantGpu(qtypes.Quantized):
    """A quantized weight (N, K) of type `qtype` on a WebGPU device, in the layout above: `quants`
    and `scales` are WgpuStorage row-chunked alike (`chunk_rows` rows per chunk). Buffers go back to
    the device's pool when this is dropped."""

    __slots__ = ("device", "qtype", "shape", "quants", "scales", "chunk_rows", "__weakref__")

    def __init__(self, device: Any, qtype: str, shape: tuple[int, int], quants: WgpuStorage, scales: WgpuStorage,
                 chunk_rows: int):
        self.device, self.qtype, self.shape = device, qtype, shape
        self.quants, self.scales, self.chunk_rows = quants, scales, chunk_rows

    @property
    def nbytes(self) -> int:
        n, k = self.shape
        return n * 4 * (quant_words(self.qtype, k) + scale_words(self.qtype, k))

    def chunks(self) -> list[tuple[int, int, GpuBuffer, GpuBuffer]]:
        """[(first_row, n_rows, quants_buffer, scales_buffer)]."""
        n = self.shape[0]
        return [(r0, rows, q, s) for (r0, rows, q), s in zip(self.quants.chunk_ranges(n), self.scales.chunks,
                                                             strict=True)]

    def to_quant_weight(self) -> QuantWeight:
        """Read the buffers back (tests: the inverse of `upload`)."""
        import numpy as np

        ctx = self.device.ctx
        n, k = self.shape
        qw, sw = quant_words(self.qtype, k) * 4, scale_words(self.qtype, k) * 4
        parts = [c for c in self.chunks() if c[1]]  # (an empty weight has nothing to read)
        q = b"".join(bytes(ctx.read(qb, 0, rows * qw)) for _, rows, qb, _ in parts)
        s = b"".join(bytes(ctx.read(sb, 0, rows * sw)) for _, rows, _, sb in parts if sw)
        return unpack(self.qtype, np.frombuffer(q, "<u4"), np.frombuffer(s, "<u4"), self.shape)

    def __repr__(self) -> str:
        return f"QuantGpu({self.qtype}, shape={self.shape}, chunks={len(self.quants.chunks)}, {self.device.describe()})"


def _chunk_rows(ctx: WgpuContext, qtype: str, shape: tuple[int, int]) -> int:
    """Rows per chunk: as many as fit the binding limit with their quants."""
    n, k = shape
    row = 4 * quant_words(qtype, k)
    limit = ctx.max_binding_bytes
    if row > limit:
        raise BufferLimitError(f"one row of a {qtype} weight of shape {shape} ({row:,} bytes) is over the binding "
                               f"limit of {limit:,} bytes")
    return max(1, min(n, limit // row)) if n else 1


def _upload_chunks(device: Any, qtype: str, shape: tuple[int, int], parts: Any,
                   done: Callable[[int, int], None] | None = None) -> QuantGpu:
    """A QuantGpu from `parts(r0, r1)` -> (quants bytes, scales bytes) of rows r0..r1 in the GPU layout, asked for
    a few rows at a time (about `ctx.upload_piece` bytes: the host holds one such piece, not the weight) and written
    at their place in the chunks' buffers; `done(r0, r1)` once rows r0..r1 are copied."""
    ctx: WgpuContext = device.ctx
    n, k = shape
    rows_per = _chunk_rows(ctx, qtype, shape)
    row_q, row_s = 4 * quant_words(qtype, k), 4 * scale_words(qtype, k)  # (whole u32 words: aligned offsets)
    step = max(1, ctx.upload_piece // max(1, row_q + row_s))
    q_chunks: list[GpuBuffer] = []
    s_chunks: list[GpuBuffer] = []
    for r0 in range(0, max(n, 1), rows_per):
        r1 = min(n, r0 + rows_per)
        q_buf = ctx.alloc(max(4, (r1 - r0) * row_q), reuse=False)  # (uploaded now: never a recycled buffer)
        s_buf = ctx.alloc(max(4, (r1 - r0) * row_s), reuse=False)
        q_chunks.append(q_buf)
        s_chunks.append(s_buf)
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            for data, buf, row in zip(parts(a, b), (q_buf, s_buf), (row_q, row_s), strict=True):
                if memoryview(data).nbytes != (b - a) * row:  # (a defect of the layout code, not of the input)
                    raise AssertionError(f"{qtype} rows {a}..{b}: {memoryview(data).nbytes} bytes, not {b - a} x {row}")
                if row:
                    ctx.upload(buf, data, offset=(a - r0) * row, fresh=True)
            if done is not None:
                done(a, b)
    return QuantGpu(device, qtype, shape, WgpuStorage(ctx, q_chunks, rows_per), WgpuStorage(ctx, s_chunks, rows_per),
                    rows_per)


def upload(device: Any, w: QuantWeight) -> QuantGpu:
    """`w` on WebGPU device `device`, row-chunked where its quants exceed the binding limit."""
    quants, scales = pack(w)
    return _upload_chunks(device, w.qtype, w.shape, lambda r0, r1: (quants[r0:r1], scales[r0:r1]))


def upload_blocks(device: Any, qtype: str, raw: Any, shape: tuple[int, ...],
                  done: Callable[[int, int], None] | None = None) -> QuantGpu:
    """A matrix of logical shape (N, K) in ggml type `qtype` from its bytes as stored (a GGUF
    tensor: N rows of K / QK blocks, row-major) straight onto `device`, a few rows at a time;
    `done(a, b)` once bytes a..b of `raw` are on their way (the caller may drop them: a file map's
    pages). Equal to `upload(device, QuantWeight.from_blocks(qtype, raw, shape))`. CheckpointError
    for an unknown type, a shape that is not whole blocks, or bytes that do not fit the shape."""
    mv = memoryview(raw).cast("B")
    n, k = qtypes.check_blocks(qtype, tuple(shape), mv.nbytes)
    row_bytes = qtypes.row_bytes(qtype, k)
    layout = _rows_in_gpu_layout(qtype, k)
    return _upload_chunks(device, qtype, (n, k), lambda r0, r1: layout(mv[r0 * row_bytes : r1 * row_bytes], r1 - r0),
                          None if done is None else lambda r0, r1: done(r0 * row_bytes, r1 * row_bytes))


def _rows_in_gpu_layout(qtype: str, k: int) -> Callable[[memoryview, int], tuple[Any, Any]]:
    """(ggml's bytes of `rows` rows, rows) -> (quants, scales) in the GPU layout: numpy's `pack` where numpy is
    there (a few copies at memory speed: an 8B file's 4.9 GB in seconds), else `split_blocks` (the page without
    numpy: a strided copy per byte position, about 5x slower; test_quant_kernels checks the two agree)."""
    try:
        from ...quant.weight import QuantWeight  # (numpy)
    except ImportError:
        return lambda raw, rows: split_blocks(qtype, raw, rows, k)
    return lambda raw, rows: pack(QuantWeight.from_blocks(qtype, raw, (rows, k)))


_UPLOADED: weakref.WeakKeyDictionary[QuantWeight, dict[int, QuantGpu]] = weakref.WeakKeyDictionary()


def on_device(device: Any, w: QuantWeight | QuantGpu, op: str = "linear") -> QuantGpu:
    """`w` as a QuantGpu on `device`: a QuantGpu as is (it must live there), a QuantWeight uploaded
    once per device and kept while the QuantWeight lives (the model's host copy keys its device copy)."""
    if isinstance(w, QuantGpu):
        if not w.device.same_as(device):
            raise ArgumentError(f"{op}: the {w.qtype} weight lives on {w.device.describe()}, the input on "
                                f"{device.describe()}")
        return w
    per_dev = _UPLOADED.setdefault(w, {})
    g = per_dev.get(id(device.ctx))
    if g is None or g.device.ctx is not device.ctx or device.ctx.released:
        g = per_dev[id(device.ctx)] = upload(device, w)
    return g


# -- kernel choice ------------------------------------------------------------------------------
def quant_lanes(ctx: WgpuContext, K: int, dot4: bool = False) -> int:
    """Threads per output of the quantized GEMVs (the policy's gemv_quant_lanes where set). CPU adapters: 1
    (f32 kernel). GPUs, counting 32-value units (K / 32 a row): the f32 kernel takes the float GEMV's rule
    (`ops.gemv_lanes`: 32 to 256 lanes, at most ~4 units a lane); the integer kernel, whose unit is one
    vec4 load and a few integer ops, 8 to 32 lanes with at least two units a lane."""
    if not gops._gpu_style(ctx):
        return 1
    if ctx.policy.gemv_quant_lanes:
        return ctx.policy.gemv_quant_lanes
    units = K // 32
    if not dot4:
        return gops.gemv_lanes(ctx, units)
    lanes = 8
    while lanes < 32 and units >= 4 * lanes:
        lanes *= 2
    return lanes


def gemv_lanes(ctx: WgpuContext, K: int) -> int:
    """Threads per output of gemv_quant.wgsl (the f32 kernel): `quant_lanes`, at least 8 where more than one (its
    reduction writes the MR NR <= 8 outputs of a group from lanes 0 .. MR NR - 1)."""
    lanes = quant_lanes(ctx, K)
    return lanes if lanes == 1 else max(lanes, 8)


def gemv_outputs(ctx: WgpuContext, K: int, mr: int) -> int:
    """Outputs one thread of gemv_quant.wgsl computes: the policy's gemv_quant_nr on CPU adapters (one lane an
    output), gemv_quant_nr_gpu on GPUs, at most 8 / MR (the reduction's workgroup memory)."""
    if gemv_lanes(ctx, K) == 1:
        return ctx.policy.gemv_quant_nr
    return max(1, min(ctx.policy.gemv_quant_nr_gpu, 8 // mr))


def uses_dot4(ctx: WgpuContext, M: int, stack: bool = False) -> bool:
    """Whether a product of M rows runs gemv_quant_dot4 (int8 activations): a GEMV on a GPU-style device
    whose policy asks for it and whose WGSL has the packed integer dot products."""
    return (gops.gemv_group(ctx, M, stack) > 0 and ctx.policy.gemv_quant_dot4 and gops._gpu_style(ctx)
            and ctx.has_dot4)


# workgroup memory of gemv_quant_dot4 besides the staged activations: gemv_norm's red2 and stats,
# common.wgsl's wg_red, and a margin
_DOT4_FIXED_BYTES = 256 * 8 + 8 * 8 + 256 * 4 + 256
_DOT4_STAGE_BYTES = 1.25  # bytes a staged activation value: one int8, and 8 bytes a block of 32 (xm)


def dot4_tile(ctx: WgpuContext, K: int, mr: int, lanes: int, nr: int) -> int:
    """KT, the activation values of each row gemv_quant_dot4 stages at a time: all of K where MR rows of
    it fit the device's workgroup memory, else the most that fit in whole tiles of 32 LANES values (a
    lane's units then stay the same in every tile), or 0 where not even one such tile fits."""
    limit = ctx.workgroup_limit
    if ctx.policy.gemv_dot4_stage_bytes:
        limit = min(limit, ctx.policy.gemv_dot4_stage_bytes)
    sg = ctx.subgroup_size
    red = 4 if sg and lanes <= sg else 4 * mr * nr * (256 // (sg if sg and lanes >= sg else 1))  # (the kernel's)
    budget = limit - _DOT4_FIXED_BYTES - red
    if mr * K * _DOT4_STAGE_BYTES <= budget:
        return K
    step = 32 * lanes
    return max(0, int(budget / (mr * _DOT4_STAGE_BYTES)) // step * step)


def kernel_for(ctx: WgpuContext, qtype: str, M: int, K: int, norm: int = 0,
               stack: bool = False, glu: str | None = None) -> tuple[Any, str, int, int]:
    """(kernel, which, MR, NR): which is "dot4" (int8 activations quantized in the kernel's prologue),
    "dot4q" (the same, its activations quantized by a quantize_q8 launch first: `quantize_rows`), "gemv"
    (float32 activations; MR rows of A a workgroup, NR outputs a thread, for both GEMVs), "engine"
    (matmul_engine_quant.wgsl: its variant, tile and split-K are `ops.matmul_engine`'s, so no kernel here),
    "tiled" (matmul_quant.wgsl, where the policy turns the engine off) or "regs" (CPU adapters). `norm`: the
    GEMV's prologue, 1 layer norm, 2 RMS norm (only where it has lanes to reduce with: norm_fusable). `stack`:
    the rows are a stack of one-row products (`ops.gemv_group`). `glu`: the GEMV's gated prologue, "swiglu" or
    "geglu" (asked for only where a GEMV runs)."""
    mr = gops.gemv_group(ctx, M, stack)
    if mr and uses_dot4(ctx, M, stack):
        pol = ctx.policy
        lanes = quant_lanes(ctx, K, dot4=True)
        nr = max(1, min(pol.gemv_dot4_nr, 8 // mr, lanes // mr))
        sg = ctx.subgroup_size if ctx.has_subgroups else 0
        pre = pol.gemv_dot4_prequant and M <= ctx.max_workgroups  # (then the prologue is quantize_q8's)
        kt = K if pre else dot4_tile(ctx, K, mr, lanes, nr)
        if kt and lanes >= mr:  # (lane q writes the group's output slot q: MR NR of them)
            defs = {qtype: "true", "LANES": f"{lanes}u", "MR": f"{mr}u", "NR": f"{nr}u",
                    "NORM": f"{0 if pre else norm}u", "SG": f"{sg}u", "GLU": gops.GLU[None if pre else glu],
                    "KT": f"{kt}u", "PREQ": "true" if pre else "false", "UNROLL": f"{pol.gemv_dot4_unroll}u"}
            return ctx.kernel("gemv_quant_dot4", defs), "dot4q" if pre else "dot4", mr, nr
    if mr:
        lanes = gemv_lanes(ctx, K)
        nr = gemv_outputs(ctx, K, mr)
        sg = ctx.subgroup_size if lanes > 1 and 1 < ctx.subgroup_size <= lanes else 0
        defs = {qtype: "true", "LANES": f"{lanes}u", "MR": f"{mr}u", "NR": f"{nr}u", "NORM": f"{norm}u",
                "SG": f"{sg}u", "GLU": gops.GLU[glu]}
        return ctx.kernel("gemv_quant", defs), "gemv", mr, nr
    if not gops._gpu_style(ctx):
        return ctx.kernel("matmul_quant_regs", {qtype: "true"}), "regs", 0, 0
    if ctx.policy.engine:
        return None, "engine", 0, 0
    return ctx.kernel("matmul_quant", {qtype: "true"}), "tiled", 0, 0


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
        raise BufferLimitError(f"quant_linear: a tensor of shape {t.shape} is over the binding limit "
                               f"({t.device.max_binding_bytes():,} bytes); split the rows")
    return t, rows, cols, ld


def norm_fusable(ctx: WgpuContext, M: int, K: int, norm: tuple[Tensor, Tensor | None, float],
                 stack: bool = False) -> bool:
    """Whether quant_linear can take `norm` = (weight, bias, eps) (bias None: an RMS norm) into
    gemv_quant's prologue: a GEMV with lanes to reduce with, and weights it can bind as they are."""
    return gops.gemv_group(ctx, M, stack) > 0 and gemv_lanes(ctx, K) > 1 and gops.norm_fusable(norm)


def quant_linear(x: Tensor, qweight: QuantWeight | QuantGpu, bias: Tensor | None = None, act: str | None = None,
                 residual: Tensor | None = None, ln: tuple[Tensor, Tensor, float] | None = None,
                 rms: tuple[Tensor, float] | None = None, glu: str | None = None) -> Tensor:
    """Fused epilogue(x @ W.T) with a quantized weight W (N, K) (nn.Linear's layout; a `QuantWeight`
    or `QuantGpu`), like `webtensor.ops.linear`: + bias (N,), then the activation `act` (a name of
    `webtensor.activations`), then + residual (..., N). x: (..., K) on a WebGPU device, K whole
    blocks. Returns a new float32 tensor (..., N); float16 inputs are widened first. `ln` =
    (weight, bias, eps) layer-normalises x's rows first, `rms` = (weight, eps) RMS-normalises them
    (at most one of the two; in gemv_quant's prologue where it can, else as a layer_norm / rms_norm
    launch). glu="swiglu": x is (..., 2K), [gate | up], and the input is silu(gate) * up (in
    gemv_quant's prologue where the GEMV runs, else as one elementwise launch first); "geglu":
    gelu_tanh(gate) * up."""
    device = x.device
    ctx = gops._ctx(x)
    w = on_device(device, qweight)
    N, K = w.shape
    width = 2 * K if glu is not None else K
    if x.ndim < 1 or x.shape[-1] != width:
        raise ShapeError(f"quant_linear: x {x.shape} against a {w.qtype} weight of shape {w.shape} (N, K): needs "
                         f"x.shape[-1] == {width}")
    if not x.dtype.is_float:
        raise DTypeError(f"quant_linear needs float activations, got {x.dtype.name}")
    out_shape = (*x.shape[:-1], N)
    if bias is not None and bias.shape != (N,):
        raise ShapeError(f"quant_linear: bias must have shape ({N},), got {bias.shape}")
    if residual is not None and residual.shape != out_shape:
        raise ShapeError(f"quant_linear: residual must have the output's shape {out_shape}, got {residual.shape}")
    act = activations.canonical(act)
    out = gops._out(device, out_shape, dt.float32)
    if out.size == 0:
        return out
    # a stack of one-row products: each row its M = 1 result (up to the policy's limit on GPUs)
    stack = x.ndim > 2 and x.shape[-2] == 1 and not gops.stack_goes_tiled(ctx, x.size // width, w.qtype)
    x2, M, _, lda = _f32_rows(x)
    norm = ln if rms is None else (rms[0], None, rms[1])
    fuse = norm is not None and norm_fusable(ctx, M, K, norm, stack)
    if norm is not None and not fuse:
        x2, M, _, lda = _f32_rows(gops.normalize(x2, norm))
    fuse_glu = glu is not None and gops.gemv_group(ctx, M, stack) > 0
    if glu is not None and not fuse_glu:  # the gate as its own launch: (M, K) = swiglu of the halves
        gu = Tensor(device, (M, 2 * K), dt.float32, storage=x2._storage, strides=(lda, 1), offset=x2._offset)
        x2, M, _, lda = _f32_rows(gops.binary(glu, gu[:, :K], gu[:, K:], (M, K), dt.float32))
    if bias is not None and bias.dtype is not dt.float32:
        bias = gops.copy(bias, dt.float32)
    epi = gops._Epilogue(out, bias, act, residual)  # (float32 bias and residual: the kernels read them so)
    kern, which, mr, nr = kernel_for(ctx, w.qtype, M, K, (2 if rms is not None else 1) if fuse else 0, stack,
                                     glu=glu if fuse_glu else None)
    if which == "dot4q":  # the int8 activations once, for every chunk's launch
        x2, lda = quantize_rows(x2, M, K, lda, norm if fuse else None, glu if fuse_glu else None), q8_row_words(K)
        fuse = False
    sw = scale_words(w.qtype, K)
    if which == "engine":
        parts = [(0, K, n0, nn, 0, 1, K, (qbuf, sbuf)) for n0, nn, qbuf, sbuf in w.chunks()]
        gops.matmul_engine(ctx, x2, lda, M, gops.QuantB(w.qtype, sw), parts, out, epi)
        return out
    for n0, nn, qbuf, sbuf in w.chunks():
        params: dict[str, float] = dict(M=M, N=nn, K=K, a_off4=x2._offset // 4, lda4=lda // 4, d_ld=sw, c_off=n0,
                                        ldc=N, **epi.params(n0, True))
        bufs = dict(a=gops._buf(x2), qs=qbuf, scales=sbuf, c=gops._buf(out), **epi.buffers())
        if fuse and norm is not None:  # (fuse: norm is given; both GEMVs bind lnw / lnb)
            params["eps"] = norm[2]
            bufs.update(lnw=gops._buf(norm[0]), lnb=None if norm[1] is None else gops._buf(norm[1]))
        if which in ("dot4", "dot4q"):  # the output groups, over at most gemv_dot4_waves workgroups a compute unit
            groups = math.ceil(nn / (256 * nr // quant_lanes(ctx, K, dot4=True)))  # (ROWS outputs each)
            x_, y_, _ = gops._grid(min(groups, ctx.policy.gemv_dot4_waves * ctx.policy.compute_units), ctx)
            grid = (x_, y_, math.ceil(M / mr))
        elif which == "gemv":
            per_group = 256 * nr // gemv_lanes(ctx, K)
            x_, y_, _ = gops._grid(math.ceil(nn / per_group), ctx)
            grid = (x_, y_, math.ceil(M / mr))
        elif which == "regs":
            grid = (math.ceil(nn / 256), math.ceil(M / 4), 1)
        else:
            grid = (math.ceil(nn / 64), math.ceil(M / 64), 1)
        ctx.launch(kern, params, bufs, grid)
    return out


def q8_row_words(K: int) -> int:
    """u32 words a row of quantize_q8's output: K / 4 of int8, then K / 32 (d, sums) pairs, padded to whole vec4s."""
    return K // 4 + 4 * -(-K // 64)


def quantize_rows(x: Tensor, M: int, K: int, lda: int, norm: tuple[Tensor, Tensor | None, float] | None,
                  glu: str | None) -> Tensor:
    """Rows of x (M rows of K values at stride lda; 2K wide with `glu`), through the fused norm or gated
    prologue ("swiglu" or "geglu"), quantized to int8 activations by one quantize_q8 launch: (M, q8_row_words(K))
    float32 (u32 words), each row K / 4 words of int8 then K / 32 (d, sums) pairs (the layout gemv_quant_dot4
    reads with PREQ)."""
    ctx = gops._ctx(x)
    out = gops._out(x.device, (M, q8_row_words(K)), dt.float32)
    sg = ctx.subgroup_size if ctx.has_subgroups else 0
    code = 0 if norm is None else 2 if norm[1] is None else 1
    kern = ctx.kernel("quantize_q8", {"NORM": f"{code}u", "SG": f"{sg}u", "GLU": gops.GLU[glu]})
    bufs: dict[str, Any] = dict(a=gops._buf(x), o=gops._buf(out))
    params: dict[str, float] = dict(M=M, K=K, a_off4=x._offset // 4, lda4=lda // 4, o_ld=q8_row_words(K))
    if norm is not None:
        params["eps"] = norm[2]
        bufs.update(lnw=gops._buf(norm[0]), lnb=None if norm[1] is None else gops._buf(norm[1]))
    ctx.launch(kern, params, bufs, (math.ceil(K / 32 / 256), M, 1))
    return out


def quant_embedding(table: QuantWeight | QuantGpu, ids: Tensor) -> Tensor:
    """Rows of a quantized table (V, C) at int32 `ids` (any shape), dequantized -> float32 (..., C)."""
    device = ids.device
    ctx = gops._ctx(ids)
    w = on_device(device, table, "embedding")
    V, C = w.shape
    ids = ids.contiguous()
    out = gops._out(device, (*ids.shape, C), dt.float32)
    n = ids.size
    if n == 0:
        return out
    kern = ctx.kernel("embedding_quant", {w.qtype: "true"})
    for r0, rows, qbuf, sbuf in w.chunks():
        ctx.launch(kern, dict(n_ids=n, K=C, row0=r0, rows=rows, ids_off=ids._offset, d_ld=scale_words(w.qtype, C)),
                   dict(qs=qbuf, scales=sbuf, ids=gops._buf(ids), o=gops._buf(out)), gops._grid(n, ctx))
    return out
