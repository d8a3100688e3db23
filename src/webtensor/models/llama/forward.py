"""The Llama family's forward pass, written once over webtensor ops for every path (a prompt, the captured decode
step, a batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids]
    per layer:  h = rms_norm(x);  q, k, v = h @ Wqkv (+ bias);  (Qwen3: q, k = rms_norm per head)
                a = attention over the KV cache (grouped-query) of q, k rotated at the rows' positions
                x = x + a @ Wo;  h = rms_norm(x);  x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) @ lm_head.T   (lm_head: the embedding when tied)

The rms norms run in the products' prologues, the rotary embedding inside the attention step
(`StepBatch.attend`), the gate silu(g) * u of a fused gate_up output in the down product's prologue
(`models.decoder.layers`).
"""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ... import ops
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor
from ..decoder.layers import Attention, GatedMLP, attention_qkv, gated_mlp, rope_per_layer
from .config import LlamaConfig


class LlamaWeights:
    """The weights by role (`params`: by canonical name, fused names where the loader fused) and the rotary tables
    for `n_ctx` positions, on `device`; `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int):
        self.config, self.device = cfg, device
        self.embed = params["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(params.get("lm_head.weight", self.embed))  # x @ head: (C, V)
        self.norm = params["norm.weight"]
        self.rope = rope_per_layer(cfg, params, device, n_ctx)
        n = range(cfg.num_hidden_layers)
        self.attn_norms = [params[f"layers.{i}.input_layernorm.weight"] for i in n]
        self.attns = [Attention.of(params, f"layers.{i}.self_attn.") for i in n]
        self.mlp_norms = [params[f"layers.{i}.post_attention_layernorm.weight"] for i in n]
        self.mlps = [GatedMLP.of(params, f"layers.{i}.mlp.") for i in n]

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
            q, k, v = attention_qkv(x, self.attns[i], heads, (self.attn_norms[i], eps), eps)
            a = batch.attend(kc, vc, q, k, v, cfg.head_dim ** -0.5, rope=self.rope[i])  # (T, H, D)
            x = ops.linear(a.reshape(batch.rows(heads[0] * heads[2])), self.attns[i].o, self.attns[i].o_bias,
                           residual=x)
            x = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), residual=x)
        return batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))
