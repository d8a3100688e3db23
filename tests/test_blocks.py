"""`runtime.blocks.BlockManager`, the host's bookkeeping of a paged KV pool: allocation (lowest ids first, cached
blocks evicted least recently released first), reference counts of shared blocks, the prefix cache's keys (a block's
key names the whole prefix up to it), pending blocks, and a random walk of sequences against a model of the pool that
must keep every count consistent."""

from __future__ import annotations

import random

import pytest

from webtensor.runtime.blocks import BlockManager, KVCacheFullError, block_keys


def test_allocation_release_and_counts():
    kv = BlockManager(5, 4)
    a = kv.allocate(3)
    assert a == [0, 1, 2] and (kv.used, kv.free, kv.cached) == (3, 2, 0)
    with pytest.raises(KVCacheFullError, match="2 free blocks of 4 positions, 3 are needed"):
        kv.allocate(3)
    assert kv.used == 3  # (nothing taken)
    kv.release([1])
    assert kv.allocate(1) == [1]  # the lowest free id again
    kv.release(a)
    assert (kv.used, kv.free) == (0, 5)
    with pytest.raises(Exception, match="released but not held"):
        kv.release([0])
    assert kv.blocks_for(0) == 0 and kv.blocks_for(4) == 1 and kv.blocks_for(5) == 2


def test_keys_name_the_whole_prefix():
    a = block_keys([1, 2, 3, 4, 5, 6, 7], 3)
    assert [k[1] for k in a] == [(1, 2, 3), (4, 5, 6)]  # full blocks only
    b = block_keys([9, 2, 3, 4, 5, 6], 3)
    assert a[1][1] == b[1][1] and a[1] != b[1]  # the same tokens after another prefix: another key
    assert block_keys([1, 2, 3, 4, 5, 6], 3) == a


def test_prefix_cache_shares_and_keeps_blocks():
    kv = BlockManager(6, 2)
    tokens = [5, 6, 7, 8, 9]
    mine = kv.allocate(3)
    kv.register(mine, block_keys(tokens, 2), ready=False)  # (two full blocks: registered as they will be computed)
    assert kv.lookup(block_keys(tokens, 2)).pending and kv.lookup(block_keys(tokens, 2)).blocks == ()
    kv.mark_ready(mine[:1])
    found = kv.lookup(block_keys([5, 6, 7, 8, 1], 2))
    assert found.blocks == (mine[0],) and found.pending  # the second is still being computed
    kv.mark_ready(mine[1:2])
    found = kv.lookup(block_keys([5, 6, 7, 8, 1, 2], 2))
    assert found.blocks == tuple(mine[:2]) and not found.pending
    kv.take(found.blocks)  # a second sequence shares them
    kv.release(mine)  # the first is done: the shared ones stay held, its last (unregistered) block is free
    assert (kv.used, kv.cached) == (2, 0)
    kv.release(found.blocks)  # the second too: both cached, still found
    assert (kv.used, kv.cached, kv.free) == (0, 2, 6)
    assert kv.lookup(block_keys(tokens, 2)).blocks == tuple(mine[:2])
    kv.take(mine[:1])  # taken back from the cache
    assert (kv.used, kv.cached) == (1, 1)
    kv.release(mine[:1])
    # allocation evicts cached blocks only when the free ones are gone, least recently released first
    got = kv.allocate(5)
    assert mine[0] not in got and mine[1] in got and kv.lookup(block_keys(tokens, 2)).blocks == (mine[0],)


def test_forget_and_turning_it_off():
    kv = BlockManager(4, 2)
    b = kv.allocate(1)
    kv.register(b, block_keys([1, 2], 2), ready=False)
    kv.forget(b)  # (its step failed: the contents are not what the key says)
    assert not kv.lookup(block_keys([1, 2, 3], 2)).pending
    off = BlockManager(4, 2, prefix_caching=False)
    b = off.allocate(1)
    off.register(b, block_keys([1, 2], 2))
    off.release(b)
    assert off.lookup(block_keys([1, 2, 3], 2)).blocks == () and off.cached == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_walk_keeps_the_counts(seed):
    """Sequences come and go (sharing prefixes of a few shared prompts, growing, released): at every step the used
    blocks are exactly those some sequence holds, counted with their sharers, and free + used = the pool."""
    rng = random.Random(seed)
    kv = BlockManager(40, 4)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    live: list[list[int]] = []
    for _ in range(400):
        if live and rng.random() < 0.4:
            seq = live.pop(rng.randrange(len(live)))
            kv.release(seq)
        else:
            p = rng.choice(prompts) + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            keys = block_keys(p[:-1], 4)
            found = kv.lookup(keys)
            need = kv.blocks_for(len(p)) - len(found.blocks)
            if need > kv.free - sum(1 for b in found.blocks if not kv.held(b)):
                continue
            kv.take(found.blocks)
            seq = [*found.blocks, *kv.allocate(need)]
            kv.register(seq, block_keys(p, 4))
            live.append(seq)
        held = {b for s in live for b in s}
        assert kv.used == len(held) and kv.used + kv.free == 40
        assert all(kv.held(b) for b in held)
    for seq in live:
        kv.release(seq)
    assert kv.used == 0
