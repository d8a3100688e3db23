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
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor, tensor
from ..decoder.layers import Attention, GatedMLP, attention_qkv, gated_mlp, rope_per_layer
from .config import GemmaConfig
from .names import is_norm


class GemmaWeights:
    """The weights by role (`params`: by canonical name, fused names where the loader fused) and the rotary tables
    for `n_ctx` positions, on `device`; `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: GemmaConfig, params: dict[str, Any], device: Any, n_ctx: int):
        self.config, self.device = cfg, device
        shift = tensor(cfg.norm_shift, device=device, dtype=dt.float32) if cfg.norm_shift else None
        p = {k: (ops.add(v, shift) if shift is not None and is_norm(k) else v) for k, v in params.items()}
        self.embed = p["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(p.get("lm_head.weight", self.embed))  # x @ head: (C, V)
        self.norm = p["norm.weight"]
        self.embed_scale = tensor(cfg.embed_scale, device=device, dtype=dt.float32)
        self.rope = rope_per_layer(cfg, p, device, n_ctx)
        n = range(cfg.num_hidden_layers)
        self.attn_norms = [p[f"layers.{i}.input_layernorm.weight"] for i in n]
        self.attns = [Attention.of(p, f"layers.{i}.self_attn.") for i in n]
        self.mlps = [GatedMLP.of(p, f"layers.{i}.mlp.") for i in n]
        if cfg.post_norms:
            self.attn_post = [p[f"layers.{i}.post_attention_layernorm.weight"] for i in n]
            self.mlp_norms = [p[f"layers.{i}.pre_feedforward_layernorm.weight"] for i in n]
            self.mlp_post = [p[f"layers.{i}.post_feedforward_layernorm.weight"] for i in n]
        else:
            self.mlp_norms = [p[f"layers.{i}.post_attention_layernorm.weight"] for i in n]

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg = self.config
        C, eps = cfg.hidden_size, cfg.rms_norm_eps
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        x = ops.embedding(self.embed, batch.ids)  # (T, C)
        if x.dtype is not dt.float32:
            x = ops.cast(x, dt.float32)  # the residual stream stays float32
        x = ops.mul(x, self.embed_scale).reshape(batch.rows(C))
        post = cfg.post_norms
        for i, (kc, vc) in enumerate(zip(cache.k, cache.v, strict=True)):
            attn = self.attns[i]
            q, k, v = attention_qkv(x, attn, heads, (self.attn_norms[i], eps), eps)
            a = batch.attend(kc, vc, q, k, v, cfg.attention_scale, rope=self.rope[i], window=cfg.window(i),
                             softcap=cfg.attn_logit_softcapping)  # (T, H, D)
            a = a.reshape(batch.rows(heads[0] * heads[2]))
            if post:
                x = ops.add(x, ops.rms_norm(ops.linear(a, attn.o, attn.o_bias), self.attn_post[i], eps))
                h = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), glu="geglu")
                x = ops.add(x, ops.rms_norm(h, self.mlp_post[i], eps))
            else:
                x = ops.linear(a, attn.o, attn.o_bias, residual=x)
                x = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), residual=x, glu="geglu")
        logits = batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))
        cap = cfg.final_logit_softcapping
        return logits if cap is None else ops.softcap(logits, cap)
