"""GPT-2's forward pass written once over webtensor ops, for every path: the prompt, the decode step replayed as
a graph, a batched server step, on the CPU reference and on WebGPU, natively and in the page."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ... import ops
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor

# one transformer block's parameters, in this order (HF names under h.{i}.)
BLOCK_PARAMS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias")


@dataclass
class Block:
    """One transformer block's parameters (matrices as (K, N) views, HF Conv1D layout: x @ W)."""

    ln1_w: Tensor
    ln1_b: Tensor
    attn_w: Tensor  # (C, 3C)
    attn_b: Tensor
    proj_w: Tensor  # (C, C)
    proj_b: Tensor
    ln2_w: Tensor
    ln2_b: Tensor
    fc_w: Tensor  # (C, 4C)
    fc_b: Tensor
    fc2_w: Tensor  # (4C, C)
    fc2_b: Tensor

    def __iter__(self) -> Iterator[Tensor]:  # in BLOCK_PARAMS order, as forward() unpacks it
        return iter(vars(self).values())


def forward(cfg: Any, wte: Any, wpe: Tensor, ln_f: tuple[Tensor, Tensor], blocks: Sequence[Any],
            lm_head: Any, batch: StepBatch, cache: KVCache) -> Tensor:
    """The rows of `batch` (token, position, cache slot) -> logits (rows needing them, V). Each row's key and value
    go into its slot of the caches (`cache.k` / `cache.v`, (n_slots, n_ctx, H, D) per layer) at its position;
    `batch` says how attention reads them and which rows need logits (`runtime.batch.StepBatch`). The LM head is
    `lm_head` (x @ lm_head: a (C, V) view, or a quantized (V, C) weight). wte and the block matrices may be
    quantized weights: `ops.embedding` and `ops.linear` take them as they are."""
    T, C, H, D, eps = batch.T, cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    rows = batch.rows(C)
    x = ops.add(ops.embedding(wte, batch.ids), ops.embedding(wpe, batch.pos)).reshape(rows)
    for layer, (kc, vc, (ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b)) in \
            enumerate(zip(cache.k, cache.v, blocks, strict=True)):
        qkv = ops.linear(x, attn_w, attn_b, ln=(ln1_w, ln1_b, eps)).reshape(T, 3, H, D)  # (T, 3C) per head
        a = batch.attend(kc, vc, qkv[:, 0], qkv[:, 1], qkv[:, 2], cfg.attn_scale(layer))  # (T, H, D)
        x = ops.linear(a.reshape(rows), proj_w, proj_b, residual=x)
        f = ops.linear(x, fc_w, fc_b, act=cfg.act, ln=(ln2_w, ln2_b, eps))  # (T, inner_dim)
        x = ops.linear(f, fc2_w, fc2_b, residual=x)
    return batch.logits(ops.linear(batch.head_input(x), lm_head, ln=(*ln_f, eps)))


class GPT2Weights:
    """GPT-2's weights on a device, by role, and `forward` over them. `params` by HF name (wte, wpe, lm_head, ln_f,
    h.{i}.*) as the loader hands them (float matrices as (K, N) views, quantized ones as (N, K))."""

    def __init__(self, cfg: Any, params: dict[str, Any], device: Any, n_ctx: int | None = None):
        self.config, self.device = cfg, device
        self.wte, self.wpe = params["wte.weight"], params["wpe.weight"]
        self.lm_head = params.get("lm_head.weight", self.wte)  # (V, C); wte itself when tied
        self.ln_f = (params["ln_f.weight"], params["ln_f.bias"])
        self.blocks = [Block(*(params[f"h.{i}.{n}"] for n in BLOCK_PARAMS)) for i in range(cfg.n_layer)]

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        return forward(self.config, self.wte, self.wpe, self.ln_f, self.blocks, lm_head_weight(self.lm_head), batch,
                       cache)
