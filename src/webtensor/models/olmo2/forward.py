"""OLMo-2's forward pass, written once over webtensor ops for every path (a prompt, the captured decode step, a
batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids]
    per layer:  q, k, v = x @ Wqkv;  q, k = rms_norm(q), rms_norm(k) over the whole projection (H x D, KV x D)
                a = attention over the KV cache (grouped-query) of q, k rotated at the rows' positions
                x = x + rms_norm(a @ Wo);  x = x + rms_norm((silu(x @ Wgate) * (x @ Wup)) @ Wdown)
    logits = rms_norm(x) @ lm_head.T

No norm before attention or the MLP: the norms come after each part (post-norms), before the residual add.
"""

from __future__ import annotations

from typing import Any

from ... import ops
from ...runtime.batch import StepBatch
from ...runtime.cache import KVCache
from ...tensor import Tensor
from ..decoder.layers import DecoderWeights, GatedMLP, embed_rows, final_logits, gated_mlp, self_attention
from .config import Olmo2Config


class Olmo2Weights(DecoderWeights):
    """The weights by role (`DecoderWeights`'s, and each layer's post-norms and gated MLP); `forward(batch, cache)`
    runs the model."""

    def __init__(self, cfg: Olmo2Config, params: dict[str, Any], device: Any, n_ctx: int):
        super().__init__(cfg, params, device, n_ctx)
        self.config, L = cfg, cfg.num_hidden_layers
        self.attn_post = self.per_layer(params, L, "post_attention_layernorm")
        self.mlps = [GatedMLP.of(params, f"layers.{i}.mlp.") for i in range(L)]
        self.mlp_post = self.per_layer(params, L, "post_feedforward_layernorm")

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg, eps, heads = self.config, self.eps, self.heads
        x = embed_rows(self, batch)  # (T, ..., C) float32
        for i, kv in enumerate(zip(cache.k, cache.v, strict=True)):
            o = self_attention(x, self.attns[i], batch, kv, heads, None, eps, cfg.head_dim ** -0.5, self.rope[i])
            x = ops.add(x, ops.rms_norm(o, self.attn_post[i], eps))
            x = ops.add(x, ops.rms_norm(gated_mlp(x, self.mlps[i], None), self.mlp_post[i], eps))
        return final_logits(x, self, batch)
