"""The paged KV cache's ops (docs/design-kv.md): `cache_write`, `cached_attention` (with and without the fused store,
with and without rope), `chunk_attention` (both kernel families) and `cache_gather` through a block table, on pools
of float32, float16 and q8_0, against a float64 reference written here (its own table walk; q8_0 through the Q8_0
weight quantizer, itself checked against llama.cpp's reference), on the CPU device and WebGPU: odd block sizes,
sequences crossing blocks, tables in any order, odd binding limits; and what a bad table does."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import rel_err, set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import on, rnd
from test_llama_ops import ref_attention, ref_rope, rope_tables

import webtensor as wt
from webtensor.quant.kv import q8_head_dim, q8_load, q8_store, q8_words
from webtensor.quant.quantizer import quantize

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**32 - 1)
TOL = 2e-5


def pool_of(kv: str, values: np.ndarray) -> np.ndarray:
    """float32 values (blocks, block, KVH, D) as a pool of type `kv` stores them."""
    return q8_store(values) if kv == "q8_0" else values.astype(kv)


def stored(kv: str, x: np.ndarray) -> np.ndarray:
    """float64 of what a pool of type `kv` keeps of float32 values x (..., D): q8_0 by the Q8_0 weight quantizer."""
    if kv == "q8_0":
        D = x.shape[-1]
        return quantize(x.reshape(-1, D), "Q8_0").dequantize().reshape(x.shape).astype(np.float64)
    return x.astype(kv).astype(np.float64)


def read_pool(kv: str, pool: np.ndarray, D: int) -> np.ndarray:
    """A pool's values as float64 (blocks, block, KVH, D)."""
    return (q8_load(pool, D) if kv == "q8_0" else pool).astype(np.float64)


