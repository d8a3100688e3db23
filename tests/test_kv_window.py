"""KV blocks given back behind a sliding window (docs/design-kv.md, "Sliding windows"): where every layer of a model
slides, a sequence's blocks that no layer reads any more go back to the pool as it moves on (HOLE in its block list
and table row), so a sequence holds at most the window's blocks and a step's.

- the block arithmetic (`stale_blocks`, `window_blocks`): what is given back is never read again, and the bound is
  exact;
- `BlockManager` with holes: every method skips them, the high-water mark, and a prefix lookup never hands out a
  chain with a hole (a donor whose first blocks were evicted gives nothing past them);
- the kernels: decode rows (with and without the fused store), prompt chunks (the tiled GPU kernel and the CPU
  adapters' flash kernel) and the CPU reference give the same bits with the entries behind each row's window
  unset (-1: no block) as with them set, on the CPU device and lavapipe;
- the runner (CPU device and lavapipe): the conformance suite's Mistral example with a window of 32 and a context
  of 512 generating 400 tokens past a 40-token prompt gives each step's logits bit for bit as the same run keeping
  every block, while its blocks in use stay within the window's (asserted after every step); the same on random
  windows, block sizes and prompt chunks (hypothesis); a conversation's next turn reuses what is still held, and
  nothing where the blocks it would need were given back;
- models with a full-attention layer (Gemma 2, Ministral's mixed layers, Qwen2's first layers) give back nothing.
Transformers' logits on the same weights: tests/models/test_llama_vs_hf.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from op_fixtures import on, rnd
from test_kv_pages import kernels, pool_of  # noqa: F401  (kernels: a fixture, both WebGPU kernel families)
from tolerance import assert_close
from window_fixtures import N_CTX, WINDOW, example_raw, load, prompt, write_checkpoint

import webtensor as wt
from webtensor.models import loader, registry
from webtensor.runtime.blocks import HOLE, BlockManager, block_keys, held_blocks, stale_blocks, window_blocks
from webtensor.runtime.generate import generate
from webtensor.runtime.runner import ModelRunner, RunRow

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**32 - 1)


# -- the arithmetic ---------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 80), rows=st.integers(1, 40), bs=st.integers(1, 20), start=st.integers(0, 400))
def test_what_is_given_back_is_never_read_and_the_bound_is_exact(window, rows, bs, start):
    stale = stale_blocks(start, window, bs)
    first_read = max(0, start + 1 - window)  # the first key any row at start .. start + rows - 1 reads
    assert stale * bs <= first_read  # every stale block lies wholly before it
    assert stale == 0 or first_read < (stale + 1) * bs  # and the next block holds a position it reads
    held = -(-(start + rows) // bs) - stale  # the blocks a step of `rows` positions from `start` holds
    assert held <= window_blocks(window, rows, bs)
    # the bound is reached: a start far along at the worst offset in a block
    worst = max(-(-(s + rows) // bs) - stale_blocks(s, window, bs) for s in range(window + 10 * bs, window + 11 * bs))
    assert worst == window_blocks(window, rows, bs)
    assert held_blocks(start + rows, bs, window, rows) == min(-(-(start + rows) // bs), worst)
    assert held_blocks(start + rows, bs) == -(-(start + rows) // bs) and stale_blocks(start, None, bs) == 0


# -- BlockManager with holes ------------------------------------------------------------------------------------
def test_block_lists_with_holes():
    kv = BlockManager(8, 4)
    seq = kv.allocate(5)
    keys = block_keys(list(range(20)), 4)
    kv.register(seq, keys)
    assert kv.peak == 5
    given_back = kv.release_front(seq, 2)
    assert given_back == [0, 1] and seq == [HOLE, HOLE, 2, 3, 4] and (kv.used, kv.cached) == (3, 2)
    assert kv.release_front(seq, 2) == [] and kv.release_front(seq, 3) == [2] and seq[:3] == [HOLE] * 3
    kv.mark_ready(seq)  # (every method skips the holes)
    kv.forget(seq)
    kv.register(seq, keys)
    other = kv.allocate(3)  # (free blocks first: the cached ones stay)
    kv.take(seq)
    assert kv.used == 3 + 2 and kv.peak == 5
    kv.release(seq)
    kv.release(seq)
    kv.release(other)
    assert kv.used == 0 and kv.cached == 5 and kv.peak == 5


def test_a_lookup_never_hands_out_a_chain_with_a_hole():
    """A sequence that gave back its first blocks as it went (cached under their keys) is a donor only as far as the
    chain from its first block is still cached: the first one evicted (the least recently given back: the first),
    a lookup finds nothing, though later blocks are still cached; once that block is computed and registered again,
    the whole chain is found."""
    kv = BlockManager(6, 2)
    tokens = list(range(9))
    keys = block_keys(tokens, 2)  # 4 full blocks
    seq = kv.allocate(5)
    kv.register(seq, keys)
    kv.release_front(seq, 2)  # blocks 0, 1 behind the window: cached
    kv.release(seq)  # the sequence ends: 2, 3 cached too (4: no key, free)
    assert kv.lookup(keys).blocks == tuple(seq_ids := [0, 1, 2, 3]) and kv.cached == 4
    got = kv.allocate(3)  # the free ones (4, 5), then the least recently given back: block 0
    assert 0 in got and kv.lookup(keys).blocks == ()  # (blocks 1-3 are cached, unreachable: no hole is handed out)
    kv.release([b for b in got if b != 0])
    kv.register([0], keys[:1])  # block 0 computed again by a later request
    kv.release([0])
    assert kv.lookup(keys).blocks == tuple(seq_ids)


# -- the kernels ------------------------------------------------------------------------------------------------
def _holed(table: np.ndarray, seqs: list[int], starts: list[int], window: int, block: int) -> np.ndarray:
    """The table with each sequence's entries behind the window of its first row unset (-1: no block)."""
    out = table.copy()
    for s, p in zip(seqs, starts, strict=True):
        out[s, :stale_blocks(p, window, block)] = HOLE
    return out


