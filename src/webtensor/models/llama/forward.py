"""The Llama family's forward pass, written once over webtensor ops for every path (a prompt, the captured decode
step, a batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids]                                            (Granite: times embedding_multiplier)
    per layer:  h = rms_norm(x);  q, k, v = h @ Wqkv (+ bias);  (Qwen3: q, k = rms_norm per head)
                a = attention over the KV cache (grouped-query; the layer's sliding window where it has one)
                    of q, k rotated at the rows' positions
                x = x + a @ Wo;  h = rms_norm(x);  x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
                                                              (Granite: each addend times residual_multiplier)
    logits = rms_norm(x) @ lm_head.T   (lm_head: the embedding when tied; Granite: divided by logits_scaling)

The rms norms run in the products' prologues, the rotary embedding inside the attention step
(`StepBatch.attend`), the gate silu(g) * u of a fused gate_up output in the down product's prologue
(`models.decoder.layers`).
"""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ... import ops
from ...runtime.batch import StepBatch
from ...runtime.cache import KVCache
from ...tensor import Tensor, tensor
from ..decoder.layers import DecoderWeights, GatedMLP, embed_rows, final_logits, gated_mlp, self_attention
from .config import LlamaConfig


class LlamaWeights(DecoderWeights):
    """The weights by role (`DecoderWeights`'s, and each layer's pre-norms and gated MLP, Granite's multipliers);
    `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int):
        super().__init__(cfg, params, device, n_ctx)
        self.config, L = cfg, cfg.num_hidden_layers
        self.attn_norms = self.per_layer(params, L, "input_layernorm")
        self.mlp_norms = self.per_layer(params, L, "post_attention_layernorm")
        self.mlps = [GatedMLP.of(params, f"layers.{i}.mlp.") for i in range(L)]

        def scalar(v: float) -> Tensor | None:  # (uploaded once: a step graph reads it as any other weight)
            return None if v == 1.0 else tensor(v, device=device, dtype=dt.float32)
        self.embed_scale = scalar(cfg.embedding_multiplier)
        self.residual_scale = scalar(cfg.residual_multiplier)
        self.logits_scale = scalar(cfg.logits_scaling)

    def _residual(self, x: Tensor, out: Tensor) -> Tensor:
        """x + out, out times the residual multiplier where there is one."""
        return ops.add(x, out if self.residual_scale is None else ops.mul(out, self.residual_scale))

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg, eps, heads = self.config, self.eps, self.heads
        x = embed_rows(self, batch, self.embed_scale)  # (T, ..., C) float32
        plain = self.residual_scale is None  # (the residual added in the products' epilogue)
        for i, kv in enumerate(zip(cache.k, cache.v, strict=True)):
            o = self_attention(x, self.attns[i], batch, kv, heads, (self.attn_norms[i], eps), eps,
                               cfg.attention_scale, self.rope[i], cfg.window(i), residual=x if plain else None)
            x = o if plain else self._residual(x, o)
            h = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), residual=x if plain else None)
            x = h if plain else self._residual(x, h)
        logits = final_logits(x, self, batch)
        return logits if self.logits_scale is None else ops.div(logits, self.logits_scale)
