"""Hand-written torch decoders, the second anchor of `webtensor bench --compare`: what plain torch reaches with
a static KV cache and, on CUDA, the decode step replayed as a CUDA graph. `TorchStep` holds what every one shares
(the state, the capture, the API); `TorchGPT2Step` here and `torch_step_llama.TorchLlamaStep` are the models;
`torch_step_for(hf)` picks the one for a Hugging Face model.

A step runs on the weights of a Hugging Face model (GPT-2's are the very tensors, not copies: same device, same
dtype). Its state lives in device tensors, so one captured step serves every position:

- `k`, `v`: the static KV cache, (n_layer, B, KV heads, n_ctx, D) each;
- `history`: (B, n_ctx + 1) token ids, the prompt and every chosen token;
- `pos`: (1,) the position of the token the next step reads from `history`.

`prefill(ids)` runs the prompt (causal SDPA over it), fills the cache and history and picks the
first token. `step()` embeds `history[:, pos]`, appends its k and v at `pos`, attends over the
cache's first `span` positions masked to those <= pos, picks the next token by argmax on the device
into `history[:, pos + 1]` and increments `pos`: nothing is read back until `tokens()`. On CUDA
the step is captured once with `torch.cuda.CUDAGraph` (after a warm-up on a side stream, as
torch's documentation asks) and each `step()` is one replay; on the CPU it runs eagerly.

Not modelled: `reorder_and_upcast_attn` (HF's float32 attention for float16 GPT-2 models). This module
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
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")  # HF model types `TorchLlamaStep` runs


def has_torch_step(model_type: str) -> bool:
    """Whether a hand-written step exists for an HF `model_type` (none for the mixtures of experts yet)."""
    return model_type == "gpt2" or model_type in LLAMA_TYPES


def torch_step_for(hf: Any, span: int | None = None, batch: int = 1, graph: bool | None = None,
                   n_ctx: int | None = None) -> TorchStep:
    """The hand-written step of a Hugging Face model's architecture (its config's `model_type`)."""
    kind = hf.config.model_type
    if kind == "gpt2":
        return TorchGPT2Step(hf, span, batch, graph, n_ctx)
    if kind in LLAMA_TYPES:
        from .torch_step_llama import TorchLlamaStep

        return TorchLlamaStep(hf, span, batch, graph, n_ctx)
    raise UsageError(f"torch step: no hand-written step for model_type {kind!r}")


class TorchStep:
    """Decoding with a static KV cache (see the module docstring); a subclass sets its weights, then calls `_start`,
    and writes `_prompt` (the prompt's forward) and `_decode` (one step's forward).

    `n_ctx`: the positions the cache holds (default and at most: the model's context). `span`: the cache positions
    a decode step attends over (1..n_ctx, default n_ctx); decoding stops with an error before a step would pass it.
    `batch`: rows decoding together (every row has the same prompt length). `graph`: capture the step as a CUDA
    graph (default: on CUDA)."""

    n_ctx: int
    n_layer: int
    kv_heads: int
    head_dim: int

    @staticmethod
    def _context(trained: int, n_ctx: int | None) -> int:
        if n_ctx is None:
            return trained
        if not 2 <= n_ctx <= trained:
            raise UsageError(f"torch step: n_ctx {n_ctx} must be in 2..{trained} (the model's context)")
        return n_ctx

    def _start(self, weight: torch.Tensor, span: int | None, batch: int, graph: bool | None) -> None:
        self.device, self.dtype = weight.device, weight.dtype
        if self.dtype not in (torch.float32, torch.float16):
            raise UsageError(f"torch step: dtype {self.dtype} is not supported (float32 or float16)")
        if self.dtype == torch.float16 and self.device.type != "cuda":
            raise UsageError("torch step: float16 runs only on CUDA; use float32 on the CPU")
        self.span = self.n_ctx if span is None else span
        if not 1 <= self.span <= self.n_ctx:
            raise UsageError(f"torch step: span {self.span} must be in 1..{self.n_ctx} (the context)")
        if batch < 1:
            raise UsageError(f"torch step: batch {batch} must be >= 1")
        self.batch = batch
        B, dev = batch, self.device
        self.k = torch.zeros(self.n_layer, B, self.kv_heads, self.n_ctx, self.head_dim, dtype=self.dtype, device=dev)
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

    # ---- what a model writes ----

    def _prompt(self, ids: torch.Tensor) -> torch.Tensor:
        """The prompt ids (B, T) through the model, the cache's first T positions filled: the last row's logits
        (B, V)."""
        raise NotImplementedError

    def _decode(self, tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One token a row (B,) at position `self.pos` through the model, its k and v written at pos, attending to
        the cache's first `span` positions where `mask` (1, 1, 1, span) is true: logits (B, V). Capturable."""
        raise NotImplementedError

    def _cached(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's k, v (B, KV, 1, D) written at pos; the cache's first `span` positions (B, KV, span, D) each."""
        self.k[i].index_copy_(2, self.pos, k)
        self.v[i].index_copy_(2, self.pos, v)
        return self.k[i, :, :, : self.span], self.v[i, :, :, : self.span]

    def _fill(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """A prompt's k, v (B, KV, T, D) into layer i's first T positions."""
        T = k.shape[2]
        self.k[i, :, :, :T] = k
        self.v[i, :, :, :T] = v

    # ---- the state ----

    def _step(self) -> torch.Tensor:
        """One decode step on the device state; returns the logits (B, V). Capturable: no host reads."""
        tok = self.history.index_select(1, self.pos)[:, 0]  # (B,)
        mask = (self._keys <= self.pos).view(1, 1, 1, self.span)  # keys at positions <= pos
        logits = self._decode(tok, mask)
        self.history.index_copy_(1, self.pos + 1, logits.argmax(-1, keepdim=True))
        self.pos.add_(1)
        return logits

    def _capture(self) -> None:
        """Capture `_step` as a CUDA graph. The warm-up steps run on a side stream at positions
        0..2 and leave junk there; `prefill` rewrites all of it."""
        self.pos.zero_()
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]  # (torch leaves Stream unannotated)
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
        self.logits = self._prompt(x_ids)  # (B, V)
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


class TorchGPT2Step(TorchStep):
    """GPT-2 (`hf`: a `transformers.GPT2LMHeadModel` in eval mode, on CPU or CUDA, float32 or float16 — float16
    only on CUDA); see `TorchStep` for the rest."""

    @torch.inference_mode()
    def __init__(self, hf: Any, span: int | None = None, batch: int = 1, graph: bool | None = None,
                 n_ctx: int | None = None) -> None:
        cfg, tr = hf.config, hf.transformer
        self.n_ctx, self.n_layer, self.n_head = self._context(cfg.n_positions, n_ctx), cfg.n_layer, cfg.n_head
        self.n_embd, self.head_dim = cfg.n_embd, cfg.n_embd // cfg.n_head
        self.kv_heads, self.eps = cfg.n_head, cfg.layer_norm_epsilon
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
        self._start(self.wte, span, batch, graph)

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

    def _prompt(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self._fill(i, k, v)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scales[i])

        x = (F.embedding(ids, self.wte) + self.wpe[:T]).view(B * T, self.n_embd)  # (B*T, C)
        for i in range(self.n_layer):
            x = self._block(i, x, attend)
        return self._head(x.view(B, T, self.n_embd)[:, -1])

    def _decode(self, tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = F.embedding(tok, self.wte) + self.wpe.index_select(0, self.pos)  # (B, C)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = self._cached(i, k, v)  # (B, H, span, D)
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=self.scales[i])

        for i in range(self.n_layer):
            x = self._block(i, x, attend)
        return self._head(x)
