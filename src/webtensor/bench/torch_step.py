"""A hand-written GPT-2 in torch, the second anchor of `webtensor bench --compare`: what plain
torch reaches with a static KV cache and, on CUDA, the decode step replayed as a CUDA graph.

It runs on the weights of a Hugging Face `GPT2LMHeadModel` (the very tensors, not copies: same
device, same dtype). Its state lives in device tensors, so one captured step serves every position:

- `k`, `v`: the static KV cache, (n_layer, B, H, n_ctx, D) each;
- `history`: (B, n_ctx + 1) token ids, the prompt and every chosen token;
- `pos`: (1,) the position of the token the next step reads from `history`.

`prefill(ids)` runs the prompt (causal SDPA over it), fills the cache and history and picks the
first token. `step()` embeds `history[:, pos]`, appends its k and v at `pos`, attends over the
cache's first `span` positions masked to those <= pos, picks the next token by argmax on the device
into `history[:, pos + 1]` and increments `pos`: nothing is read back until `tokens()`. On CUDA
the step is captured once with `torch.cuda.CUDAGraph` (after a warm-up on a side stream, as
torch's documentation asks) and each `step()` is one replay; on the CPU it runs eagerly.

Not modelled: `reorder_and_upcast_attn` (HF's float32 attention for float16 models). This module
imports torch: import it only where torch is wanted (the bench does so lazily)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UsageError
from ..models.gpt2.config import ACTIVATIONS

# webtensor's activation names (models/gpt2/config.ACTIVATIONS) with a one-kernel torch form
_FAST_ACT: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": F.gelu, "relu": F.relu, "silu": F.silu,
    None: lambda x: x,
}


class TorchGPT2Step:
    """GPT-2 decoding with a static KV cache (see the module docstring).

    `hf`: a `transformers.GPT2LMHeadModel` in eval mode, on CPU or CUDA, float32 or float16
    (float16 only on CUDA). `span`: the cache positions a decode step attends over (1..n_ctx,
    default n_ctx); decoding stops with an error before a step would pass it. `batch`: rows
    decoding together (every row has the same prompt length). `graph`: capture the step as a CUDA
    graph (default: on CUDA)."""

    @torch.inference_mode()
    def __init__(self, hf: Any, span: int | None = None, batch: int = 1, graph: bool | None = None) -> None:
        cfg, tr = hf.config, hf.transformer
        self.device, self.dtype = tr.wte.weight.device, tr.wte.weight.dtype
        if self.dtype not in (torch.float32, torch.float16):
            raise UsageError(f"torch step: dtype {self.dtype} is not supported (float32 or float16)")
        if self.dtype == torch.float16 and self.device.type != "cuda":
            raise UsageError("torch step: float16 runs only on CUDA; use float32 on the CPU")
        self.n_ctx, self.n_layer, self.n_head = cfg.n_positions, cfg.n_layer, cfg.n_head
        self.n_embd, self.head_dim = cfg.n_embd, cfg.n_embd // cfg.n_head
        self.span = self.n_ctx if span is None else span
        if not 1 <= self.span <= self.n_ctx:
            raise UsageError(f"torch step: span {self.span} must be in 1..{self.n_ctx} (the context)")
        if batch < 1:
            raise UsageError(f"torch step: batch {batch} must be >= 1")
        self.batch, self.eps = batch, cfg.layer_norm_epsilon
        self.wte, self.wpe = tr.wte.weight, tr.wpe.weight  # (V, C), (n_ctx, C)
        self.ln_f = (tr.ln_f.weight, tr.ln_f.bias)
        self.lm_head = hf.lm_head.weight  # (V, C): wte itself when tied
        # per layer: ln_1 w, b; c_attn W (C, 3C), b; c_proj W (C, C), b; ln_2 w, b; c_fc W (C, I), b; proj W (I, C), b
        self.blocks = [(b.ln_1.weight, b.ln_1.bias, b.attn.c_attn.weight, b.attn.c_attn.bias, b.attn.c_proj.weight,
                        b.attn.c_proj.bias, b.ln_2.weight, b.ln_2.bias, b.mlp.c_fc.weight, b.mlp.c_fc.bias,
                        b.mlp.c_proj.weight, b.mlp.c_proj.bias) for b in tr.h]
        act = ACTIVATIONS.get(cfg.activation_function, "hf")
        self.acts = [_FAST_ACT.get(act, b.mlp.act) for b in tr.h]  # HF's own module where torch has no one-call form
        base = self.head_dim ** -0.5 if cfg.scale_attn_weights else 1.0
        self.scales = [base / (i + 1) if cfg.scale_attn_by_inverse_layer_idx else base for i in range(self.n_layer)]

        B, H, D, dev = batch, self.n_head, self.head_dim, self.device
        self.k = torch.zeros(self.n_layer, B, H, self.n_ctx, D, dtype=self.dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.history = torch.zeros(B, self.n_ctx + 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self._keys = torch.arange(self.span, device=dev)  # (span,) key positions
        self._host_pos = 0  # the same position, on the host: guards the span without a readback
        self.logits: torch.Tensor | None = None  # (B, V) of the last prefill or step
        self.graph: Any = None
        if graph is None:
            graph = self.device.type == "cuda"
        if graph:
            self._capture()

    # ---- the model ----

    def _block(self, i: int, x: torch.Tensor, attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        """One transformer block on rows x (N, C); `attend(i, q, k, v)` gets (B, H, T, D) each."""
        ln1w, ln1b, wa, ba, wp, bp, ln2w, ln2b, wf, bf, wo, bo = self.blocks[i]
        B, H, D = self.batch, self.n_head, self.head_dim
        h = F.layer_norm(x, (self.n_embd,), ln1w, ln1b, self.eps)
        qkv = torch.addmm(ba, h, wa).view(B, -1, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
        y = attend(i, qkv[0], qkv[1], qkv[2])  # (B, H, T, D)
        x = torch.addmm(bp, y.transpose(1, 2).reshape(x.shape), wp).add_(x)
        h = F.layer_norm(x, (self.n_embd,), ln2w, ln2b, self.eps)
        return torch.addmm(bo, self.acts[i](torch.addmm(bf, h, wf)), wo).add_(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) of the rows x (B, C)."""
        return F.linear(F.layer_norm(x, (self.n_embd,), *self.ln_f, self.eps), self.lm_head)

    def _attend_prompt(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.shape[2]
        self.k[i, :, :, :T] = k
        self.v[i, :, :, :T] = v
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scales[i])

    def _step(self) -> torch.Tensor:
        """One decode step on the device state; returns the logits (B, V). Capturable: no host reads."""
        tok = self.history.index_select(1, self.pos)  # (B, 1)
        x = F.embedding(tok[:, 0], self.wte) + self.wpe.index_select(0, self.pos)  # (B, C)
        mask = (self._keys <= self.pos).view(1, 1, 1, self.span)  # keys at positions <= pos

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[i].index_copy_(2, self.pos, k)  # (B, H, 1, D) at pos
            self.v[i].index_copy_(2, self.pos, v)
            kc, vc = self.k[i, :, :, : self.span], self.v[i, :, :, : self.span]  # (B, H, span, D)
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=self.scales[i])

        for i in range(self.n_layer):
            x = self._block(i, x, attend)
        logits = self._head(x)
        self.history.index_copy_(1, self.pos + 1, logits.argmax(-1, keepdim=True))
        self.pos.add_(1)
        return logits

    def _capture(self) -> None:
        """Capture `_step` as a CUDA graph. The warm-up steps run on a side stream at positions
        0..2 and leave junk there; `prefill` rewrites all of it."""
        self.pos.zero_()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._graph_logits = self._step()

    # ---- the API ----

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int] | Sequence[Sequence[int]]) -> None:
        """Run the prompt (T ids, or B rows of T ids), fill the cache and pick the first new token."""
        rows = [list(ids)] if ids and isinstance(ids[0], int) else [list(r) for r in ids]  # type: ignore[arg-type]
        T = len(rows[0])
        if len(rows) != self.batch or any(len(r) != T for r in rows):
            raise UsageError(f"torch step: the prompt must be {self.batch} row(s) of one length")
        if not 1 <= T <= self.n_ctx - 1:
            raise UsageError(f"torch step: a prompt of {T} tokens does not fit the context of {self.n_ctx}")
        x_ids = torch.tensor(rows, dtype=torch.long, device=self.device)  # (B, T)
        self.history[:, :T] = x_ids
        x = (F.embedding(x_ids, self.wte) + self.wpe[:T]).view(self.batch * T, self.n_embd)  # (B*T, C)
        for i in range(self.n_layer):
            x = self._block(i, x, self._attend_prompt)
        self.logits = self._head(x.view(self.batch, T, self.n_embd)[:, -1])  # (B, V)
        self.history[:, T] = self.logits.argmax(-1)
        self.pos.fill_(T)
        self._host_pos = T

    @torch.inference_mode()
    def step(self) -> None:
        """One decode step: reads the last token, appends the next to `history`; no readback."""
        if self._host_pos >= min(self.span, self.n_ctx - 1):
            raise UsageError(f"torch step: position {self._host_pos} is past the span of {self.span} positions")
        if self.graph is not None:
            self.graph.replay()
            self.logits = self._graph_logits
        else:
            self.logits = self._step()
        self._host_pos += 1

    def tokens(self, start: int, stop: int | None = None) -> list[list[int]]:
        """history[:, start:stop] as lists (one readback; `stop` defaults to the current end)."""
        end = self._host_pos + 1 if stop is None else stop
        return self.history[:, start:end].tolist()

    def generate(self, ids: Sequence[int], n: int) -> list[int]:
        """Greedy: n new tokens after the prompt `ids` (batch 1)."""
        self.prefill(ids)
        for _ in range(n - 1):
            self.step()
        return self.tokens(len(ids))[0]
