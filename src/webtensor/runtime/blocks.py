"""`BlockManager`: the host's bookkeeping of a paged KV pool — which blocks are free, which sequence holds which,
and the prefix cache (full blocks found again by the hash of the tokens up to them). Pure Python (no device, no
numpy): the server's scheduler owns one in the HTTP process while the engine runs elsewhere (docs/design-kv.md).

A block is in one of three states:

- **used**: held by at least one sequence (its reference count); a block shared through the prefix cache is held
  by every sequence that found it;
- **cached**: held by none, but registered under a prefix key: its keys and values are still valid, and a later
  prompt with the same tokens up to it takes it back instead of computing it;
- **free**: held by none, registered under nothing.

Allocation takes free blocks first (lowest ids first, so the used part of the pool stays compact), then evicts
cached blocks, least recently released first. A full block's key is `(the previous block's key hash, its tokens)`,
so it names the whole prefix up to the block. A registered block may be *pending*: its keys and values are being
computed by the step that will mark it ready; a lookup stops there (`Lookup.pending`), so a caller can wait for it
instead of computing the same tokens twice.

Sliding windows: where every layer of a model slides (its `ModelSpec.kv_window`: the largest window), a query at
position p reads no key before p + 1 - window, so a sequence's blocks wholly behind that (`stale_blocks`) are given
back as it moves on (`release_front`): they become cached (registered) or free like any released block, and their
entries in the sequence's list become HOLE, so the list keeps its slot layout (entry i: positions i * block_size ..)
and the table row the kernels read says "no block" there. A sequence then holds at most `window_blocks` blocks,
however long it grows. Every method here skips HOLE entries.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import WebtensorError

ROOT = 0  # the key hash before the first block
HOLE = -1  # an entry of a sequence's block list whose block was given back early (behind every layer's window)


class KVCacheFullError(WebtensorError, RuntimeError):
    """The KV pool has no free block for the tokens asked for (the message says how many it holds)."""


def block_keys(tokens: Sequence[int], block_size: int, parent: int = ROOT) -> list[tuple[int, tuple[int, ...]]]:
    """The prefix keys of the full blocks of `tokens`: (hash of the previous key, the block's tokens), in order."""
    keys = []
    for i in range(len(tokens) // block_size):
        part = tuple(tokens[i * block_size:(i + 1) * block_size])
        keys.append((parent, part))
        parent = hash((parent, part))
    return keys


def stale_blocks(next_position: int, window: int | None, block_size: int) -> int:
    """How many of a sequence's first blocks no query at `next_position` or later reads when every layer sees only
    its last `window` positions (itself included): the blocks wholly before position next_position + 1 - window.
    0 without a window."""
    if window is None:
        return 0
    return max(0, next_position + 1 - window) // block_size


def window_blocks(window: int, rows: int, block_size: int) -> int:
    """The most blocks a sequence holds at once when every layer reads its last `window` positions, a step adds at
    most `rows` positions and its stale blocks are given back before the step: a step's rows and the window behind
    its first are a run of window - 1 + rows positions, which touches at most this many blocks wherever it starts."""
    return (window - 1 + rows + 2 * block_size - 2) // block_size


def held_blocks(positions: int, block_size: int, window: int | None = None, rows: int = 1) -> int:
    """The most blocks a sequence of `positions` positions holds at once: all of them, or with a `window` on every
    layer (steps of at most `rows` positions) at most `window_blocks`."""
    n = -(-positions // block_size)
    return n if window is None else min(n, window_blocks(window, rows, block_size))


@dataclass(frozen=True)
class Lookup:
    """A prompt's longest run of cached full blocks: `blocks` (ready, in order) and whether the block after them
    is registered but still being computed (`pending`: its owner's step has not run yet)."""

    blocks: tuple[int, ...]
    pending: bool


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int, prefix_caching: bool = True):
        if n_blocks < 1 or block_size < 1:
            raise WebtensorError(f"a KV pool needs at least one block of one position, got {n_blocks} x {block_size}")
        self.n_blocks, self.block_size, self.prefix_caching = n_blocks, block_size, prefix_caching
        self._free = list(range(n_blocks))  # a heap: the lowest free id first
        self._ref = [0] * n_blocks
        self._key: list[tuple[int, tuple[int, ...]] | None] = [None] * n_blocks  # a registered block's key
        self._ready = [False] * n_blocks  # (registered blocks) its keys and values are computed
        self._by_key: dict[tuple[int, tuple[int, ...]], int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # unheld registered blocks, least recent first
        self.peak = 0  # the most blocks held at once so far (the pool's high-water mark)

    # -- counts ---------------------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Blocks that can be given out now: free ones and cached ones (evicted when taken)."""
        return len(self._free) + len(self._cached)

    @property
    def cached(self) -> int:
        """Blocks held by no sequence whose contents the prefix cache keeps."""
        return len(self._cached)

    @property
    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.n_blocks - self.free

    def held(self, block: int) -> bool:
        """Whether a sequence holds `block`."""
        return self._ref[block] > 0

    def blocks_for(self, positions: int) -> int:
        """Blocks that hold `positions` positions."""
        return -(-positions // self.block_size)

    # -- allocation -----------------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """`n` blocks for one sequence (reference count 1): free ones first, then cached ones evicted, least
        recently released first. KVCacheFullError (nothing taken) when fewer are left."""
        if n > self.free:
            raise KVCacheFullError(f"the KV cache has {self.free} free blocks of {self.block_size} positions, "
                                   f"{n} are needed (the pool holds {self.n_blocks} blocks)")
        out = []
        for _ in range(n):
            if self._free:
                b = heapq.heappop(self._free)
            else:
                b, _ = self._cached.popitem(last=False)
                self._unregister(b)
            self._ref[b] = 1
            out.append(b)
        self.peak = max(self.peak, self.used)
        return out

    def take(self, blocks: Iterable[int]) -> None:
        """Share `blocks` (found by `lookup`) with one more sequence."""
        for b in blocks:
            if b == HOLE:
                continue
            if self._ref[b] == 0:
                del self._cached[b]
            self._ref[b] += 1
        self.peak = max(self.peak, self.used)

    def release(self, blocks: Iterable[int]) -> None:
        """A sequence gives `blocks` back: each that no one else holds becomes cached (registered and computed) or
        free."""
        for b in blocks:
            if b == HOLE:
                continue
            if self._ref[b] <= 0:
                raise WebtensorError(f"KV block {b} released but not held")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._key[b] is not None and self._ready[b]:
                    self._cached[b] = None
                else:
                    self._unregister(b)
                    heapq.heappush(self._free, b)

    def release_front(self, blocks: list[int], n: int) -> list[int]:
        """Give back the first `n` entries of a sequence's block list (`blocks`, changed in place: HOLE in their
        place, so it keeps its slot layout): its stale blocks (`stale_blocks`). The blocks given back."""
        out = [b for b in blocks[:n] if b != HOLE]
        blocks[:n] = [HOLE] * min(n, len(blocks))
        self.release(out)
        return out

    # -- the prefix cache -----------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[tuple[int, tuple[int, ...]]]) -> Lookup:
        """The blocks of the longest run of `keys` (`block_keys` of a prompt's full blocks) whose contents are
        computed, and whether the next one is registered but pending. Takes nothing (`take` does)."""
        found: list[int] = []
        if self.prefix_caching:
            for k in keys:
                b = self._by_key.get(k)
                if b is None:
                    break
                if not self._ready[b]:
                    return Lookup(tuple(found), True)
                found.append(b)
        return Lookup(tuple(found), False)

    def register(self, blocks: Sequence[int], keys: Sequence[tuple[int, tuple[int, ...]]], ready: bool = True) -> None:
        """Record that `blocks` (held, in order) hold the tokens `keys` name (their keys and values computed
        where `ready`, else once `mark_ready` says so). A key another block already has is left to that one."""
        if not self.prefix_caching:
            return
        for b, k in zip(blocks, keys, strict=False):
            if b == HOLE or self._key[b] is not None or k in self._by_key:
                continue
            self._key[b], self._ready[b] = k, ready
            self._by_key[k] = b

    def mark_ready(self, blocks: Iterable[int]) -> None:
        """The pending `blocks`' keys and values are computed (the step that wrote them has run)."""
        for b in blocks:
            if b != HOLE and self._key[b] is not None:
                self._ready[b] = True

    def forget(self, blocks: Iterable[int]) -> None:
        """Drop `blocks`' registrations (their contents are not what their keys say: a step that failed, a
        sequence stopped before computing them)."""
        for b in blocks:
            if b != HOLE and self._key[b] is not None and not self._ready[b]:
                self._unregister(b)

    def _unregister(self, b: int) -> None:
        k = self._key[b]
        if k is not None:
            if self._by_key.get(k) == b:
                del self._by_key[k]
            self._key[b], self._ready[b] = None, False
