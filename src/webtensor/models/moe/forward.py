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

from ... import ops
from ...errors import CheckpointError
from ...runtime.batch import StepBatch
from ...runtime.cache import KVCache
from ...tensor import Tensor
from ..decoder.layers import DecoderWeights, GatedMLP, embed_rows, final_logits, gated_mlp, self_attention
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


class MoEWeights(DecoderWeights):
    """The weights by role (`DecoderWeights`'s, and each layer's pre-norms and its experts or dense MLP; `params`
    with the stacked names the loader made); `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: MoEConfig, params: dict[str, Any], device: Any, n_ctx: int):
        super().__init__(cfg, params, device, n_ctx)
        self.config, L = cfg, cfg.num_hidden_layers
        self.attn_norms = self.per_layer(params, L, "input_layernorm")
        self.mlp_norms = self.per_layer(params, L, "post_attention_layernorm")
        self.mlps: list[Experts | GatedMLP] = [
            Experts(cfg, params, i) if cfg.sparse[i] else GatedMLP.of(params, f"layers.{i}.mlp.") for i in range(L)]

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg, eps, heads = self.config, self.eps, self.heads
        x = embed_rows(self, batch)  # (T, ..., C) float32
        for i, kv in enumerate(zip(cache.k, cache.v, strict=True)):
            x = self_attention(x, self.attns[i], batch, kv, heads, (self.attn_norms[i], eps), eps,
                               cfg.head_dim ** -0.5, self.rope[i], residual=x)
            mlp = self.mlps[i]
            if isinstance(mlp, Experts):
                x = moe_mlp(x, mlp, cfg, (self.mlp_norms[i], eps), batch)
            else:
                x = gated_mlp(x, mlp, (self.mlp_norms[i], eps), residual=x)
        return final_logits(x, self, batch)
