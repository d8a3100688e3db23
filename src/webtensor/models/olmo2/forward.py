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

from ... import dtypes as dt
from ... import ops
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor
from ..decoder.layers import Attention, GatedMLP, attention_qkv, gated_mlp, rope_per_layer
from .config import Olmo2Config


class Olmo2Weights:
    """The weights by role (`params`: by canonical name, fused names where the loader fused) and the rotary tables
    for `n_ctx` positions, on `device`; `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: Olmo2Config, params: dict[str, Any], device: Any, n_ctx: int):
        self.config, self.device = cfg, device
        self.embed = params["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(params.get("lm_head.weight", self.embed))  # x @ head: (C, V)
        self.norm = params["norm.weight"]
        self.rope = rope_per_layer(cfg, params, device, n_ctx)
        n = range(cfg.num_hidden_layers)
        self.attns = [Attention.of(params, f"layers.{i}.self_attn.") for i in n]
        self.attn_post = [params[f"layers.{i}.post_attention_layernorm.weight"] for i in n]
        self.mlps = [GatedMLP.of(params, f"layers.{i}.mlp.") for i in n]
        self.mlp_post = [params[f"layers.{i}.post_feedforward_layernorm.weight"] for i in n]

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg = self.config
        C, eps = cfg.hidden_size, cfg.rms_norm_eps
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        x = ops.embedding(self.embed, batch.ids)  # (T, C)
        if x.dtype is not dt.float32:
            x = ops.cast(x, dt.float32)  # the residual stream stays float32
        x = x.reshape(batch.rows(C))
        for i, (kc, vc) in enumerate(zip(cache.k, cache.v, strict=True)):
            attn = self.attns[i]
            q, k, v = attention_qkv(x, attn, heads, None, eps)
            a = batch.attend(kc, vc, q, k, v, cfg.head_dim ** -0.5, rope=self.rope[i])  # (T, H, D)
            o = ops.linear(a.reshape(batch.rows(heads[0] * heads[2])), attn.o, attn.o_bias)
            x = ops.add(x, ops.rms_norm(o, self.attn_post[i], eps))
            x = ops.add(x, ops.rms_norm(gated_mlp(x, self.mlps[i], None), self.mlp_post[i], eps))
        return batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))
