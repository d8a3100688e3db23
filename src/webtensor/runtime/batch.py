"""`StepBatch`: one forward's rows, described once by the caller and read by the family's forward.

A forward runs rows of (token id, position, cache slot), each in a device tensor, so that one captured graph
of the forward serves every step of its shape. How attention reads the KV cache and which rows need logits
depend on what the rows are — a prompt chunk of one sequence, decode tokens of many sequences, a server step's
rows — and that is said here, once, instead of as flags in every forward:

- `store` (int32 (T,)): the rows are a chunk of one sequence's prompt, at consecutive positions of one slot
  (`runtime.runner`'s prompt graphs). Row t's key and value go to position store[t] of its slot (the end of the
  block table for padding rows: not stored) before any row attends; attention is `ops.chunk_attention` (the
  rows share key tiles, reading the cached prefix and each other), the products matrix-matrix products over
  the T rows.
- no store: every row is its own sequence (a decode token), attending by its own (slot, position); each row
  stores its key and value and attends in one launch.
- `invariant` (no store): each row's products are one-row products (activations held as (T, 1, C)), so a row's
  numbers do not depend on which rows share its step (batch invariance); False: one (T, C) matrix product,
  faster for big batches, rows may differ in the last bits from a lone row.
- `head_rows` (int32 (S,) tensor of row indices): the LM head runs on those rows only (none: every row).
- `table`: the KV cache's block table (int32 (n_seqs, max_blocks): a row's slot is its sequence's row of it,
  docs/design-kv.md); None: the caches are contiguous (slot s is block s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import ops
from ..tensor import Tensor


@dataclass
class StepBatch:
    ids: Tensor  # int32 (T,)
    pos: Tensor  # int32 (T,): the rows' positions (rotary and position embeddings, attention)
    slot: Tensor  # int32 (T,)
    store: Tensor | None = None  # int32 (T,): a prompt chunk's rows, stored at these positions first
    head_rows: Tensor | None = None  # int32 (S,)
    invariant: bool = True
    table: Tensor | None = None  # int32 (n_seqs, max_blocks)

    @property
    def T(self) -> int:
        return self.ids.shape[0]

    def rows(self, width: int) -> tuple[int, ...]:
        """The activations' shape for rows of `width` values: (T, 1, width) for one-row products, else (T, width)."""
        return (self.T, 1, width) if self.store is None and self.invariant else (self.T, width)

    def attend(self, k_cache: Tensor, v_cache: Tensor, q: Tensor, k: Tensor, v: Tensor, scale: float,
               rope: ops.Rope | None = None) -> Tensor:
        """Store the rows' keys and values in one layer's cache (a pool of blocks through `table`, or a contiguous
        (n_slots, n_ctx, KVH, D) cache) and attend: q (T, H, D), k and v (T, KVH, D) -> (T, H, D) float32. rope =
        (cos, sin, interleaved): q and k rotated at the rows' positions first (`ops.rope`), inside the store and
        the attention where the step's kernels take it (the decode step: one launch for the rotation, the store and
        the attention), else (a prompt chunk) a rope of q and a store of k that rotates it. Every row attends to
        the keys and values as the cache stores them (rounded to its type)."""
        t = self.table
        if self.store is not None:
            if rope is not None:
                q = ops.rope(q, self.pos, *rope)
            ops.cache_write(k_cache, k, self.store, self.slot, rope=rope, table=t)
            ops.cache_write(v_cache, v, self.store, self.slot, table=t)
            return ops.chunk_attention(q, k_cache, v_cache, self.pos, self.slot, scale=scale, table=t)
        return ops.cached_attention(q, k_cache, v_cache, self.pos, self.slot, scale=scale, k_new=k, v_new=v,
                                    rope=rope, table=t)

    def head_input(self, x: Tensor) -> Tensor:
        """The rows of x (T, ..., C) that need logits, shaped as this batch holds activations: (S, 1, C) or (S, C)."""
        C = x.shape[-1]
        x = x.reshape(self.T, C)
        if self.head_rows is not None:
            x = ops.embedding(x, self.head_rows)  # (S, C): a gather of rows
        return x.reshape(-1, *self.rows(C)[1:])

    @staticmethod
    def logits(out: Tensor) -> Tensor:
        """The LM head's output as (rows, V)."""
        return out.reshape(-1, out.shape[-1])


def lm_head_weight(table: Any) -> Any:
    """The LM head's weight for `ops.linear` from an embedding table (V, C): a float table's (C, V) view; a
    quantized one as it is (quantized weights are (N, K) already)."""
    return table.T if isinstance(table, Tensor) else table
