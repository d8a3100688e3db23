"""The mixture-of-experts ops on WebGPU: `moe_route` (a router row's top-k experts and weights, on the device:
no readback inside a step) and `expert_linear` (each row through its own experts, llama.cpp's MUL_MAT_ID)
over a float or quantized stack of expert matrices (E x N, K), one launch per row chunk of the stack, so a
stack over the binding limit is read where it lies. Kernels: moe_route.wgsl, expert_gemv.wgsl (float
weights), expert_gemv_quant.wgsl (ggml block types, dequantized in registers by quant_dequant.wgsl)."""

from __future__ import annotations

import math
from typing import Any

from ... import dtypes as dt
from ...errors import BufferLimitError
from ...tensor import Tensor
from . import ops as gops
from .quant_ops import gemv_lanes, on_device, scale_words

WG = 64  # threads a workgroup of moe_route.wgsl: router rows


def moe_route(logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """logits (T, E) -> (weights float32 (T, k), ids int32 (T, k)): one thread a row."""
    ctx = gops._ctx(logits)
    x, rows, E, ld = gops._rows(logits)
    w = gops._out(logits.device, (rows, k), dt.float32)
    ids = gops._out(logits.device, (rows, k), dt.int32)
    if rows:
        ctx.launch(ctx.kernel("moe_route", {"TX": x.dtype.wgsl}),
                   dict(rows=rows, E=E, k=k, norm=int(normalize), x_off=x._offset, x_ld=ld),
                   dict(x=gops._buf(x), ids=gops._buf(ids), w=gops._buf(w)), gops._grid(math.ceil(rows / WG), ctx))
    return w, ids


def _float_chunks(w: Tensor) -> list[tuple[int, int, Any, int]]:
    """[(first row, rows, buffer, element offset in it)] of a float stack (E x N, K): its one buffer, or each
    row chunk of a whole tensor over the binding limit."""
    w = w.contiguous()
    st = w._storage
    rows = w.shape[0]
    if len(st.chunks) == 1:
        return [(0, rows, gops._buf(w), w._offset)]
    if w._offset or not st.holds_whole(rows, w.shape[1]):
        raise BufferLimitError(f"expert_linear: a float expert stack {w.shape} over the binding limit must be a "
                               "whole tensor (its row chunks are launched one by one), not a view into one")
    return [(r0, n, buf, 0) for r0, n, buf in st.chunk_ranges(rows)]


def expert_linear(x: Tensor, experts: Any, ids: Tensor, E: int) -> Tensor:
    """x (T, X, K) through experts[ids[t, j]] of the stack (E x N, K) -> float32 (T, k, N): one launch per row
    chunk of the stack, workgroups (256 / LANES outputs, slot), LANES threads an output (the GEMV's rule:
    1 on CPU adapters)."""
    ctx = gops._ctx(x)
    T, k = ids.shape
    rows, K = experts.shape
    N, X = rows // E, x.shape[1]
    out = gops._out(x.device, (T, k, N), dt.float32)
    slots = T * k
    if slots == 0 or N == 0:
        return out
    ids = ids.contiguous()
    y, z = gops._rows_grid(slots)
    if not isinstance(experts, Tensor):  # a quantized stack
        w = on_device(x.device, experts, "expert_linear")
        x = (x if x.dtype is dt.float32 else gops.unary("copy", x, dt.float32)).contiguous()
        lanes = gemv_lanes(ctx, K)
        grid = (math.ceil(N / (256 // lanes)), y, z)
        kern = ctx.kernel("expert_gemv_quant", {w.qtype: "true", "LANES": f"{lanes}u"})
        for r0, n, qbuf, sbuf in w.chunks():
            ctx.launch(kern, dict(slots=slots, k=k, X=X, E=E, N=N, K=K, row0=r0, rows=n, x_off=x._offset,
                                  ids_off=ids._offset, d_ld=scale_words(w.qtype, K)),
                       dict(x=gops._buf(x), qs=qbuf, scales=sbuf, ids=gops._buf(ids), o=gops._buf(out)), grid)
        return out
    x = x.contiguous()
    lanes = gops.gemv_lanes(ctx, K)
    grid = (math.ceil(N / (256 // lanes)), y, z)
    kern = ctx.kernel("expert_gemv", {"TX": x.dtype.wgsl, "TW": experts.dtype.wgsl, "LANES": f"{lanes}u"})
    for r0, n, buf, off in _float_chunks(experts):
        ctx.launch(kern, dict(slots=slots, k=k, X=X, E=E, N=N, K=K, row0=r0, rows=n, x_off=x._offset,
                              ids_off=ids._offset, w_off=off),
                   dict(x=gops._buf(x), w=buf, ids=gops._buf(ids), o=gops._buf(out)), grid)
    return out
