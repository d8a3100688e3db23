"""The Gemma family's forward pass, written once over webtensor ops for every path (a prompt, the captured decode
step, a batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids] * sqrt(C)
    per layer:  h = rms_norm(x);  q, k, v = h @ Wqkv;  (Gemma 3: q, k = rms_norm per head)
                a = attention over the KV cache of q, k rotated at the rows' positions, scaled by
                    query_pre_attn_scalar ** -0.5, soft-capped (Gemma 2), in the layer's sliding window
                    (Gemma 2 / 3's sliding layers; Gemma 3's with their own rope base)
                Gemma:      x = x + a @ Wo;            x = x + mlp(rms_norm(x))
                Gemma 2/3:  x = x + rms_norm(a @ Wo);  x = x + rms_norm(mlp(rms_norm(x)))
                mlp(h) = (gelu_tanh(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) @ embed.T   (Gemma 2: soft-capped)

Every RMS norm multiplies by (1 + w): the weights of a Hugging Face checkpoint get their 1 added once at build
(float32, as transformers adds it), a GGUF file's are stored so. The pre-norms run in the products' prologues,
the rotary embedding inside the attention step, the gate in the down product's prologue
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
from .config import GemmaConfig
from .names import is_norm


class GemmaWeights(DecoderWeights):
    """The weights by role (`DecoderWeights`'s, their norms shifted by 1, and each layer's pre- (and post-) norms
    and gated MLP); `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: GemmaConfig, params: dict[str, Any], device: Any, n_ctx: int):
        shift = tensor(cfg.norm_shift, device=device, dtype=dt.float32) if cfg.norm_shift else None
        p = {k: (ops.add(v, shift) if shift is not None and is_norm(k) else v) for k, v in params.items()}
        super().__init__(cfg, p, device, n_ctx)
        self.config, L = cfg, cfg.num_hidden_layers
        self.embed_scale = tensor(cfg.embed_scale, device=device, dtype=dt.float32)
        self.attn_norms = self.per_layer(p, L, "input_layernorm")
        self.mlps = [GatedMLP.of(p, f"layers.{i}.mlp.") for i in range(L)]
        if cfg.post_norms:
            self.attn_post = self.per_layer(p, L, "post_attention_layernorm")
            self.mlp_norms = self.per_layer(p, L, "pre_feedforward_layernorm")
            self.mlp_post = self.per_layer(p, L, "post_feedforward_layernorm")
        else:
            self.mlp_norms = self.per_layer(p, L, "post_attention_layernorm")

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg, eps, heads = self.config, self.eps, self.heads
        x = embed_rows(self, batch, self.embed_scale)  # (T, ..., C) float32
        post = cfg.post_norms
        for i, kv in enumerate(zip(cache.k, cache.v, strict=True)):
            o = self_attention(x, self.attns[i], batch, kv, heads, (self.attn_norms[i], eps), eps,
                               cfg.attention_scale, self.rope[i], cfg.window(i), cfg.attn_logit_softcapping,
                               residual=None if post else x)  # (T, ..., C)
            if post:
                x = ops.add(x, ops.rms_norm(o, self.attn_post[i], eps))
                h = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), glu="geglu")
                x = ops.add(x, ops.rms_norm(h, self.mlp_post[i], eps))
            else:
                x = gated_mlp(o, self.mlps[i], (self.mlp_norms[i], eps), residual=o, glu="geglu")
        logits = final_logits(x, self, batch)
        cap = cfg.final_logit_softcapping
        return logits if cap is None else ops.softcap(logits, cap)
