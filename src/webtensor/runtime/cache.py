"""`KVCache`: the paged KV pool of one runner on a device — per layer a key pool and a value pool of blocks of
`block_size` positions, in float32, float16 or q8_0, and the block table (int32, on the device) that says which
blocks hold each sequence's positions (docs/design-kv.md). Which blocks a sequence gets is decided on the host
(`runtime.blocks.BlockManager`); this class holds the device side and uploads the table rows that changed."""

from __future__ import annotations

import struct
from typing import Any

from .. import dtypes as dt
from ..errors import ArgumentError, UsageError
from ..quant.kv import KV_DTYPES, q8_words
from ..tensor import empty, from_buffer
from .blocks import HOLE, held_blocks

BLOCK_SIZE = 16  # positions a block (docs/design-kv.md: why 16)


def kv_position_bytes(n_layer: int, n_kv_head: int, head_dim: int, kv_dtype: str) -> int:
    """Bytes one position of one sequence takes in a pool: keys and values of every layer."""
    head = 4 * q8_words(head_dim) if kv_dtype == "q8_0" else head_dim * (2 if kv_dtype == "float16" else 4)
    return 2 * n_layer * n_kv_head * head


def check_kv_dtype(kv_dtype: Any, head_dim: int, has_f16: bool) -> str:
    """A KV pool's element type, checked: one of KV_DTYPES; q8_0 needs head dims that are multiples of 32 (whole
    blocks), float16 a device with it."""
    if kv_dtype not in KV_DTYPES:
        raise ArgumentError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    if kv_dtype == "q8_0" and head_dim % 32:
        raise ArgumentError(f"kv_dtype q8_0 needs a head dim that is a multiple of 32 (its blocks), not {head_dim}")
    if kv_dtype == "float16" and not has_f16:
        raise ArgumentError("kv_dtype float16: this device has no shader-f16 feature (use float32 or q8_0)")
    return str(kv_dtype)


class KVCache:
    """k[layer] and v[layer]: pools of `n_blocks` blocks plus a scratch block (the last, which padding rows of a
    bucketed step write), (n_blocks + 1, block_size, KVH, D) float32 / float16, or int32 (..., KVH, q8_words(D))
    for q8_0. `table`: int32 (n_seqs + 1, max_blocks); row s lists sequence s's blocks (-1: none), the last row is
    the scratch sequence (every entry the scratch block). `set_blocks` changes a row on the host, `sync` uploads
    the rows that changed (call it before queueing the step that reads them). `length` counts the positions
    written (for single-sequence callers that drive their own loop)."""

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, device: Any, n_blocks: int, n_seqs: int,
                 max_blocks: int, block_size: int = BLOCK_SIZE, kv_dtype: str = "float32"):
        if n_blocks < 1 or n_seqs < 1 or max_blocks < 1 or block_size < 1:
            raise ArgumentError(f"a KV cache needs at least one block, sequence and position: n_blocks={n_blocks}, "
                                f"n_seqs={n_seqs}, max_blocks={max_blocks}, block_size={block_size}")
        last = q8_words(head_dim) if kv_dtype == "q8_0" else head_dim
        dtype = dt.int32 if kv_dtype == "q8_0" else dt.float16 if kv_dtype == "float16" else dt.float32
        shape = (n_blocks + 1, block_size, n_kv_head, last)
        self.k = [empty(shape, dtype, device) for _ in range(n_layer)]
        self.v = [empty(shape, dtype, device) for _ in range(n_layer)]
        self.kv_dtype, self.block_size, self.head_dim = kv_dtype, block_size, head_dim
        self.n_blocks, self.n_seqs, self.max_blocks = n_blocks, n_seqs, max_blocks
        self.scratch_block, self.scratch_seq = n_blocks, n_seqs
        self._rows = [[-1] * max_blocks for _ in range(n_seqs)] + [[n_blocks] * max_blocks]
        self.table = from_buffer(self._pack(0, n_seqs + 1), (n_seqs + 1, max_blocks), dt.int32, device)
        self._dirty: set[int] = set()
        self.position_bytes = kv_position_bytes(n_layer, n_kv_head, head_dim, kv_dtype)
        self.length = 0

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.k, *self.v))

    @property
    def positions(self) -> int:
        """Positions the pool holds (scratch block not counted)."""
        return self.n_blocks * self.block_size

    def blocks(self, seq: int) -> list[int]:
        """Sequence `seq`'s blocks, as its table row lists them."""
        return [b for b in self._rows[seq] if b >= 0]

    def set_blocks(self, seq: int, blocks: list[int] | tuple[int, ...]) -> None:
        """Sequence `seq`'s table row: `blocks` in position order (HOLE: a block given back behind every layer's
        window, read by no kernel: runtime.blocks), the rest none (uploaded by `sync`)."""
        if len(blocks) > self.max_blocks:
            raise ArgumentError(f"{len(blocks)} blocks for sequence {seq}: a table row holds {self.max_blocks}")
        if any(not 0 <= b < self.n_blocks and b != HOLE for b in blocks):
            raise ArgumentError(f"a block id outside the pool of {self.n_blocks} blocks: {list(blocks)}")
        row = [*blocks, *([-1] * (self.max_blocks - len(blocks)))]
        if row != self._rows[seq]:
            self._rows[seq] = row
            self._dirty.add(seq)

    def sync(self) -> None:
        """Upload the table rows changed since the last sync (one queue write: the span of them)."""
        if not self._dirty:
            return
        lo, hi = min(self._dirty), max(self._dirty) + 1
        self._dirty.clear()
        view = self.table[lo:hi]
        view.device.backend.upload_into(view, self._pack(lo, hi))

    def _pack(self, lo: int, hi: int) -> bytes:
        return b"".join(struct.pack(f"<{self.max_blocks}i", *r) for r in self._rows[lo:hi])


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_kv_memory(value: Any) -> int | float:
    """A KV pool's size: bytes (an int, or text like "8GiB", "512 MiB", "4GB", "1e9") or a share of the device's
    memory (a number in (0, 1], e.g. 0.5). UsageError naming the value otherwise."""
    import re

    if isinstance(value, bool):
        raise UsageError(f"--kv-memory must be bytes (e.g. 8GiB) or a share of the device's memory in (0, 1], "
                         f"got {value!r}")
    if isinstance(value, int | float):
        num, unit = float(value), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise UsageError(f"--kv-memory must be bytes (e.g. 8GiB, 512MiB, 4GB) or a share of the device's memory "
                             f"in (0, 1] (e.g. 0.5), got {value!r}")
        num, unit = float(m.group(1)), m.group(2).lower()
    if not unit and 0 < num <= 1:
        return num  # a share
    if num < 1 or num != num or num == float("inf"):
        raise UsageError(f"--kv-memory must be bytes (e.g. 8GiB) or a share of the device's memory in (0, 1], "
                         f"got {value!r}")
    return int(num * _UNITS[unit])


