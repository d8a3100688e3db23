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
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor, tensor
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
        cfg = self.config
        C, eps = cfg.hidden_size, cfg.rms_norm_eps
        heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        x = ops.embedding(self.embed, batch.ids)  # (T, C)
        if x.dtype is not dt.float32:
            x = ops.cast(x, dt.float32)  # the residual stream stays float32
        if self.embed_scale is not None:
            x = ops.mul(x, self.embed_scale)
        x = x.reshape(batch.rows(C))
        plain = self.residual_scale is None  # (the residual added in the products' epilogue)
        for i, (kc, vc) in enumerate(zip(cache.k, cache.v, strict=True)):
            q, k, v = attention_qkv(x, self.attns[i], heads, (self.attn_norms[i], eps), eps)
            a = batch.attend(kc, vc, q, k, v, cfg.attention_scale, rope=self.rope[i], window=cfg.window(i))
            o = ops.linear(a.reshape(batch.rows(heads[0] * heads[2])), self.attns[i].o, self.attns[i].o_bias,
                           residual=x if plain else None)  # (T, ..., C)
            x = o if plain else self._residual(x, o)
            h = gated_mlp(x, self.mlps[i], (self.mlp_norms[i], eps), residual=x if plain else None)
            x = h if plain else self._residual(x, h)
        logits = batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))
        return logits if self.logits_scale is None else ops.div(logits, self.logits_scale)
