"""WgpuStorage: the GPU buffers behind a tensor, row-chunked when over the binding limit.

A tensor whose bytes fit one binding lives in one buffer. A larger one (GPT-2's wte: 154 MB in
fp32, over the common 128 MiB limit) is split along its first axis into chunks of whole rows, each
its own buffer, and the ops that read such tensors loop over the chunks. Buffers go back to the
device's pool when the last tensor viewing the storage is dropped.
"""

from __future__ import annotations

import math

from ...errors import BufferLimitError
from .context import GpuBuffer, WgpuContext


class WgpuStorage:
    __slots__ = ("ctx", "chunks", "chunk_rows", "__weakref__")

    def __init__(self, ctx: WgpuContext, chunks: list[GpuBuffer], chunk_rows: int):
        self.ctx = ctx
        self.chunks = chunks  # one buffer, or several holding `chunk_rows` rows each (the last fewer)
        self.chunk_rows = chunk_rows

    def __del__(self) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            for b in self.chunks:
                ctx.release(b)

    @property
    def buffer(self) -> GpuBuffer:
        return self.chunks[0]

    def chunk_ranges(self, rows: int) -> list[tuple[int, int, GpuBuffer]]:
        """[(first_row, n_rows, buffer)] for a tensor of `rows` rows in this storage."""
        return [(i * self.chunk_rows, min(self.chunk_rows, rows - i * self.chunk_rows), b)
                for i, b in enumerate(self.chunks)]


def allocate(ctx: WgpuContext, shape: tuple[int, ...], itemsize: int) -> WgpuStorage:
    """Storage for a contiguous tensor; chunked along axis 0 when over the binding limit."""
    nbytes = max(4, math.prod(shape) * itemsize)
    limit = ctx.max_binding_bytes
    if nbytes <= limit:
        return WgpuStorage(ctx, [ctx.alloc(nbytes)], shape[0] if shape else 1)
    row_bytes = math.prod(shape[1:]) * itemsize if len(shape) > 1 else itemsize
    if len(shape) < 2 or row_bytes > limit:
        raise BufferLimitError(
            f"a tensor of shape {shape} ({nbytes:,} bytes) is over the binding limit of {limit:,} bytes "
            "and cannot be split into row chunks (one row is too large, or it has no rows)"
        )
    rows_per = limit // row_bytes
    chunks = []
    for r0 in range(0, shape[0], rows_per):
        chunks.append(ctx.alloc(min(rows_per, shape[0] - r0) * row_bytes))
    return WgpuStorage(ctx, chunks, rows_per)
