"""The Llama family (Llama 2/3.x, SmolLM2, Mistral without a sliding window, Qwen2/2.5's q/k/v biases, Qwen3's
QK-norm) hand-written in torch for `webtensor bench --compare`: `torch_step.TorchStep`'s static KV cache and CUDA
graph around this forward:

    x = embed[ids]
    per layer:  h = rms_norm(x);  q, k, v = h @ Wqkv (+ b);  (Qwen3: q, k = rms_norm over each head)
                q, k = rope(q, k) with HF's own cos / sin at the rows' positions
                a = SDPA(q, k, v) with grouped-query heads (`enable_gqa`);  x = x + a @ Wo (+ b)
                h = rms_norm(x);  x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) @ lm_head.T

The weights are the HF model's, with q, k, v and gate, up concatenated once into one matrix each (copies: one
product instead of three, as gpt-fast fuses them). The rotary tables are the HF model's `rotary_emb` evaluated
once at every position (every rope scaling is only a table), so the two rotate alike; RMS norms run in float32
as HF's `LlamaRMSNorm` does. This module imports torch."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UsageError
from .torch_step import TorchStep


class TorchLlamaStep(TorchStep):
    """`hf`: a transformers Llama / Mistral / Qwen2 / Qwen3 `...ForCausalLM` in eval mode, on CPU or CUDA, float32
    or float16 (float16 only on CUDA); see `TorchStep` for the rest."""

    @torch.inference_mode()
    def __init__(self, hf: Any, span: int | None = None, batch: int = 1, graph: bool | None = None,
                 n_ctx: int | None = None) -> None:
        cfg, m = hf.config, hf.model
        if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
            raise UsageError(f"torch step: hidden_act {cfg.hidden_act!r} is not SwiGLU's silu")
        if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral"
                                                         and getattr(cfg, "sliding_window", None)):
            raise UsageError("torch step: sliding-window attention is not modelled")
        layer0 = m.layers[0].self_attn
        self.n_layer, self.n_head = cfg.num_hidden_layers, cfg.num_attention_heads
        self.kv_heads, self.head_dim = cfg.num_key_value_heads, layer0.head_dim
        self.n_ctx = self._context(cfg.max_position_embeddings, n_ctx)
        self.n_embd, self.eps = cfg.hidden_size, cfg.rms_norm_eps
        self.scale = layer0.scaling
        self.embed, self.norm, self.lm_head = m.embed_tokens.weight, m.norm.weight, hf.lm_head.weight  # (V, C)...
        self.blocks = [self._weights(layer) for layer in m.layers]
        # cos / sin (n_ctx, D): HF's rotary embedding at positions 0..n_ctx-1, in the model's dtype
        cos, sin = m.rotary_emb(self.embed[:1], torch.arange(self.n_ctx, device=self.embed.device)[None])
        self.cos, self.sin = cos[0], sin[0]
        if self.cos.shape[-1] != self.head_dim:
            raise UsageError(f"torch step: rope over {self.cos.shape[-1]} of {self.head_dim} dims is not modelled")
        self._start(self.embed, span, batch, graph)

    @staticmethod
    def _weights(layer: Any) -> tuple[Any, ...]:
        """(attn norm, Wqkv (Q + 2KV, C), bqkv or None, q_norm, k_norm (None but Qwen3), Wo (C, Q), bo, mlp norm,
        Wgate_up (2F, C), bgate_up, Wdown (C, F), bdown)."""
        a, f = layer.self_attn, layer.mlp

        def cat(*mods: Any, attr: str) -> torch.Tensor | None:
            parts = [getattr(x, attr) for x in mods]
            return None if parts[0] is None else torch.cat(parts).contiguous()

        q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        return (layer.input_layernorm.weight, cat(a.q_proj, a.k_proj, a.v_proj, attr="weight"),
                cat(a.q_proj, a.k_proj, a.v_proj, attr="bias"), None if q_norm is None else q_norm.weight,
                None if k_norm is None else k_norm.weight, a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight, cat(f.gate_proj, f.up_proj, attr="weight"),
                cat(f.gate_proj, f.up_proj, attr="bias"), f.down_proj.weight, f.down_proj.bias)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """HF's LlamaRMSNorm: normalized in float32, rounded to x's dtype, times the weight."""
        return w * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, heads, T, D) turned by cos / sin (T, D) in rotate-half pairs (i, i + D/2), as HF's
        apply_rotary_pos_emb."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _block(self, i: int, x: torch.Tensor, T: int, cos: torch.Tensor, sin: torch.Tensor, attend: Any) -> Any:
        """One decoder layer on rows x (B*T, C); `attend(i, q, k, v)` gets (B, H or KV, T, D) each."""
        ln1, wqkv, bqkv, qn, kn, wo, bo, ln2, wgu, bgu, wd, bd = self.blocks[i]
        B, H, KV, D = self.batch, self.n_head, self.kv_heads, self.head_dim
        qkv = F.linear(self._rms(x, ln1), wqkv, bqkv).view(B, T, H + 2 * KV, D)
        q, k, v = qkv[:, :, :H], qkv[:, :, H:H + KV], qkv[:, :, H + KV:]
        if qn is not None:  # Qwen3: each head of q and k normalized before rope
            q, k = self._rms(q, qn), self._rms(k, kn)
        q = self._rope(q.transpose(1, 2), cos, sin)  # (B, H, T, D)
        k = self._rope(k.transpose(1, 2), cos, sin)  # (B, KV, T, D)
        y = attend(i, q, k, v.transpose(1, 2))  # (B, H, T, D)
        x = F.linear(y.transpose(1, 2).reshape(x.shape[0], H * D), wo, bo).add_(x)
        g, u = F.linear(self._rms(x, ln2), wgu, bgu).chunk(2, dim=-1)
        return F.linear(F.silu(g).mul_(u), wd, bd).add_(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._rms(x, self.norm), self.lm_head)

    def _prompt(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self._fill(i, k, v)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)

        x = F.embedding(ids, self.embed).view(B * T, self.n_embd)  # (B*T, C)
        for i in range(self.n_layer):
            x = self._block(i, x, T, self.cos[:T], self.sin[:T], attend)
        return self._head(x.view(B, T, self.n_embd)[:, -1])

    def _decode(self, tok: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos.index_select(0, self.pos), self.sin.index_select(0, self.pos)  # (1, D)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = self._cached(i, k, v)  # (B, KV, span, D)
            return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, scale=self.scale, enable_gqa=True)

        x = F.embedding(tok, self.embed)  # (B, C)
        for i in range(self.n_layer):
            x = self._block(i, x, 1, cos, sin, attend)
        return self._head(x)
