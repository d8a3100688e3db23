"""WgpuBackend: `backends.base.Backend` on a WgpuContext, each op one of the planners in `ops.py`,
plus memory, dispatch scopes and graphs (launches captured once, replayed with no Python work
per dispatch).

Each row-wise op says here what its rows are (`rows.by_rows`: the result's first axis, the operands
sliced with it, the scratch a row needs), so that results and operands over the binding limit run a
block of rows at a time; the planners themselves see operands and results of one buffer each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import dtypes as dt
from ...dtypes import DType
from ...tensor import Tensor
from . import ops as plan
from .context import Graph, WgpuContext
from .rows import by_rows, crosses, elementwise_any_view


def _aligned(t: Tensor, shape: tuple[int, ...]) -> bool:
    """Whether operand `t` of a broadcasting op with result `shape` runs along the result's rows."""
    return bool(shape) and t.ndim == len(shape) and t.shape[0] == shape[0] != 1


def _rows_of(t: Tensor | None, r0: int, r1: int) -> Any:
    return None if t is None else t[r0:r1]


def _dtype(arr: Any) -> DType:
    from ...dtypes import as_dtype

    return as_dtype(arr.dtype)


class WgpuGraph:
    """A captured function: `replay(times)` enqueues its launches again (joining the enclosing
    dispatch scope, else submitting) and returns the function's outputs, rewritten in place."""

    def __init__(self, graph: Graph, outputs: Any):
        self.graph, self.outputs = graph, outputs

    @property
    def n_dispatches(self) -> int:
        return self.graph.n_dispatches

    @property
    def names(self) -> list[str]:
        return self.graph.names

    def replay(self, times: int = 1) -> Any:
        self.graph.replay(times)
        return self.outputs

    def release(self) -> None:
        self.graph.release()
        self.outputs = None


