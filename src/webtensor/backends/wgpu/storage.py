"""WgpuStorage: the GPU buffers behind a tensor, row-chunked when over the binding limit.

A tensor whose bytes fit one binding lives in one buffer. A larger one (GPT-2's wte: 154 MB in
fp32, over the common 128 MiB limit; the logits of a long prompt) is split along its first axis
into chunks of whole rows, each its own buffer: `allocate` cuts equal chunks, `adopt` takes the
buffers of results computed a block of rows at a time (`rows.by_rows`), whose chunks may differ
in size. Buffers go back to the device's pool when the last tensor viewing the storage is dropped.

Addressing: a tensor's offset and strides (in elements) address the concatenation of the chunks,
so views (slices, transposes, reshapes) are computed as on one buffer. A view whose elements all lie
in one chunk is given that chunk alone (`narrow`: a borrowed one-buffer storage that keeps the
whole alive), so every kernel can read it; views across chunks are read by the ops that loop over
chunks (matmul's right operand, embedding's table, the row-wise ops through `rows.by_rows`) and by
readbacks.
"""

from __future__ import annotations

import bisect
import math

from ...errors import BufferLimitError
from .context import GpuBuffer, WgpuContext


class WgpuStorage:
    __slots__ = ("ctx", "chunks", "chunk_rows", "starts", "row_elems", "rows", "owner", "__weakref__")

    def __init__(self, ctx: WgpuContext, chunks: list[GpuBuffer], chunk_rows: int, *,
                 starts: list[int] | None = None, row_elems: int = 0, rows: int = 0,
                 owner: WgpuStorage | None = None):
        self.ctx = ctx
        self.chunks = chunks  # one buffer, or several holding `chunk_rows` rows each (the last fewer)
        self.chunk_rows = chunk_rows
        # the first row of each chunk (chunks of different sizes); None: chunk i starts at i * chunk_rows
        self.starts = starts
        self.row_elems = row_elems  # elements per row (0: not a tensor's storage, e.g. q8_0 quants)
        self.rows = rows  # rows in all (a tensor's storage)
        self.owner = owner  # a borrowed view of one chunk of `owner`, which frees the buffers

    def __del__(self) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx is not None and getattr(self, "owner", None) is None:
            for b in self.chunks:
                ctx.release(b)

    @property
    def buffer(self) -> GpuBuffer:
        return self.chunks[0]

    def row_starts(self) -> list[int]:
        return self.starts if self.starts is not None else [i * self.chunk_rows for i in range(len(self.chunks))]

    def chunk_ranges(self, rows: int) -> list[tuple[int, int, GpuBuffer]]:
        """[(first_row, n_rows, buffer)] for a tensor of `rows` rows in this storage."""
        starts = self.row_starts()
        ends = [*starts[1:], rows]
        return [(s, e - s, b) for s, e, b in zip(starts, ends, self.chunks, strict=True)]

    def chunk_of(self, elem: int) -> int:
        """The index of the chunk holding element `elem` (of the concatenation)."""
        if len(self.chunks) == 1:
            return 0
        return bisect.bisect_right(self.row_starts(), elem // self.row_elems) - 1

    def chunk_start(self, i: int) -> int:
        """The element (of the concatenation) where chunk i begins."""
        return self.row_starts()[i] * self.row_elems if i else 0

    def holds_whole(self, rows: int, row_elems: int) -> bool:
        """Whether a view with these rows of row_elems elements, offset 0, is all of this storage."""
        return rows == self.rows and row_elems == self.row_elems

    def narrow(self, offset: int, last: int) -> tuple[WgpuStorage, int]:
        """(storage, offset) for a view whose elements span [offset, last]: its one chunk, borrowed,
        and the offset in it, when the view lies in one chunk; else this storage and `offset`."""
        if len(self.chunks) == 1 or not self.row_elems:
            return self, offset
        i = self.chunk_of(offset)
        if self.chunk_of(last) != i:
            return self, offset
        return WgpuStorage(self.ctx, [self.chunks[i]], 0, row_elems=self.row_elems, owner=self), \
            offset - self.chunk_start(i)


def allocate(ctx: WgpuContext, shape: tuple[int, ...], itemsize: int, reuse: bool = True) -> WgpuStorage:
    """Storage for a contiguous tensor; chunked along axis 0 when over the binding limit. `reuse`: False for
    a tensor about to be uploaded (never a buffer a graph being captured let go of: `WgpuContext.alloc`)."""
    nbytes = max(4, math.prod(shape) * itemsize)
    limit = ctx.max_binding_bytes
    row_elems = math.prod(shape[1:]) if len(shape) > 1 else 1
    if nbytes <= limit:
        return WgpuStorage(ctx, [ctx.alloc(nbytes, reuse)], shape[0] if shape else 1, row_elems=row_elems,
                           rows=shape[0] if shape else 1)
    row_bytes = row_elems * itemsize  # (a 1-d tensor's rows are its elements)
    if row_bytes > limit:
        raise BufferLimitError(
            f"a tensor of shape {shape} ({nbytes:,} bytes) is over the binding limit of {limit:,} bytes "
            f"and cannot be split into row chunks: one row of its first axis is {row_bytes:,} bytes"
        )
    rows_per = limit // row_bytes
    chunks = []
    for r0 in range(0, shape[0], rows_per):
        chunks.append(ctx.alloc(min(rows_per, shape[0] - r0) * row_bytes, reuse))
    return WgpuStorage(ctx, chunks, rows_per, row_elems=row_elems, rows=shape[0])


def adopt(ctx: WgpuContext, buffers: list[GpuBuffer], starts: list[int], rows: int, row_elems: int) -> WgpuStorage:
    """A row-chunked storage of `rows` rows made of `buffers` (their owners gave them up), chunk i
    holding rows starts[i] .. starts[i + 1] (the last: .. rows) of `row_elems` elements each."""
    return WgpuStorage(ctx, buffers, 0, starts=starts, row_elems=row_elems, rows=rows)