def binding_cap(model: Any, block_size: int = BLOCK_SIZE) -> int:
    """The most blocks a pool of `model` may have so that one layer's key pool (the scratch block included) fits
    one binding of its device (docs/design-kv.md: the pool is capped per layer, not split)."""
    layer_block = model.position_bytes() * block_size // (2 * model.spec.n_layer)  # one block of one layer's keys
    return int(max(1, model.device.max_binding_bytes() // layer_block - 1))


def sequence_blocks(model: Any, rows: int, block_size: int = BLOCK_SIZE) -> int:
    """The most blocks one sequence of `model` holds at once in steps of at most `rows` positions: its whole
    context, or where every layer slides (`ModelSpec.kv_window`) the window's and a step's (`blocks.held_blocks`:
    the blocks behind the window are given back as the sequence moves on)."""
    return held_blocks(model.n_ctx, block_size, model.spec.kv_window, rows)


def pool_blocks(model: Any, n_seqs: int, kv_memory: Any = None, block_size: int = BLOCK_SIZE,
                prefill_chunk: int | None = None) -> int:
    """The blocks of a KV pool for `model` (its KV type, context, device): `kv_memory` bytes or that share of the
    device's memory (`parse_kv_memory`); by default what `n_seqs` sequences hold at most (whole contexts, or where
    every layer slides their windows': `sequence_blocks`, prompts read `prefill_chunk` tokens a step, None: the
    device policy's), cut to what fits beside the weights (90 % of the device's memory, where it is known, less
    the weights). Always cut so that one layer's key pool fits one binding (docs/design-kv.md: the pool is capped,
    not split), and never under one block."""
    from .runner import step_rows

    dev = model.device
    block_bytes = model.position_bytes() * block_size
    cap = binding_cap(model, block_size)
    memory = dev.memory_bytes()
    if kv_memory is None:
        want = n_seqs * sequence_blocks(model, step_rows(dev, prefill_chunk), block_size)
        if memory is not None:
            want = min(want, max(1, int(0.9 * memory - model.weight_bytes) // block_bytes))
        return int(max(1, min(want, cap)))
    size = parse_kv_memory(kv_memory)
    if isinstance(size, float):
        if memory is None:
            raise UsageError(f"--kv-memory {kv_memory}: a share of the device's memory, but {dev.describe()} does not "
                             "say how much it has; give bytes (e.g. 4GiB)")
        size = int(size * memory)
    n = size // block_bytes
    if n < 1:
        raise UsageError(f"--kv-memory {kv_memory}: {size:,} bytes hold no block of the KV cache ({block_size} "
                         f"positions, {block_bytes:,} bytes)")
    return int(min(n, cap))