def rows_of(table: np.ndarray, block: int, seq: int, n: int) -> list[tuple[int, int]]:
    """(block, offset) of positions 0 .. n - 1 of a sequence, walking its table row."""
    return [(int(table[seq, p // block]), p % block) for p in range(n)]


@SETTINGS
@given(seed=seeds, block=st.integers(1, 7), kvh=st.integers(1, 3), group=st.integers(1, 3),
       kv=st.sampled_from(["float32", "float16", "q8_0"]), n_seqs=st.integers(1, 4), max_blocks=st.integers(1, 4),
       spare=st.integers(0, 3), fused=st.booleans(), rope=st.booleans(), data=st.data())
def test_paged_ops_match_the_reference(gpu, seed, block, kvh, group, kv, n_seqs, max_blocks, spare, fused, rope,
                                       data):
    """Rows store their keys and values at their positions through the table and attend over positions 0..pos of
    their sequence: the pool on the CPU and on WebGPU hold the same bytes, and the outputs equal a float64 attention
    over the rows the table names (rounded / quantized as stored), rotated first where rope is asked for."""
    d = data.draw(st.sampled_from([32, 64, 96, 128] if kv == "q8_0" else [1, 2, 5, 8, 17, 64]))
    rope = rope and d >= 2
    h = kvh * group
    rng = np.random.default_rng(seed)
    n_blocks = n_seqs * max_blocks + spare
    table = rng.permutation(n_blocks)[:n_seqs * max_blocks].reshape(n_seqs, max_blocks).astype(np.int32)
    n_pos = max_blocks * block
    rows = data.draw(st.integers(1, n_seqs if fused else 6))
    if fused:  # (one row a sequence)
        slot, pos = rng.permutation(n_seqs)[:rows], rng.integers(0, n_pos, rows)
    else:  # (rows may share a sequence; no two store one place)
        rows = min(rows, n_seqs * n_pos)
        pairs = rng.permutation(n_seqs * n_pos)[:rows]
        slot, pos = pairs // n_pos, pairs % n_pos
    slot, pos = slot.astype(np.int32), pos.astype(np.int32)
    qkv = rnd(seed, rows, h + 2 * kvh, d)
    init = rnd(seed + 1, n_blocks, block, kvh, d)
    cos, sin = rope_tables(n_pos + 2, max(1, d // 2))
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        kc, vc = on(dev, pool_of(kv, init), pool_of(kv, init * 0.5))
        qkvt, ps, tb, tab = on(dev, qkv, np.stack([pos, slot]), table, np.stack([cos, sin]))
        q, k, v = qkvt[:, :h], qkvt[:, h:h + kvh], qkvt[:, h + kvh:]
        r = (tab[0], tab[1], bool(seed % 2)) if rope else None
        if fused:
            a = wt.cached_attention(q, kc, vc, ps[0], ps[1], scale=0.3, k_new=k, v_new=v, rope=r, table=tb)
        else:
            wt.cache_write(kc, k, ps[0], ps[1], rope=r, table=tb)
            wt.cache_write(vc, v, ps[0], ps[1], table=tb)
            a = wt.cached_attention(q, kc, vc, ps[0], ps[1], scale=0.3, rope=r, table=tb)
        outs.append((a.numpy(), kc.numpy(), vc.numpy()))
    (a0, k0, v0), (a1, k1, v1) = outs
    assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    assert rel_err(a1, a0) <= TOL
    # the reference: the pool before, the rows' (rotated) keys and values stored where the table says
    q = qkv[:, :h]
    knew, vnew = qkv[:, h:h + kvh], qkv[:, h + kvh:]
    if rope:
        interleaved = bool(seed % 2)
        q = ref_rope(q, pos, cos, sin, interleaved).astype(np.float32)
        knew = ref_rope(knew, pos, cos, sin, interleaved).astype(np.float32)
    kref, vref = stored(kv, init), stored(kv, init * np.float32(0.5))
    for t in range(rows):
        b, o = int(table[slot[t], pos[t] // block]), int(pos[t] % block)
        kref[b, o], vref[b, o] = stored(kv, knew[t]), stored(kv, vnew[t])
    k_got, v_got = read_pool(kv, k0, d), read_pool(kv, v0, d)
    step = np.abs(kref).max() / 127 if kv == "q8_0" else 0  # (a rotated key may round to the other quant)
    assert np.abs(k_got - kref).max() <= step * 1.01 + (1e-6 if rope else 0) and np.array_equal(v_got, vref)
    for t in range(rows):
        where = rows_of(table, block, int(slot[t]), int(pos[t]) + 1)
        ks = np.stack([k_got[b, o] for b, o in where])
        vs = np.stack([v_got[b, o] for b, o in where])
        want = ref_attention(q[t:t + 1], ks, vs, False, 0.3)
        assert rel_err(a0[t:t + 1], want) <= TOL


@SETTINGS
@given(seed=seeds, block=st.integers(1, 6), kv=st.sampled_from(["float32", "float16", "q8_0"]),
       n=st.integers(0, 20), kvh=st.integers(1, 3))
def test_cache_gather(gpu, seed, block, kv, n, kvh):
    """A sequence's first n positions, gathered through its table into a contiguous float32 (n, KVH, D): the stored
    values, widened; without a table, a contiguous cache's slot."""
    d = 64 if kv == "q8_0" else 1 + seed % 9
    max_blocks = max(1, -(-n // block))
    rng = np.random.default_rng(seed)
    n_blocks = 2 * max_blocks + 1
    table = rng.permutation(n_blocks)[:2 * max_blocks].reshape(2, max_blocks).astype(np.int32)
    init = pool_of(kv, rnd(seed, n_blocks, block, kvh, d))
    values = read_pool(kv, init, d)
    want = np.stack([values[b, o] for b, o in rows_of(table, block, 1, n)]) if n else np.zeros((0, kvh, d))
    flat = pool_of(kv, rnd(seed + 1, 3, max(n, 1), kvh, d))
    for dev in (wt.Device.cpu(), gpu):
        pool, tb, flat_t = on(dev, init, table, flat)
        got = wt.cache_gather(pool, 1, n, table=tb)
        assert got.dtype is wt.float32 and got.shape == (n, kvh, d)
        assert np.array_equal(got.numpy(), want)
        assert np.array_equal(wt.cache_gather(flat_t, 2, n).numpy(), read_pool(kv, flat, d)[2, :n])


@pytest.mark.parametrize("kv", ["float32", "float16", "q8_0"])
def test_a_sequence_across_blocks_reads_as_a_contiguous_one(gpu, kv):
    """The same tokens stored through a table of 3-position blocks in scattered order, and in a contiguous cache:
    every decode row's attention is the same bit for bit (the same values, read in the same order)."""
    rng = np.random.default_rng(3)
    H, KVH, D, n, block = 4, 2, 64, 23, 3
    nb = -(-n // block)
    table = np.full((2, nb + 2), -1, np.int32)
    table[1, :nb] = rng.permutation(2 * nb)[:nb]
    keys, vals, q = (rnd(s, n, KVH, D) for s in (1, 2, 3))
    q = rnd(4, n, H, D)
    for dev in (wt.Device.cpu(), gpu):
        outs = []
        for paged in (False, True):
            shape = (2 * nb, block, KVH, D) if paged else (2, n, KVH, D)
            zero = pool_of(kv, np.zeros(shape, np.float32))
            kc, vc = on(dev, zero, zero.copy())
            tb = on(dev, table)[0] if paged else None
            pos_all, slot_all = on(dev, np.arange(n, dtype=np.int32), np.full(n, 1, np.int32))
            outs.append([])
            for t in range(n):  # one row a step, its own key stored by the fused launch
                pt, st_ = on(dev, np.array([t], np.int32), np.array([1], np.int32))
                a = wt.cached_attention(on(dev, q[t:t + 1])[0], kc, vc, pt, st_, k_new=on(dev, keys[t:t + 1])[0],
                                        v_new=on(dev, vals[t:t + 1])[0], table=tb)
                outs[-1].append(a.numpy())
            # and all positions at once, reading the cache (prompt chunk style)
            outs[-1].append(wt.cached_attention(on(dev, q)[0], kc, vc, pos_all, slot_all, table=tb).numpy())
        for x, y in zip(*outs, strict=True):
            assert np.array_equal(x, y)
        assert np.array_equal(outs[0][-1], np.concatenate(outs[0][:-1]))  # (fused rows = the stored rows' reads)


def test_bad_table_entries(gpu):
    """A position whose table entry is no block of the pool (-1, past the pool): the CPU refuses it naming the
    position and slot; a WebGPU kernel stores nothing there and does not attend to it (GPU data is never trusted as
    an index)."""
    block, D = 2, 4
    table = np.array([[0, -1, 7]], np.int32)  # position 2, 3: no block; 4, 5: block 7 of a pool of 3
    init = rnd(0, 3, block, 1, D)
    k = rnd(1, 1, 1, D)
    cpu = wt.Device.cpu()
    kc, tb, kt, pos, slot = on(cpu, init, table, k, np.array([2], np.int32), np.array([0], np.int32))
    with pytest.raises(wt.ShapeError, match="position 2 of slot 0 has no block"):
        wt.cache_write(kc, kt, pos, slot, table=tb)
    with pytest.raises(wt.ShapeError, match="position 2 of slot 0 has no block"):
        wt.cache_gather(kc, 0, 5, table=tb)
    for p in (2, 5):
        kc, vc, tb, kt, pos, slot = on(gpu, init, init, table, k, np.array([p], np.int32), np.array([0], np.int32))
        a = wt.cached_attention(kt, kc, vc, pos, slot, k_new=kt, v_new=kt, table=tb).numpy()
        assert np.array_equal(kc.numpy(), init)  # nothing stored
        want = ref_attention(k, init[0][:2], init[0][:2], False, D ** -0.5)  # only positions 0, 1 have rows
        assert rel_err(a, want) <= TOL
        g = wt.cache_gather(kc, 0, 4, table=tb).numpy()
        assert np.array_equal(g[:2], init[0]) and not g[2:].any()


def test_cache_arguments_are_checked(device):
    q = wt.zeros((2, 2, 32), device=device)
    pos = wt.tensor(np.zeros(2, np.int32), device=device)
    kc = wt.zeros((3, 4, 2, 32), device=device)
    with pytest.raises(wt.ShapeError, match="a block table is a contiguous int32 tensor"):
        wt.cached_attention(q, kc, kc, pos, pos, table=wt.zeros((2, 3), device=device))
    q8 = wt.tensor(np.zeros((3, 4, 2, q8_words(32) + 1), np.int32), device=device)
    with pytest.raises(wt.ShapeError, match="q8_0 pool int32"):
        wt.cache_write(q8, q[:, :2], pos, pos)
    with pytest.raises(wt.ShapeError, match="k and v caches differ"):
        wt.cached_attention(q, kc, wt.tensor(np.zeros((3, 4, 2, 32), np.float16), device=device), pos, pos)
    with pytest.raises(wt.ArgumentError, match=r"cache_gather: n must be an int in \[0, 4\]"):
        wt.cache_gather(kc, 0, 5)
    with pytest.raises(wt.ArgumentError, match=r"cache_gather: slot must be an int in \[0, 2\]"):
        wt.cache_gather(kc, 3, 1)
    assert [q8_head_dim(q8_words(d)) for d in (32, 64, 96, 128, 160, 256)] == [32, 64, 96, 128, 160, 256]


def test_float16_pools_round_as_numpy_does(gpu):
    """A float16 pool stores each value rounded to nearest (ties to even) as numpy's astype does: subnormals,
    ties, the largest finite values and overflow to inf included (the kernels round in integer steps so that the
    value they attend to is the stored one: a compiler may fold f32(f16(x)) to x)."""
    tiny = np.float32(2.0 ** -24)
    special = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504, 65519, 65520, 1e6, -1e6, tiny * 0.5, tiny * 1.5,
                        tiny * 2.5, 3e-6, -3e-6, 6.1e-5, 6.103e-5, 0.0, -0.0, np.inf, -np.inf, 0.1, -0.3, 1 / 3,
                        1234.5678, 2 ** -14 * (1 - 2 ** -12)], np.float32)
    n = len(special)
    x = np.zeros((n, 1, 4), np.float32)
    x[:, 0, 0] = special
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    for dev in (wt.Device.cpu(), gpu):
        pool = wt.zeros((1, n, 1, 4), dtype=wt.float16, device=dev)
        xt, pos, slot = on(dev, x, np.arange(n, dtype=np.int32), np.zeros(n, np.int32))
        wt.cache_write(pool, xt, pos, slot)
        got = pool.numpy()[0]
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (special, got[:, 0, 0])
        # the fused store attends to the stored value: with q = 0, the output is the mean of the values
        kc, vc = (wt.zeros((1, 1, 1, 4), dtype=wt.float16, device=dev) for _ in range(2))
        for i in range(n):
            if not np.isfinite(want[i, 0, 0]):
                continue
            one = on(dev, x[i:i + 1])[0]
            a = wt.cached_attention(wt.zeros((1, 1, 4), device=dev), kc, vc, *on(dev, np.zeros(1, np.int32),
                                    np.zeros(1, np.int32)), k_new=one, v_new=one).numpy()
            assert a[0, 0, 0] == want[i, 0, 0].astype(np.float32)  # (by value: the weighted sum makes -0 +0)


@pytest.fixture(params=[True, False], ids=["gpu-kernels", "cpu-kernels"])
def kernels(request, monkeypatch, gpu):
    """The GPU kernels (attention_tiled_cache) or the CPU adapters' (attention_flash_cache) on this adapter."""
    set_policy(monkeypatch, gpu, gpu_style=request.param)
    return request.param


@SETTINGS
@given(seed=seeds, block=st.integers(1, 7), kvh=st.integers(1, 2), group=st.integers(1, 3),
       kv=st.sampled_from(["float32", "float16", "q8_0"]), p0=st.integers(0, 40), T=st.integers(2, 70),
       pad=st.integers(0, 5), spare=st.integers(0, 3), data=st.data())
def test_paged_chunk_attention_matches_the_reference(gpu, kernels, seed, block, kvh, group, kv, p0, T, pad, spare,
                                                     data):
    """A prompt chunk through the block table: its T rows (and `pad` padding rows, stored nowhere: their store
    position is the table's end) store their keys and values at positions p0.. of one sequence (`cache_write`), then
    `chunk_attention` reads the cached prefix and the chunk from the pool, blocks crossed in any order: the pools on
    the CPU and on WebGPU hold the same bytes, and every row equals a float64 attention over the values as stored
    (whatever kernel runs: the tiled one, the CPU adapters' or cached_attention's)."""
    if kv == "float16" and not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    d = data.draw(st.sampled_from([32, 64] if kv == "q8_0" else [8, 16, 20, 32, 64]))
    h = kvh * group
    rng = np.random.default_rng(seed)
    n_seqs = 2
    max_blocks = -(-(p0 + T) // block)
    n_blocks = n_seqs * max_blocks + spare
    table = rng.permutation(n_blocks)[:n_seqs * max_blocks].reshape(n_seqs, max_blocks).astype(np.int32)
    s = int(rng.integers(0, n_seqs))
    end = max_blocks * block
    store = np.concatenate([np.arange(p0, p0 + T), np.full(pad, end)]).astype(np.int32)
    pos = np.concatenate([np.arange(p0, p0 + T), np.full(pad, p0 + T - 1)]).astype(np.int32)
    slot = np.full(T + pad, s, np.int32)
    q, k, v = rnd(seed, T + pad, h, d), rnd(seed + 1, T + pad, kvh, d), rnd(seed + 2, T + pad, kvh, d)
    init = rnd(seed + 3, n_blocks, block, kvh, d)
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        kc, vc = on(dev, pool_of(kv, init), pool_of(kv, init * 0.5))
        qt, kt, vt, tb, pt, sst = on(dev, q, k, v, table, pos, np.stack([store, slot]))
        wt.cache_write(kc, kt, sst[0], sst[1], table=tb)
        wt.cache_write(vc, vt, sst[0], sst[1], table=tb)
        outs.append((wt.chunk_attention(qt, kc, vc, pt, sst[1], scale=0.3, table=tb).numpy(), kc.numpy(),
                     vc.numpy()))
    (a0, k0, v0), (a1, k1, v1) = outs
    assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    kref, vref = stored(kv, init), stored(kv, init * np.float32(0.5))
    for t in range(T):
        b, o = int(table[s, (p0 + t) // block]), (p0 + t) % block
        kref[b, o], vref[b, o] = stored(kv, k[t]), stored(kv, v[t])
    assert np.array_equal(read_pool(kv, k0, d), kref) and np.array_equal(read_pool(kv, v0, d), vref)
    for t in range(T + pad):
        where = rows_of(table, block, s, int(pos[t]) + 1)
        ks = np.stack([kref[b, o] for b, o in where])
        vs = np.stack([vref[b, o] for b, o in where])
        want = ref_attention(q[t:t + 1], ks, vs, False, 0.3)
        assert rel_err(a0[t:t + 1], want) <= TOL and rel_err(a1[t:t + 1], want) <= TOL
