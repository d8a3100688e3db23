"""GPT-2's forward pass written once over webtensor ops, for every path: the prompt, the decode
step replayed as a graph, a batch of sequences, on the CPU reference and on WebGPU, natively
(`model.GPT2`) and in the page (`web.gpt2_web.WebGPT2`)."""

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
            ids: Tensor, pos: Tensor, slot: Tensor, cache: Any, span: tuple[int, int] | None, last_only: bool,
            lm_head: Tensor | None = None, batch_invariant: bool = True, shared_slots: bool = False,
            head_rows: Tensor | None = None) -> Tensor:
    """Rows of (token ids[t], position pos[t], cache slot slot[t]), int32 (T,) tensors on the
    device -> logits (T, V), or (1, V) for the last row only, or (S, V) for the rows `head_rows`
    (int32 (S,) row indices: the rows that choose a token).

    Each row's keys and values are written into its slot of the caches (`cache.k` / `cache.v`,
    (n_slots, n_ctx, H, D) per layer) at its position. With `span` = (slot, p0) the rows are one
    sequence at positions p0 .. p0 + T - 1 of that slot (a prompt, known on the host): attention
    reads the cache rows 0 .. p0 + T - 1 directly (the flash kernels). Without, every row is its
    own sequence (distinct slots: a decode step, a batch) and attends by its own position, so the
    positions may live on the device and a captured graph of this function serves every step.
    `shared_slots`: rows without a span may share a slot (the tokens of a prompt chunk as rows of a
    server step, beside other sequences' rows): every row's key and value is written before any row
    attends, so a row sees the rows before it in its sequence (otherwise one launch writes and
    attends, which needs distinct slots). The LM head is
    `lm_head` (V, C) where the checkpoint has its own, else wte (tied). wte and the block matrices
    may be q8_0 weights (dtype "int8"): `ops.embedding` and `ops.linear` take them as they are."""
    T, C, H, D, eps = ids.shape[0], cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.layer_norm_epsilon
    # rows of one sequence: (T, C); rows of T sequences: (T, 1, C), so that every product is a stack
    # of one-row products and a row's numbers do not depend on who shares its step (batch invariance:
    # numpy's matmul of a (T, C) operand would take BLAS's matrix-matrix path, summing in another order)
    # (batch_invariant=False: one (T, C) product, faster on the CPU for big batches, rows may differ in the last bits)
    rows = (T, 1, C) if span is None and batch_invariant else (T, C)
    x = ops.add(ops.embedding(wte, ids), ops.embedding(wpe, pos)).reshape(rows)
    for layer, (kc, vc, (ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b)) in \
            enumerate(zip(cache.k, cache.v, blocks, strict=True)):
        qkv = ops.linear(x, attn_w, attn_b, ln=(ln1_w, ln1_b, eps)).reshape(T, 3, H, D)  # (T, 3C) per head
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        scale = cfg.attn_scale(layer)
        if span is not None:
            ops.cache_write(kc, k, pos, slot)
            ops.cache_write(vc, v, pos, slot)
            s, S = span[0], span[1] + T
            a = ops.attention(q, kc[s, :S], vc[s, :S], causal=True, scale=scale)  # (T, H, D)
        elif shared_slots:  # rows of one sequence among the rows: all keys and values first
            ops.cache_write(kc, k, pos, slot)
            ops.cache_write(vc, v, pos, slot)
            a = ops.cached_attention(q, kc, vc, pos, slot, scale=scale)  # (T, H, D)
        else:  # one sequence a row: append and attend in one launch
            a = ops.cached_attention(q, kc, vc, pos, slot, scale=scale, k_new=k, v_new=v)  # (T, H, D)
        x = ops.linear(a.reshape(rows), proj_w, proj_b, residual=x)
        f = ops.linear(x, fc_w, fc_b, act=cfg.act, ln=(ln2_w, ln2_b, eps))  # (T, inner_dim)
        x = ops.linear(f, fc2_w, fc2_b, residual=x)
    x = x.reshape(T, C)
    if last_only:
        x = x[T - 1:T]
    elif head_rows is not None:
        x = ops.embedding(x, head_rows)  # (S, C)
    head = wte if lm_head is None else lm_head  # (V, C)
    head = head.T if isinstance(head, Tensor) else head  # x @ head.T; a q8_0 weight is (N, K) already
    logits = ops.linear(x.reshape(-1, *rows[1:]), head, ln=(*ln_f, eps))
    return logits.reshape(-1, logits.shape[-1])  # (T or 1, V)


class GPT2Weights:
    """GPT-2's weights on a device, by role, and `forward` over them: what every GPT-2 driver holds
    (`model.GPT2` natively, `web.gpt2_web.WebGPT2` in the page) and what `webtensor.generation`
    needs of a model (`Decodable`). `params` by HF name (wte, wpe, lm_head, ln_f, h.{i}.*)."""

    def __init__(self, cfg: Any, params: dict[str, Any], device: Any):
        self.config, self.device = cfg, device
        self.wte, self.wpe = params["wte.weight"], params["wpe.weight"]
        self.lm_head = params.get("lm_head.weight", self.wte)  # (V, C); wte itself when tied
        self.ln_f = (params["ln_f.weight"], params["ln_f.bias"])
        self.blocks = [Block(*(params[f"h.{i}.{n}"] for n in BLOCK_PARAMS)) for i in range(cfg.n_layer)]
        self.use_graph = True  # replay the captured decode step (False: op by op, for comparison)

    @property
    def n_ctx(self) -> int:
        return self.config.n_positions

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def new_cache(self, n_slots: int = 1) -> Any:
        """A KV cache (`generation.KVCache`) of `n_slots` sequences of the full context."""
        from ...generation import KVCache

        cfg = self.config
        return KVCache(cfg.n_layer, n_slots, cfg.n_positions, cfg.n_head, cfg.head_dim, self.device)

    def forward(self, ids: Tensor, pos: Tensor, slot: Tensor, cache: Any, span: tuple[int, int] | None,
                last_only: bool, batch_invariant: bool = True, shared_slots: bool = False,
                head_rows: Tensor | None = None) -> Tensor:
        """`forward` (above) over these weights: rows of (token, position, slot) int32 tensors ->
        logits (T, V), or (1, V) with `last_only`, or (S, V) for `head_rows`."""
        return forward(self.config, self.wte, self.wpe, self.ln_f, self.blocks, ids, pos, slot, cache, span,
                       last_only, lm_head=self.lm_head, batch_invariant=batch_invariant, shared_slots=shared_slots,
                       head_rows=head_rows)
