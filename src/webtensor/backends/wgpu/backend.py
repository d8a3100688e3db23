"""WgpuBackend: `backends.base.Backend` on a WgpuContext, each op one of the planners in `ops.py`,
plus memory, dispatch scopes and graphs (launches captured once, replayed with no Python work
per dispatch)."""

from __future__ import annotations

from typing import Any

from ...dtypes import DType
from ...tensor import Tensor
from . import ops as plan
from .context import Graph, WgpuContext


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

    def from_numpy(self, device: Any, arr: Any, owned: bool) -> Tensor:
        return plan.from_bytes(device, arr.shape, _dtype(arr), memoryview(arr.reshape(-1)).cast("B"))

    def to_bytes(self, t: Tensor) -> bytes:
        return plan.to_bytes(t)

    def to_numpy(self, t: Tensor) -> Any:
        return plan.to_numpy(t)

    def upload_into(self, t: Tensor, data: bytes) -> None:
        plan.upload_into(t, data)

    def read_async(self, t: Tensor) -> Any:
        return plan.read_async(t)

    # -- ops ------------------------------------------------------------------------------------
    def binary(self, op: str, a: Tensor, b: Tensor, shape: tuple[int, ...], out_dtype: DType) -> Tensor:
        return plan.binary(op, a, b, shape, out_dtype)

    def gelu(self, x: Tensor) -> Tensor:
        return plan.unary("gelu", x)

    def swiglu(self, gate: Tensor, up: Tensor, out_dtype: DType) -> Tensor:
        return plan.binary("swiglu", gate, up, gate.shape, out_dtype)

    def cast(self, x: Tensor, dtype: DType) -> Tensor:
        return plan.copy(x, dtype)

    def copy(self, x: Tensor) -> Tensor:
        return plan.copy(x)

    def copy_into(self, dst: Tensor, src: Tensor) -> None:
        plan.copy_into(dst, src)

    def layer_norm(self, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
        return plan.layer_norm(x, w, b, eps)

    def rms_norm(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        return plan.rms_norm(x, w, eps)

    def rope(self, x: Tensor, pos: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
        return plan.rope(x, pos, cos, sin, interleaved)

    def softmax(self, x: Tensor) -> Tensor:
        return plan.softmax(x)

    def argmax(self, x: Tensor) -> Tensor:
        return plan.argmax(x)

    def token_mask(self, x: Tensor, bits: Tensor) -> Tensor:
        return plan.token_mask(x, bits)

    def matmul(self, a: Tensor, b: Tensor, out_dtype: DType) -> Tensor:
        return plan.matmul(a, b, out_dtype)

    def linear(self, x: Tensor, w: Tensor, bias: Tensor | None, act: str | None, residual: Tensor | None,
               ln: tuple[Tensor, Tensor, float] | None, out_dtype: DType,
               rms: tuple[Tensor, float] | None = None) -> Tensor:
        # x: (..., K) as rows (M, K) -> (..., N)
        N = w.shape[1]
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        res = None if residual is None else residual.reshape(x2.shape[:-1] + (N,))
        out = plan.matmul(x2, w, out_dtype, bias=bias, act=act, residual=res, ln=ln, rms=rms)
        return out.reshape((*x.shape[:-1], N))

    def q8_linear(self, x: Tensor, w: Any, bias: Tensor | None, act: str | None, residual: Tensor | None,
                  ln: tuple[Tensor, Tensor, float] | None, rms: tuple[Tensor, float] | None = None) -> Tensor:
        from . import q8_ops

        return q8_ops.q8_linear(x, w, bias, act, residual, ln, rms)

    def q8_embedding(self, table: Any, ids: Tensor) -> Tensor:
        from . import q8_ops

        return q8_ops.q8_embedding(table, ids)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        return plan.attention(q, k, v, causal, scale)

    def embedding(self, table: Tensor, ids: Tensor) -> Tensor:
        return plan.embedding(table, ids)

    def cache_write(self, cache: Tensor, src: Tensor, pos: Tensor, slot: Tensor) -> None:
        plan.cache_write(cache, src, pos, slot)

    def cached_attention(self, q: Tensor, kc: Tensor, vc: Tensor, pos: Tensor, slot: Tensor, scale: float,
                         k_new: Tensor | None = None, v_new: Tensor | None = None) -> Tensor:
        return plan.cached_attention(q, kc, vc, pos, slot, scale, k_new, v_new)

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
        return f"WebGPU: {i.name} ({i.backend})"

    def max_binding_bytes(self) -> int:
        return self.ctx.max_binding_bytes

    def has_f16(self) -> bool:
        return self.ctx.has_f16

    def has_subgroups(self) -> bool:
        return self.ctx.has_subgroups

    def same_as(self, other: Any) -> bool:
        return isinstance(other, WgpuBackend) and other.ctx is self.ctx

    def empty_cache(self) -> None:
        self.ctx.empty_cache()

    def release(self) -> None:
        self.ctx.release_device()