@SETTINGS
@given(seed=seeds, block=st.sampled_from([1, 2, 3, 5, 16]), window=st.integers(1, 40), kvh=st.integers(1, 2),
       group=st.integers(1, 3), kv=st.sampled_from(["float32", "float16", "q8_0"]), p0=st.integers(0, 90),
       T=st.integers(1, 70), fused=st.booleans(), data=st.data())
def test_no_kernel_reads_an_entry_behind_the_window(gpu, kernels, seed, block, window, kvh, group, kv, p0,  # noqa: F811
                                                    T, fused, data):
    """Decode rows of two sequences (the fused store or a read), then a prompt chunk of T rows at p0.. of one: every
    output the same bits with the entries behind each row's window unset as with them naming its blocks, on the CPU
    device (whose reference raises on reading an unset entry) and on lavapipe (both kernel families)."""
    if kv == "float16" and not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    d = data.draw(st.sampled_from([32, 64] if kv == "q8_0" else [8, 16, 20, 32, 64]))
    h = kvh * group
    rng = np.random.default_rng(seed)
    max_blocks = -(-(p0 + T) // block) + 1
    n_blocks = 2 * max_blocks + 1
    table = rng.permutation(n_blocks)[:2 * max_blocks].reshape(2, max_blocks).astype(np.int32)
    init = rnd(seed, n_blocks, block, kvh, d)
    dec_pos = np.array([p0, int(rng.integers(0, max_blocks * block))], np.int32)  # a row of each sequence
    dec_slot = np.array([1, 0], np.int32)
    chunk_pos = np.arange(p0, p0 + T, dtype=np.int32)
    q, k, v = rnd(seed + 1, T, h, d), rnd(seed + 2, T, kvh, d), rnd(seed + 3, T, kvh, d)
    rows = min(T, 2)  # (decode rows: sequence 1 at p0, sequence 0 anywhere)
    for dev in (wt.Device.cpu(), gpu):
        outs = []
        for holes in (False, True):
            kc, vc = on(dev, pool_of(kv, init), pool_of(kv, init * 0.5))
            dec_table = _holed(table, [1, 0][:rows], dec_pos[:rows].tolist(), window, block) if holes else table
            tb, dp, ds, qt, kt, vt = on(dev, dec_table, dec_pos[:rows], dec_slot[:rows], q, k, v)
            extra = dict(k_new=kt[:rows], v_new=vt[:rows]) if fused else {}
            dec = wt.cached_attention(qt[:rows], kc, vc, dp, ds, scale=0.3, table=tb, window=window, **extra)
            # the chunk: its keys stored at p0.. (never behind its first row's window), then read with the prefix
            tb1 = on(dev, _holed(table, [1], [p0], window, block) if holes else table)[0]
            pt, st_ = on(dev, chunk_pos, np.full(T, 1, np.int32))
            wt.cache_write(kc, kt, pt, st_, table=tb1)
            wt.cache_write(vc, vt, pt, st_, table=tb1)
            chunk = wt.chunk_attention(qt, kc, vc, pt, st_, scale=0.3, table=tb1, window=window)
            outs.append((dec.numpy(), chunk.numpy()))
        (d0, c0), (d1, c1) = outs
        assert np.array_equal(d0, d1, equal_nan=True) and np.array_equal(c0, c1), dev.describe()


# -- the runner -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conformance suite's Mistral example with a window of 32 on both layers and a context of 512."""
    return write_checkpoint(tmp_path_factory.mktemp("kvwin") / "mistral",
                            example_raw(sliding_window=WINDOW, max_position_embeddings=N_CTX))


def _steps(runner: ModelRunner, ids: list[int], n: int, greedy: bool) -> tuple[list[int], list[np.ndarray], int]:
    """`n` tokens after `ids` in slot 0 (greedy: followed steps on the device; else step by step, each step's logits
    read back and the argmax taken on the host): the tokens, the logits read, and the most blocks the slot held
    after any step (checked against the window's bound after every step)."""
    logits: list[np.ndarray] = []
    most = 0

    def pick(row: np.ndarray, position: int) -> int:
        nonlocal most
        logits.append(np.array(row))
        held = sum(1 for b in runner._owned[0] if b != HOLE)
        if runner.kv_window is not None:  # (after the prompt: a chunk's rows; after a step: one position)
            rows = runner.prefill_chunk if len(logits) == 1 else 1
            assert held <= window_blocks(runner.kv_window, rows, runner.block_size), (position, held)
        most = max(most, held)
        return int(np.argmax(row))
    tokens = list(generate(runner, ids, n, greedy, pick))
    return tokens, logits, most


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_a_long_generation_holds_the_windows_blocks_with_the_same_logits(mistral_dir, dev_name, gpu):
    """400 tokens past a 40-token prompt: each step's logits (read back) the same bits as a runner that keeps every
    block, the same greedy tokens when steps are followed on the device; the blocks in use stay within the window's
    bound at every step (3 blocks after a step here, against the 28 the whole sequence takes), lavapipe's logits
    the CPU's to float32's rounding."""
    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    m = load(mistral_dir, dev)
    assert m.spec.kv_window == WINDOW
    ids, n = prompt(40), 400
    free = ModelRunner(m, 1, bucketed=False)
    keep = ModelRunner(m, 1, bucketed=False, kv_blocks=N_CTX // 16)
    keep.kv_window = None  # (every block kept, as before)
    assert free.cache.n_blocks == held_blocks(N_CTX, 16, WINDOW, free.step_rows)  # (the default pool: what it holds)
    got, got_logits, most = _steps(free, ids, n, greedy=False)
    want, want_logits, most_keep = _steps(keep, ids, n, greedy=False)
    assert got == want and all(np.array_equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))
    assert most == window_blocks(WINDOW, 1, 16) and most_keep == -(-(40 + n - 1) // 16)
    assert free.blocks.peak <= window_blocks(WINDOW, free.prefill_chunk, 16) and keep.blocks.peak == most_keep
    for r in (free, keep):  # greedy, steps followed on the device (RING_STEPS at a time)
        r.release(0)
    assert free.blocks.used == 0
    assert _steps(free, ids, n, greedy=True)[0] == _steps(keep, ids, n, greedy=True)[0] == got
    assert sum(1 for b in free._owned[0] if b != HOLE) <= window_blocks(WINDOW, 16, 16)
    if dev_name == "wgpu":
        cpu_logits = _steps(ModelRunner(load(mistral_dir, wt.Device.cpu()), 1, bucketed=False), ids, 60, False)[1]
        assert_close(np.stack(got_logits[:60]), np.stack(cpu_logits), rtol=1e-4)
    for r in (free, keep):
        r.close()


_RANDOM_MODELS: dict[int, object] = {}


def _random_mistral(window: int) -> object:
    if window not in _RANDOM_MODELS:
        fam = registry.by_name("llama")
        cfg = fam.config_from_hf(example_raw(sliding_window=window, max_position_embeddings=160), "test")
        _RANDOM_MODELS[window] = loader.random("llama", cfg, device="cpu", n_ctx=160, kv_dtype="float32")
    return _RANDOM_MODELS[window]


@SETTINGS
@given(window=st.sampled_from([1, 2, 5, 16, 17, 33]), bs=st.sampled_from([1, 2, 3, 5, 16]),
       chunk=st.integers(1, 40), lens=st.tuples(st.integers(1, 70), st.integers(1, 70)), steps=st.integers(1, 50),
       follow=st.integers(1, 16))
def test_random_windows_blocks_and_chunks(window, bs, chunk, lens, steps, follow):
    """Two sequences of random prompts read in chunks of `chunk`, then decoded together `steps` steps (logits read)
    and `follow` steps followed on the device, through pools of blocks of `bs`: every logit the same bits as with
    every block kept, every slot within the window's bound after every launch, and the default pool (what each
    slot holds at most) never short."""
    assume(max(lens) + steps + follow < 160)
    m = _random_mistral(window)
    runners = [ModelRunner(m, 2, bucketed=False, prefill_chunk=chunk, block_size=bs),
               ModelRunner(m, 2, bucketed=False, prefill_chunk=chunk, block_size=bs, kv_blocks=2 * -(-160 // bs))]
    runners[1].kv_window = None
    outs = []
    for r in runners:
        got = []

        def check(rows: int) -> None:
            for slot in (0, 1):
                held = sum(1 for b in r._owned[slot] if b != HOLE)  # noqa: B023
                assert r.kv_window is None or held <= window_blocks(window, rows, bs)  # noqa: B023
        ps = [prompt(n, seed=i) for i, n in enumerate(lens)]
        for slot, p in enumerate(ps):
            got.append(r.prefill(slot, p).numpy())
            check(chunk)
        toks = [int(np.argmax(g)) for g in got]
        for i in range(steps):
            c = r.collect(r.launch([RunRow(s, (toks[s],), lens[s] + i, read_logits=True) for s in (0, 1)]))
            got += list(c.logits)
            toks = [int(np.argmax(x)) for x in c.logits]
            check(1)
        h = r.launch([RunRow(s, (toks[s],), lens[s] + steps) for s in (0, 1)])
        f = r.follow(h, follow)
        got.append(np.array(r.collect(h).tokens + r.collect(f).tokens))
        check(follow)
        outs.append(got)
        r.close()
    assert all(np.array_equal(a, b) for a, b in zip(*outs, strict=True))


def test_a_conversations_next_turn_reuses_what_is_still_held(mistral_dir):
    """generate(reuse_prefix): a turn after 200 generated tokens reuses the whole history (the blocks its next row
    reads are still held), giving a fresh runner's tokens and logits to float32's rounding (its prompt read in other
    chunks); a prompt sharing only tokens whose blocks were given back reuses nothing (common_prefix 0) and gives a
    fresh runner's logits bit for bit."""
    m = load(mistral_dir, wt.Device.cpu())
    runner, fresh = ModelRunner(m, 1, bucketed=False), ModelRunner(m, 1, bucketed=False)
    first = prompt(40)
    out = _steps(runner, first, 200, greedy=True)[0]
    assert runner._owned[0][0] == HOLE  # (its first blocks were given back)
    turn = first + out + prompt(10, seed=1)
    assert runner.common_prefix(0, turn) == len(first) + len(out) - 1  # (the last token's keys: never computed)
    got_tokens, got_logits = _reuse(runner, turn, 30)
    want_tokens, want_logits, _ = _steps(fresh, turn, 30, greedy=False)
    assert got_tokens == want_tokens
    assert_close(np.stack(got_logits), np.stack(want_logits), rtol=1e-5)
    other = first[:20] + prompt(30, seed=2)
    assert runner.common_prefix(0, other) == 0  # (its first 20 tokens' blocks were given back)
    got_tokens, got_logits = _reuse(runner, other, 30)
    want_tokens, want_logits, _ = _steps(fresh, other, 30, greedy=False)
    assert got_tokens == want_tokens
    assert all(np.array_equal(a, b) for a, b in zip(got_logits, want_logits, strict=True))


def _reuse(runner: ModelRunner, ids: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """`n` tokens after `ids` reusing what slot 0 holds (`generate(reuse_prefix=True)`), each step's logits read."""
    logits: list[np.ndarray] = []

    def pick(row: np.ndarray, position: int) -> int:
        logits.append(np.array(row))
        return int(np.argmax(row))
    return list(generate(runner, ids, n, False, pick, reuse_prefix=True)), logits


@pytest.mark.parametrize("family,example", [("gemma", "gemma2"), ("llama", "ministral"), ("llama", "qwen2")])
def test_a_full_attention_layer_keeps_every_block(family, example):
    """Gemma 2 (every other layer global), Ministral with a full layer, Qwen2 sliding from layer 1 on: some layer
    reads every earlier position, so no block is given back: a sequence of 150 positions holds its 10 blocks."""
    fam = registry.by_name(family)
    cfg = fam.config_from_hf(dict(fam.examples[example], max_position_embeddings=256), "test")
    assert any(cfg.window(i) is not None for i in range(cfg.num_hidden_layers)) and cfg.spec.kv_window is None
    m = loader.random(family, cfg, device="cpu", n_ctx=256, kv_dtype="float32")
    runner = ModelRunner(m, 1, bucketed=False)
    assert runner.kv_window is None and runner.cache.n_blocks == 16
    list(generate(runner, prompt(100), 51, True, lambda row, p: int(np.argmax(row))))
    assert runner._owned[0] == [b for b in runner._owned[0] if b != HOLE] and len(runner._owned[0]) == 10
    assert runner.blocks.used == 10


def test_describe_says_what_a_sequence_holds(mistral_dir):
    m = load(mistral_dir, wt.Device.cpu())
    held = held_blocks(N_CTX, 16, WINDOW, ModelRunner(m, 1).step_rows) * 16
    assert f"({held:,} positions)" in m.describe() and "every layer's window 32 positions" in m.describe()
    assert m.runner(3).cache.n_blocks == 3 * held // 16
