"""GPT-2's decode step on WebGPU as a prebuilt command list: 5 dispatches a layer plus 3, built
once per workspace and replayed for every token (the WebGPU counterpart of a CUDA graph).

Everything a step needs lives on the GPU: the current position and token in a small state buffer,
the KV cache, the activations. So the replay needs no parameters, no bind-group lookups and no
uploads; greedy decoding keeps the argmax on the GPU too, and several steps go into one submit
while the tokens of the previous submit are read back (double buffering):

    per layer:  ln_1 + qkv GEMV  ->  attention (appends k, v at pos)  ->  proj GEMV + residual
                ln_2 + fc GEMV + GELU  ->  fc2 GEMV + residual
    then:       ln_f + LM-head GEMV over wte rows  ->  argmax -> (token, pos + 1)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ... import dtypes as dt
from ...backends.wgpu.context import GpuBuffer, WgpuContext
from ...backends.wgpu.ops import epilogue_bits, gemv_kernel, gemv_lanes

if TYPE_CHECKING:
    from .model import GPT2, KVCache


def supported(model: GPT2) -> bool:
    """The graph needs head dims that are multiples of 4 (everything moves as vec4) and at most 256,
    and a context whose attention scores fit in workgroup memory (16 KiB, WebGPU's default)."""
    cfg = model.config
    return (model.device.kind == "wgpu" and cfg.head_dim % 4 == 0 and cfg.head_dim <= 256
            and cfg.n_positions * 4 + 6 * 1024 <= 16384)


class DecodeGraph:
    def __init__(self, model: GPT2, cache: KVCache, max_tokens: int):
        dev = model.device
        ctx: WgpuContext = dev.ctx
        cfg = model.config
        self.ctx, self.cache = ctx, cache  # (no reference to the model: no cycle, prompt frees)
        C, V = cfg.n_embd, cfg.vocab_size
        self.vocab_size = V
        f32 = 4
        self.state = ctx.alloc(16)  # [pos, token, n_out, -]
        self.x = ctx.alloc(C * f32)
        self.qkv = ctx.alloc(3 * C * f32)
        self.att = ctx.alloc(C * f32)
        self.h = ctx.alloc(cfg.inner_dim * f32)
        self.logits = ctx.alloc(V * f32)
        self.xn = ctx.alloc(C * f32)  # layer-norm output, where the GEMV cannot fuse it
        self.tokens = ctx.alloc(max(1, max_tokens) * 4)
        self.max_tokens = max_tokens
        self._owned = [self.state, self.xn, self.x, self.qkv, self.att, self.h, self.logits, self.tokens]
        plan: list[tuple[Any, tuple, list[GpuBuffer], tuple[int, int, int]]] = []
        wte, wpe = model.wte, model.wpe
        emb = ctx.kernel("decode_embed", 4, {"TT": wte.dtype.wgsl, "TP": wpe.dtype.wgsl})
        for r0, rows, buf in wte._storage.chunk_ranges(V):
            plan.append((emb, (C, r0, rows), [self.state, buf, wpe._storage.buffer, self.x],
                         (math.ceil(C / 256), 1, 1)))
        attn = ctx.kernel("decode_attention", 5, {"MAX_CTX": str(cfg.n_positions)})
        eps = cfg.layer_norm_epsilon
        for layer, b in enumerate(model.blocks):
            plan += self._gemv(b.attn_w, self.x, self.qkv, bias=b.attn_b, ln=(b.ln1_w, b.ln1_b), eps=eps)
            plan.append((attn, (cfg.n_head, cfg.head_dim // 4, C // 4, cfg.attn_scale(layer)),
                         [self.state, self.qkv, cache.k[layer]._storage.buffer, cache.v[layer]._storage.buffer,
                          self.att], (cfg.n_head, 1, 1)))
            plan += self._gemv(b.proj_w, self.att, self.x, bias=b.proj_b, residual=True)
            plan += self._gemv(b.fc_w, self.x, self.h, bias=b.fc_b, ln=(b.ln2_w, b.ln2_b), eps=eps, act=cfg.act)
            plan += self._gemv(b.fc2_w, self.h, self.x, bias=b.fc2_b, residual=True)
        plan += self._gemv(model.lm_head.T, self.x, self.logits, ln=model.ln_f, eps=eps)  # (wte when tied)
        parts = 64
        self.part = ctx.alloc(parts * 8)
        self._owned.append(self.part)
        for stage, groups in ((1, parts), (2, 1)):
            k = ctx.kernel("decode_argmax", 4, {"STAGE": f"{stage}u", "PARTS": f"{parts}u"})
            plan.append((k, (V,), [self.state, self.logits, self.tokens, self.part], (groups, 1, 1)))

        self.names = [_short(k.name) for k, _, _, _ in plan]
        self.uniform, offsets = ctx.param_block([p for _, p, _, _ in plan])
        cmds = [ctx.prebuilt(k, self.uniform, off, bufs, groups)
                for (k, _, bufs, groups), off in zip(plan, offsets, strict=True)]
        self.step_cmds, self.argmax_cmds = cmds[:-2], cmds[-2:]

    def _gemv(self, w: Any, a: GpuBuffer, out: GpuBuffer, *, bias: Any = None, ln: Any = None, eps: float = 0.0,
              act: str | None = None, residual: bool = False) -> list[tuple]:
        """out = epilogue(LN?(a) @ w): one GEMV per row chunk of the k-major (N, K) storage.
        w is the model's (K, N) view of that storage."""
        K, N = w.shape
        return [e for n0, n, buf in w._storage.chunk_ranges(N)
                for e in self._gemv_rows(buf, w.dtype, K, n0, n, a, out, bias=bias, ln=ln, eps=eps, act=act,
                                         residual=residual)]

    def _gemv_rows(self, wbuf: GpuBuffer, wdtype: Any, K: int, n0: int, n: int, a: GpuBuffer, out: GpuBuffer, *,
                   bias: Any = None, ln: Any = None, eps: float = 0.0, act: str | None = None,
                   residual: bool = False) -> list[tuple]:
        ctx = self.ctx
        f32 = dt.float32
        fused_ln = ln is not None and gemv_lanes(ctx, K, True) > 1
        entries = []
        if ln is not None and not fused_ln:  # CPU-backed adapters: a separate layer norm, no barriers in the GEMV
            lnk = ctx.kernel("layer_norm", 4, {"TX": "f32", "TW": "f32", "TO": "f32"})
            entries.append((lnk, (1, K, 0, K, 0, float(eps), 0, 0),
                            [a, ln[0]._storage.buffer, ln[1]._storage.buffer, self.xn], (1, 1, 1)))
            a = self.xn
        k, rows = gemv_kernel(ctx, f32, wdtype, f32, bias.dtype if bias is not None else f32, K, fused_ln)
        epi = epilogue_bits(bias is not None, act, residual)
        bias_buf = bias._storage.buffer if bias is not None else out
        lnw, lnb = (ln[0]._storage.buffer, ln[1]._storage.buffer) if fused_ln else (out, out)
        x, y, _ = _grid_xy(math.ceil(n / rows), ctx)
        params = (1, n, K // 4, 0, 0, 0, 0, n0, 0, epi, n0, n0, 0, float(eps))  # (see gemv.wgsl's P)
        entries.append((k, params, [a, wbuf, out, bias_buf, out, lnw, lnb], (x, y, 1)))
        return entries

    def release(self) -> None:
        for b in self._owned:
            self.ctx.release(b)
        if self._owned and not self.ctx.released:
            self.ctx.api.destroy_buffer(self.uniform)
        self._owned = []

    def __del__(self) -> None:
        if getattr(self, "_owned", None):
            self.release()

    # -- running --------------------------------------------------------------------------------
    def set_state(self, pos: int, token: int) -> None:
        self.ctx.upload(self.state, struct.pack("<4I", pos, token, 0, 0))

    def greedy(self, pos: int, token: int, n: int, batch: int = 16) -> Iterator[int]:
        """Yield the next `n` greedy tokens after `token` at position `pos`. Submits grow from 1
        to `batch` steps; submit k+1 is encoded and queued before submit k's tokens are read."""
        ctx = self.ctx
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens exceed this graph's output ring of {self.max_tokens}")
        self.set_state(pos, token)
        step = [*self.step_cmds, *self.argmax_cmds]
        queued, inflight, size = 0, [], 1
        try:
            while queued < n or inflight:
                if queued < n:
                    k = min(size, n - queued)
                    ctx.enqueue(step * k, "gpt2-decode")
                    inflight.append((ctx.read_async(self.tokens, queued * 4, k * 4), k))
                    queued += k
                    size = min(batch, size * 2)
                if len(inflight) >= 2 or queued >= n:
                    ticket, k = inflight.pop(0)
                    data = ticket.wait()
                    yield from struct.unpack(f"<{k}I", bytes(data))
        finally:
            for ticket, _ in inflight:  # an early stop (EOS, close) still returns the staging buffers
                ticket.wait()

    def logits_after(self, pos: int, token: int) -> memoryview:
        """One step without the argmax; the logits (V float32) come back for sampling."""
        self.set_state(pos, token)
        self.ctx.enqueue(self.step_cmds, "gpt2-decode")
        return self.ctx.read_async(self.logits, 0, self.vocab_size * 4).wait()


def _short(kernel_name: str) -> str:
    base = kernel_name.split("-")[0]
    return base + ("+ln" if base == "gemv" and "-true" in kernel_name else "")


def _grid_xy(n: int, ctx: WgpuContext) -> tuple[int, int, int]:
    if n <= ctx.max_workgroups:
        return (n, 1, 1)
    y = math.ceil(n / ctx.max_workgroups)
    return (math.ceil(n / y), y, 1)
