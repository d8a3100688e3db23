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


def _grouped(ctx: Any, slots: int, E: int, invariant: bool) -> bool:
    """Whether a step's slots go through the grouped kernels: not one-row products, enough of them, a GPU (the
    policy's moe_grouped_min_slots), at most 256 experts (moe_align's counters)."""
    lim = ctx.policy.moe_grouped_min_slots
    return not invariant and lim is not None and slots > lim and E <= 256 and ctx.policy.gpu_style


def _align(ctx: Any, ids: Tensor, slots: int, E: int) -> tuple[Any, Any, Any, int]:
    """moe_align.wgsl: (order, block_expert, n_blocks buffers, the most blocks there can be)."""
    bm = ctx.policy.moe_block
    blocks = math.ceil(slots / bm) + E  # (each expert's list padded to whole blocks)
    order, block_expert, n_blocks = ctx.alloc(4 * blocks * bm), ctx.alloc(4 * blocks), ctx.alloc(4)
    ctx.launch(ctx.kernel("moe_align", {"BM": f"{bm}u"}), dict(slots=slots, E=E, ids_off=ids._offset, cap=blocks * bm),
               dict(ids=gops._buf(ids), order=order, block_expert=block_expert, n_blocks=n_blocks), (1, 1, 1))
    return order, block_expert, n_blocks, blocks


def expert_linear(x: Tensor, experts: Any, ids: Tensor, E: int, invariant: bool = True) -> Tensor:
    """x (T, X, K) through experts[ids[t, j]] of the stack (E x N, K) -> float32 (T, k, N): one launch per row
    chunk of the stack. The GEMV: workgroups (256 / LANES outputs, slot), LANES threads an output (the GEMV's
    rule: 1 on CPU adapters). Grouped (`_grouped`): the slots listed by expert in blocks (`_align`), then
    workgroups (32 outputs, block)."""
    ctx = gops._ctx(x)
    T, k = ids.shape
    rows, K = experts.shape
    N, X = rows // E, x.shape[1]
    out = gops._out(x.device, (T, k, N), dt.float32)
    slots = T * k
    if slots == 0 or N == 0:
        return out
    ids = ids.contiguous()
    if _grouped(ctx, slots, E, invariant):
        return _expert_gemm(ctx, x, experts, ids, E, out)
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


def _expert_gemm(ctx: Any, x: Tensor, experts: Any, ids: Tensor, E: int, out: Tensor) -> Tensor:
    """The grouped kernels: moe_align.wgsl, then expert_gemm(_quant).wgsl per row chunk of the stack."""
    T, k = ids.shape
    rows, K = experts.shape
    N, X, slots = rows // E, x.shape[1], T * k
    order, block_expert, n_blocks, blocks = _align(ctx, ids, slots, E)
    grid = (math.ceil(N / 32), blocks, 1)
    common = dict(slots=slots, k=k, X=X, N=N, K=K)
    lists = dict(order=order, block_expert=block_expert, n_blocks=n_blocks, o=gops._buf(out))
    bm = {"BM": f"{ctx.policy.moe_block}u"}
    try:
        if not isinstance(experts, Tensor):
            w = on_device(x.device, experts, "expert_linear")
            x = (x if x.dtype is dt.float32 else gops.unary("copy", x, dt.float32)).contiguous()
            kern = ctx.kernel("expert_gemm_quant", {w.qtype: "true", **bm})
            for r0, n, qbuf, sbuf in w.chunks():
                ctx.launch(kern, dict(common, row0=r0, rows=n, x_off=x._offset, d_ld=scale_words(w.qtype, K)),
                           dict(lists, x=gops._buf(x), qs=qbuf, scales=sbuf), grid)
        else:
            x = x.contiguous()
            kern = ctx.kernel("expert_gemm", {"TX": x.dtype.wgsl, "TW": experts.dtype.wgsl, **bm})
            for r0, n, buf, off in _float_chunks(experts):
                ctx.launch(kern, dict(common, row0=r0, rows=n, x_off=x._offset, w_off=off),
                           dict(lists, x=gops._buf(x), w=buf), grid)
    finally:
        for b in (order, block_expert, n_blocks):
            ctx.release(b)  # (pooled after the submit that reads them)
    return out