class WgpuBackend:
    name = "wgpu"
    kmajor_weights = True  # matrices stored (N, K): a GEMV reads rows
    widens_f16 = False  # float16 weights are read as float16 by the kernels (half the bytes a step)
    host_memory = False

    def __init__(self, ctx: WgpuContext):
        self.ctx = ctx

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, device: Any, shape: tuple[int, ...], dtype: DType) -> Tensor:
        return plan.empty(device, shape, dtype)

    def zeros(self, device: Any, shape: tuple[int, ...], dtype: DType) -> Tensor:
        return plan.zeros(device, shape, dtype)

    def from_bytes(self, device: Any, shape: tuple[int, ...], dtype: DType, data: memoryview) -> Tensor:
        return plan.from_bytes(device, shape, dtype, data)

    def from_numpy(self, device: Any, arr: Any, owned: bool, done: Callable[[int, int], None] | None = None
                   ) -> Tensor:
        return plan.from_bytes(device, arr.shape, _dtype(arr), memoryview(arr.reshape(-1)).cast("B"), done)

    def to_bytes(self, t: Tensor) -> bytes:
        return plan.to_bytes(t)

    def to_numpy(self, t: Tensor) -> Any:
        return plan.to_numpy(t)

    def upload_into(self, t: Tensor, data: bytes) -> None:
        plan.upload_into(t, data)

    def read_async(self, t: Tensor) -> Any:
        return plan.read_async(t)

    # -- ops (each a block of rows at a time where its operands or result exceed a binding) -------
    def binary(self, op: str, a: Tensor, b: Tensor, shape: tuple[int, ...], out_dtype: DType) -> Tensor:
        ra, rb = _aligned(a, shape), _aligned(b, shape)

        def run(r0: int, r1: int) -> Tensor:
            if not shape:
                return plan.binary(op, a, b, shape, out_dtype)
            return plan.binary(op, a[r0:r1] if ra else a, b[r0:r1] if rb else b, (r1 - r0, *shape[1:]), out_dtype)

        return by_rows(op, a.device, shape, out_dtype, run, [a if ra else None, b if rb else None])

    def _by_rows(self, what: str, x: Tensor, out_dtype: DType, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if not x.shape:
            return fn(x)
        return by_rows(what, x.device, x.shape, out_dtype, lambda r0, r1: fn(x[r0:r1]), [x])

    def _elementwise(self, op: str, x: Tensor, out_dtype: DType) -> Tensor:
        if crosses(x):  # e.g. x.T of a chunked x: blocks along the axis its chunks divide
            return elementwise_any_view(op, x, out_dtype, lambda src, dst: plan.unary(op, src, out=dst))
        return self._by_rows(op, x, out_dtype, lambda t: plan.unary(op, t, out_dtype))

    def gelu(self, x: Tensor) -> Tensor:
        return self._elementwise("gelu", x, x.dtype)

    def swiglu(self, gate: Tensor, up: Tensor, out_dtype: DType) -> Tensor:
        return self.binary("swiglu", gate, up, gate.shape, out_dtype)

    def cast(self, x: Tensor, dtype: DType) -> Tensor:
        return self._elementwise("copy", x, dtype)

    def copy(self, x: Tensor) -> Tensor:
        return self._elementwise("copy", x, x.dtype)

    def copy_into(self, dst: Tensor, src: Tensor) -> None:
        plan.copy_into(dst, src)

    def layer_norm(self, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        return self._by_rows("layer_norm", x, x.dtype, lambda t: plan.layer_norm(t, w, b, eps))

    def rms_norm(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        return self._by_rows("rms_norm", x, x.dtype, lambda t: plan.rms_norm(t, w, eps))

    def rope(self, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        # x (T, H, D), pos (T,): row t of the result is row t of x at position pos[t]
        return by_rows("rope", x.device, x.shape, x.dtype,
                       lambda r0, r1: plan.rope(x[r0:r1], pos[r0:r1], cos, sin, interleaved), [x, pos])

    def softmax(self, x: Tensor) -> Tensor:
        return self._by_rows("softmax", x, x.dtype, plan.softmax)

    def argmax(self, x: Tensor) -> Tensor:
        if x.ndim < 2:
            return plan.argmax(x)
        per_row = x.size // max(x.shape[0], 1) // max(x.shape[-1], 1)  # argmax rows in one row of x
        return by_rows("argmax", x.device, x.shape[:-1], dt.int32, lambda r0, r1: plan.argmax(x[r0:r1]), [x],
                       scratch_row_bytes=per_row * plan.argmax_scratch_bytes(self.ctx, x.shape[-1]))

    def token_mask(self, x: Tensor, bits: Tensor) -> Tensor:
        return plan.token_mask(x, bits)

    def matmul(self, a: Tensor, b: Tensor, out_dtype: DType) -> Tensor:
        # a (..., M, K) @ b (K, N) or (..., K, N): rows of the result are a's first axis (M when 2-d)
        batched = b.ndim > 2
        shape = (*a.shape[:-1], b.shape[-1])
        return by_rows("matmul", a.device, shape, out_dtype,
                       lambda r0, r1: plan.matmul(a[r0:r1], b[r0:r1] if batched else b, out_dtype),
                       [a, b if batched else None])

    def linear(self, x: Tensor, w: Tensor, bias: Tensor | None, act: str | None, residual: Tensor | None,
               ln: tuple[Tensor, Tensor, float] | None, out_dtype: DType,
               rms: tuple[Tensor, float] | None = None, glu: str | None = None) -> Tensor:
        # x: (..., K) (glu: (..., 2K)) as rows (M, K) -> (..., N)
        N = w.shape[1]

        def run(x: Tensor, residual: Tensor | None) -> Tensor:
            x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
            res = None if residual is None else residual.reshape(x2.shape[:-1] + (N,))
            out = plan.matmul(x2, w, out_dtype, bias=bias, act=act, residual=res, ln=ln, rms=rms, glu=glu is not None)
            return out.reshape((*x.shape[:-1], N))

        if x.ndim == 1:
            return run(x, residual)
        return by_rows("linear", x.device, (*x.shape[:-1], N), out_dtype,
                       lambda r0, r1: run(x[r0:r1], _rows_of(residual, r0, r1)), [x, residual])

    def quant_linear(self, x: Tensor, w: Any, bias: Tensor | None, act: str | None, residual: Tensor | None,
                     ln: tuple[Tensor, Tensor, float] | None, rms: tuple[Tensor, float] | None = None,
                     glu: str | None = None) -> Tensor:
        from . import quant_ops

        if x.ndim == 1:
            return quant_ops.quant_linear(x, w, bias, act, residual, ln, rms, glu)
        return by_rows("linear", x.device, (*x.shape[:-1], w.shape[0]), dt.float32,
                       lambda r0, r1: quant_ops.quant_linear(x[r0:r1], w, bias, act, _rows_of(residual, r0, r1),
                                                             ln, rms, glu),
                       [x, residual])

    def quant_embedding(self, table: Any, ids: Tensor) -> Tensor:
        from . import quant_ops

        if ids.ndim == 0:
            return quant_ops.quant_embedding(table, ids)
        return by_rows("embedding", ids.device, (*ids.shape, table.shape[1]), dt.float32,
                       lambda r0, r1: quant_ops.quant_embedding(table, ids[r0:r1]), [ids])

    def attention(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        T, S = q.shape[0], k.shape[0]

        def run(r0: int, r1: int) -> Tensor:
            # causal: query rows r0..r1 are positions S - T + r0.. and see keys 0 .. S - T + r1
            kv = slice(0, S - T + r1 if causal else S)
            return plan.attention(q[r0:r1], k[kv], v[kv], causal, scale)

        return by_rows("attention", q.device, q.shape, q.dtype, run, [q])

    def embedding(self, table: Tensor, ids: Tensor) -> Tensor:
        if ids.ndim == 0:
            return plan.embedding(table, ids)
        return by_rows("embedding", table.device, (*ids.shape, table.shape[1]), table.dtype,
                       lambda r0, r1: plan.embedding(table, ids[r0:r1]), [ids])

    def cache_write(self, cache: Tensor, src: Tensor, pos: Tensor, slot: Tensor,
                    rope: tuple[Tensor, Tensor, bool] | None = None, table: Tensor | None = None) -> None:
        plan.cache_write(cache, src, pos, slot, rope, table)

    def cached_attention(self, q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, slot: Tensor, scale: float,
                         k_new: Tensor | None = None, v_new: Tensor | None = None,
                         rope: tuple[Tensor, Tensor, bool] | None = None, table: Tensor | None = None) -> Tensor:
        def run(r0: int, r1: int) -> Tensor:
            return plan.cached_attention(q[r0:r1], kc, vc, pos[r0:r1], slot[r0:r1], scale,
                                         _rows_of(k_new, r0, r1), _rows_of(v_new, r0, r1), rope, table)

        return by_rows("cached_attention", q.device, q.shape, dt.float32, run, [q, pos, slot, k_new, v_new])

    def cache_gather(self, cache: Tensor, slot: int, n: int, head_dim: int, table: Tensor | None = None) -> Tensor:
        return plan.cache_gather(cache, slot, n, head_dim, table)

    def chunk_attention(self, q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, slot: Tensor, scale: float,
                        table: Tensor | None = None) -> Tensor:
        def run(r0: int, r1: int) -> Tensor:
            return plan.chunk_attention(q[r0:r1], kc, vc, pos[r0:r1], slot[r0:r1], scale, table)

        return by_rows("chunk_attention", q.device, q.shape, dt.float32, run, [q, pos, slot])

    def advance_tokens(self, new: Tensor, ids: Tensor, pos: Tensor, tokens: Tensor, count: Tensor) -> None:
        plan.advance_tokens(new, ids, pos, tokens, count)

    # -- execution ------------------------------------------------------------------------------
    def scope(self) -> Any:
        return self.ctx.scope()

    def capture(self, fn: Any) -> WgpuGraph:
        with self.ctx.capture() as g:
            outputs = fn()
        return WgpuGraph(g, outputs)

    def synchronize(self) -> None:
        plan.synchronize(self.ctx)

    def stats(self) -> dict[str, int]:
        return self.ctx.stats()

    def describe(self) -> str:
        i = self.ctx.info
        return f"WebGPU: {i.name} ({i.backend}; shader runtime checks {'on' if self.ctx.shader_checks else 'off'})"

    def max_binding_bytes(self) -> int:
        return self.ctx.max_binding_bytes

    def has_f16(self) -> bool:
        return self.ctx.has_f16

    def memory_bytes(self) -> int | None:
        return self.ctx.api.memory_bytes()

    def has_subgroups(self) -> bool:
        return self.ctx.has_subgroups

    def same_as(self, other: Any) -> bool:
        return isinstance(other, WgpuBackend) and other.ctx is self.ctx

    def empty_cache(self) -> None:
        self.ctx.empty_cache()

    def release(self) -> None:
        self.ctx.release_device()
