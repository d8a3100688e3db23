"""Ops over blocks of rows: how results, scratch and operands larger than one binding are handled.

A WebGPU kernel binds whole buffers, each at most the device's `max_binding_bytes` (128 MiB in
browsers by default). Most ops are row-wise along their first axis: result row r reads row r of
its row operands and all of the others (elementwise ops, norms, softmax, argmax, matmul / linear by
the rows of A, attention by query rows, embedding by ids). `by_rows` runs such an op as it is when
everything fits, and otherwise on blocks of rows:

- the blocks respect the row chunks of its row operands (so each block's slice of an operand lies
  in one buffer, see `storage.WgpuStorage.narrow`) and are small enough that the block's result
  and its scratch (`scratch_row_bytes`: split parts, partial scores) fit one binding, at any limit;
- each block runs the op's planner as usual (a fresh result of one buffer);
- the blocks' results become the result: copied into one buffer when it fits one binding (an
  argmax of chunked logits is one small int32 tensor), else adopted as its row chunks.

A result row over the limit by itself cannot be split this way: BufferLimitError, naming the op.
Launches are recorded as usual, so all of this happens inside graph captures too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ... import dtypes as dt
from ...errors import BufferLimitError
from ...tensor import Tensor
from .storage import WgpuStorage, adopt


def chunked(t: Tensor | None) -> bool:
    return t is not None and len(t._storage.chunks) > 1


def row_breaks(t: Tensor, what: str) -> list[int]:
    """The rows of `t` (along axis 0) where its elements pass into the next row chunk of its
    storage: the blocks between them each lie in one chunk. BufferLimitError when one row of the
    view itself spans two chunks (a transposed view of chunked rows, a row-straddling reshape)."""
    st: WgpuStorage = t._storage
    if len(st.chunks) == 1 or not t.shape or t.size == 0:
        return []
    s0, n = t._strides[0], t.shape[0]
    ext = sum((m - 1) * s for m, s in zip(t.shape[1:], t._strides[1:], strict=True))  # a row's last element
    first = t._offset
    last = first + (n - 1) * s0 + ext
    breaks = []
    for i in range(st.chunk_of(first) + 1, len(st.chunks)):
        b = st.chunk_start(i)  # the chunk's first element
        if b > last:
            break
        r = n if s0 == 0 else min(n, -(-(b - first) // s0))  # the first row starting at or after b
        if first + (r - 1) * s0 + ext >= b:  # row r - 1 runs into chunk i
            raise BufferLimitError(
                f"{what}: the operand of shape {t.shape} is a view of a tensor stored in row chunks (over this "
                f"device's binding limit of {st.ctx.max_binding_bytes:,} bytes) whose rows cross from one chunk "
                "into the next; only views whose rows are rows of the stored tensor can be read by rows")
        breaks.append(r)
    return breaks


def crosses(t: Tensor | None) -> bool:
    """Whether `t` is a view of chunked rows whose own rows cross chunks (row_breaks refuses it)."""
    if not chunked(t):
        return False
    try:
        row_breaks(t, "")  # type: ignore[arg-type]
    except BufferLimitError:
        return True
    return False


def elementwise_any_view(what: str, x: Tensor, out_dtype: dt.DType,
                         write: Callable[[Tensor, Tensor], object]) -> Tensor:
    """An elementwise op (`write(src, dst)`: dst = op(src), both views of one buffer) of a view
    whose rows cross row chunks, such as `x.T` of a chunked x: the result (rows of its own axis 0
    in chunks) is written in blocks that are rows of one result chunk and, along an axis of x that
    the chunks divide cleanly, within one chunk of x."""
    from . import ops as plan

    for ax in range(1, x.ndim):
        perm = [ax, *(d for d in range(x.ndim) if d != ax)]
        if not crosses(x.permute(*perm)):
            cuts_ax = row_breaks(x.permute(*perm), what)
            break
    else:
        row_breaks(x, what)  # (raises: no axis divides x into chunks)
        raise AssertionError("unreachable")
    out = plan.empty(x.device, x.shape, out_dtype)
    cuts_0 = row_breaks(out, what)
    for o0, o1 in zip([0, *cuts_0], [*cuts_0, x.shape[0]], strict=True):
        for a0, a1 in zip([0, *cuts_ax], [*cuts_ax, x.shape[ax]], strict=True):
            index: list[Any] = [slice(o0, o1)] + [slice(None)] * (x.ndim - 1)
            index[ax] = slice(a0, a1)
            write(x[tuple(index)], out[tuple(index)])
    return out


def by_rows(what: str, device: Any, out_shape: tuple[int, ...], dtype: dt.DType,
            run: Callable[[int, int], Tensor], row_inputs: Sequence[Tensor | None] = (),
            scratch_row_bytes: int = 0) -> Tensor:
    """The result (out_shape, dtype) of op `what`, `run(r0, r1)` computing its rows r0..r1 as a
    fresh tensor from rows r0..r1 of `row_inputs` (which it slices itself) and the whole of its
    other operands: in one call when everything fits a binding, else a block of rows at a time."""
    ctx = device.ctx
    limit = ctx.max_binding_bytes
    rows = out_shape[0] if out_shape else 1
    row_bytes = math.prod(out_shape[1:]) * dtype.itemsize if out_shape else dtype.itemsize
    per_row = max(row_bytes, scratch_row_bytes)
    if rows * per_row <= limit and not any(map(chunked, row_inputs)):
        return run(0, rows)
    if not out_shape or rows == 0:
        return run(0, rows)  # (nothing to split: the planner refuses what does not fit)
    if per_row > limit:
        kind = "result" if row_bytes >= scratch_row_bytes else "scratch"
        raise BufferLimitError(
            f"{what}: one row of its {kind} ({per_row:,} bytes; result shape {out_shape} {dtype.name}) is over "
            f"this device's binding limit of {limit:,} bytes, and results are split by rows only")
    cuts = {0, rows}
    for t in row_inputs:
        if chunked(t):
            cuts.update(row_breaks(t, what))  # type: ignore[arg-type]
    step = limit // per_row
    bounds = sorted(cuts)
    blocks = [(r, min(r + step, hi)) for lo, hi in zip(bounds, bounds[1:], strict=False) for r in range(lo, hi, step)]
    parts = [(r0, r1, run(r0, r1)) for r0, r1 in blocks]
    return _assemble(device, out_shape, dtype, parts)


def _assemble(device: Any, out_shape: tuple[int, ...], dtype: dt.DType,
              parts: list[tuple[int, int, Tensor]]) -> Tensor:
    """One tensor from the blocks' results: one buffer when it fits, else their buffers as chunks."""
    from . import ops as plan

    ctx = device.ctx
    nbytes = math.prod(out_shape) * dtype.itemsize
    if len(parts) == 1:
        return parts[0][2]
    if nbytes <= ctx.max_binding_bytes:
        out = plan.empty(device, out_shape, dtype)
        for r0, r1, p in parts:
            plan.unary("copy", p, out=out[r0:r1])
        return out
    buffers, starts = [], []
    for r0, _, p in parts:
        st: WgpuStorage = p._storage
        if st.owner is not None or len(st.chunks) != 1 or p._offset or not p.is_contiguous():
            p = plan.copy(p)  # (a planner returned a view: the block gets a buffer of its own)
            st = p._storage
        buffers.append(st.chunks[0])
        st.chunks = []  # the result's storage owns the buffer from now on
        starts.append(r0)
    storage = adopt(ctx, buffers, starts, out_shape[0], math.prod(out_shape[1:]))
    return Tensor(device, out_shape, dtype, storage=storage)
