"""`KVCache`: per layer, the keys and values of `n_slots` sequences of up to `n_ctx` positions on a device."""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..tensor import empty


class KVCache:
    """k[layer] and v[layer]: (n_slots, n_ctx, n_kv_head, head_dim) float32 each. `length` counts the positions
    written (for single-sequence callers that drive their own loop)."""

    def __init__(self, n_layer: int, n_slots: int, n_ctx: int, n_kv_head: int, head_dim: int, device: Any):
        shape = (n_slots, n_ctx, n_kv_head, head_dim)
        self.k = [empty(shape, dt.float32, device) for _ in range(n_layer)]
        self.v = [empty(shape, dt.float32, device) for _ in range(n_layer)]
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.length = 0

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.k, *self.v))
