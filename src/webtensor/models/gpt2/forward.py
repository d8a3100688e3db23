"""GPT-2's forward pass written once over webtensor ops, for every driver: the numpy model
(`model.GPT2`, CPU and WebGPU) and the browser's numpy-free one (`web.gpt2_web.WebGPT2`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ... import ops
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


def forward(cfg: Any, wte: Tensor, wpe: Tensor, ln_f: tuple[Tensor, Tensor], blocks: Sequence[Sequence[Tensor]],
            ids: Tensor, k_cache: Sequence[Tensor], v_cache: Sequence[Tensor], p0: int, last_only: bool,
            lm_head: Tensor | None = None) -> Tensor:
    """Tokens `ids` (T,) at positions p0.. -> logits (T, V), or (1, V) for the last position only.
    Their keys and values are written into rows p0.. of the caches, (n_positions, H, D) per layer.
    The LM head is `lm_head` (V, C) where the checkpoint has its own, else wte (tied)."""
    T, C, H, D, eps = ids.shape[0], cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    S = p0 + T
    x = ops.add(ops.embedding(wte, ids), wpe[p0:S])  # (T, C)
    for layer, (kc, vc, (ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b)) in \
            enumerate(zip(k_cache, v_cache, blocks, strict=True)):
        h = ops.layer_norm(x, ln1_w, ln1_b, eps)
        qkv = ops.linear(h, attn_w, attn_b).reshape(T, 3, H, D)  # (T, 3C) viewed per head
        ops.copy_into(kc[p0:S], qkv[:, 1])
        ops.copy_into(vc[p0:S], qkv[:, 2])
        a = ops.attention(qkv[:, 0], kc[:S], vc[:S], causal=True, scale=cfg.attn_scale(layer))  # (T, H, D)
        x = ops.linear(a.reshape(T, C), proj_w, proj_b, residual=x)
        h = ops.layer_norm(x, ln2_w, ln2_b, eps)
        f = ops.linear(h, fc_w, fc_b, act=cfg.act)  # (T, inner_dim)
        x = ops.linear(f, fc2_w, fc2_b, residual=x)
    if last_only:
        x = x[T - 1:T]
    x = ops.layer_norm(x, *ln_f, eps)
    return ops.linear(x, (wte if lm_head is None else lm_head).T)  # (T or 1, V)
