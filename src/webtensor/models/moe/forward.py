"""The mixture-of-experts family's forward pass, written once over webtensor ops for every path (a prompt chunk,
the captured decode step, a batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids]
    per layer:  attention as Llama's (QK-norm per head for Qwen3-MoE, over the projection for OLMoE)
                h = rms_norm(x)
                sparse layer: weights, ids = top-k of softmax(h @ Wrouter) (renormalized per config)
                              x = x + sum_j weights[j] * down[ids[j]](silu(gate[ids[j]](h)) * up[ids[j]](h))
                dense layer:  x = x + down(silu(gate(h)) * up(h))
    logits = rms_norm(x) @ lm_head.T

The routing runs on the device (`ops.moe_route`): a step's graph reads no router output back. Each row goes
through its own k experts only (`ops.expert_linear`, llama.cpp's MUL_MAT_ID): one-row products in a decode
step, so a row's numbers are the same alone or in a batch; grouped by expert in a prompt chunk (each expert's
weights read once for its rows); the k outputs are summed by their weights as a (1, k) @ (k, C) product
per row.
"""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ... import ops
from ...errors import CheckpointError
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor
from ..decoder.layers import Attention, GatedMLP, attention_qkv, gated_mlp, rope_per_layer
from .config import MoEConfig
from .names import PROJECTIONS


class Experts:
    """One sparse layer's router (C -> E) and its stacks (E x N, K) of gate, up and down matrices."""

    def __init__(self, cfg: MoEConfig, params: dict[str, Any], layer: int):
        pre = f"layers.{layer}.mlp."
        self.router = params[pre + "gate.weight"]
        stacks = [params.get(pre + f"experts.{p}_proj.weight") for p in PROJECTIONS]
        if any(s is None for s in stacks):  # (the loader stacks parts stored alike: one stack per projection)
            raise CheckpointError(f"layer {layer}: the experts' matrices are stored in different types; webtensor "
                                  "stacks each projection's experts into one matrix and needs them alike")
        self.gate, self.up, self.down = stacks


def moe_mlp(x: Tensor, w: Experts, cfg: MoEConfig, norm: tuple[Tensor, float], batch: StepBatch) -> Tensor:
    """x + the experts' weighted sum of the rows x (T, ..., C) RMS-normed by `norm`, shaped as the step's rows;
    the expert products one-row products where the step's are, else grouped by expert (prompt chunks)."""
    T, C, E, k = x.shape[0], cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok
    h = ops.rms_norm(x, *norm).reshape(T, 1, C)
    logits = ops.linear(h, w.router)  # (T, 1, E): one-row products
    weights, ids = ops.moe_route(logits.reshape(T, E), k, cfg.norm_topk_prob)  # (T, k) each
    one = batch.one_row_products
    act = ops.swiglu(ops.expert_linear(h, w.gate, ids, E, one), ops.expert_linear(h, w.up, ids, E, one))  # (T, k, F)
    out = ops.expert_linear(act, w.down, ids, E, one)  # (T, k, C)
    mixed = ops.matmul(weights.reshape(T, 1, k), out)  # (T, 1, C)
    return ops.add(x, mixed.reshape(batch.rows(C)))


class MoEWeights:
    """The weights by role (`params`: by canonical name, fused and stacked names where the loader made them) and
    the rotary tables for `n_ctx` positions, on `device`; `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: MoEConfig, params: dict[str, Any], device: Any, n_ctx: int):
        self.config, self.device = cfg, device
        self.embed = params["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(params.get("lm_head.weight", self.embed))  # x @ head: (C, V)
        self.norm = params["norm.weight"]
        self.rope = rope_per_layer(cfg, params, device, n_ctx)
        n = range(cfg.num_hidden_layers)
        self.attn_norms = [params[f"layers.{i}.input_layernorm.weight"] for i in n]
        self.attns = [Attention.of(params, f"layers.{i}.self_attn.") for i in n]
        self.mlp_norms = [params[f"layers.{i}.post_attention_layernorm.weight"] for i in n]
        self.mlps: list[Experts | GatedMLP] = [
            Experts(cfg, params, i) if cfg.sparse[i] else GatedMLP.of(params, f"layers.{i}.mlp.") for i in n]

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
            mlp = self.mlps[i]
            if isinstance(mlp, Experts):
                x = moe_mlp(x, mlp, cfg, (self.mlp_norms[i], eps), batch)
            else:
                x = gated_mlp(x, mlp, (self.mlp_norms[i], eps), residual=x)
        return batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))
