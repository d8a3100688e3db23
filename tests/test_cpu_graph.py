"""The CPU device's graphs (`backends.cpu.CpuGraph`): a captured function's replay equals running it
eagerly bit for bit (ops one by one, and a random small GPT-2 decode step whose ids, positions
and slots change between replays), capturing runs nothing, and what a graph cannot replay
(readbacks, uploads into existing tensors, a capture inside a capture) is refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.backends.cpu import CpuGraph
from webtensor.models.gpt2 import names as gpt2_names
from webtensor.models.gpt2.config import GPT2Config
from webtensor.models.gpt2.model import GPT2
from webtensor.runtime import runner as R
from webtensor.runtime.batch import StepBatch
from webtensor.runtime.generate import generate, generate_batch
from webtensor.serve.engine import ModelEngine

CPU = wt.Device.cpu()
SETTINGS = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**32 - 1)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (NaNs included), dtype and shape too."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def fill(t: wt.Tensor, arr: np.ndarray) -> None:
    """New values into an existing tensor, between replays."""
    wt.copy_into(t, wt.tensor(np.ascontiguousarray(arr, t.dtype.name), device=CPU))


# -- ops one by one ------------------------------------------------------------------------------
def _op_case(data: st.DataObject, rng: np.random.Generator):
    """A random op over random input tensors: (fn of the tensors, [input shapes and dtypes])."""
    f32 = np.float32
    B, K, N = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40))
    dt = data.draw(st.sampled_from([np.float32, np.float16]))
    kind = data.draw(st.sampled_from(["linear", "layer_norm", "gelu", "binary", "softmax", "argmax", "matmul",
                                      "attention", "embedding", "cast", "copy"]))
    if kind == "linear":
        bias, res = data.draw(st.booleans()), data.draw(st.booleans())
        act = data.draw(st.sampled_from([None, "gelu_tanh", "relu", "silu"]))
        ln = data.draw(st.booleans())
        stack = data.draw(st.booleans())  # (B, 1, K), as the decode step, or (B, K)
        xs = (B, 1, K) if stack else (B, K)
        shapes = [(xs, dt), ((K, N), dt), ((N,), dt), (xs[:-1] + (N,), dt), ((K,), f32), ((K,), f32)]

        def fn(x, w, b, r, g, beta):
            return wt.linear(x, w, b if bias else None, act, r if res else None, (g, beta, 1e-5) if ln else None)
    elif kind == "layer_norm":
        shapes = [((B, 1, K), dt), ((K,), dt), ((K,), dt)]

        def fn(x, g, b):
            return wt.layer_norm(x, g, b, 1e-5)
    elif kind == "gelu":
        shapes = [((B, K), dt)]
        fn = wt.gelu
    elif kind == "binary":
        op = data.draw(st.sampled_from([wt.add, wt.sub, wt.mul, wt.div]))
        shapes = [((B, K), dt), ((K,), dt)]
        fn = op
    elif kind == "softmax":
        shapes = [((B, K), dt)]
        fn = wt.softmax
    elif kind == "argmax":
        shapes = [((B, K), dt)]
        fn = wt.argmax
    elif kind == "matmul":
        shapes = [((B, 1, K), dt), ((K, N), dt)]
        fn = wt.matmul
    elif kind == "attention":
        H, D, S = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 16)), data.draw(st.integers(B, B + 8))
        causal = data.draw(st.booleans())
        shapes = [((B, H, D), dt), ((S, H, D), dt), ((S, H, D), dt)]

        def fn(q, k, v):
            return wt.attention(q, k, v, causal)
    elif kind == "embedding":
        shapes = [((N, K), dt), ((B,), np.int32)]
        fn = wt.embedding
    elif kind == "cast":
        shapes = [((B, K), dt)]

        def fn(x):
            return wt.cast(x, wt.float16 if dt == np.float32 else wt.float32)
    else:
        shapes = [((B, K), dt)]

        def fn(x):
            return x.T.contiguous()  # a copy of a strided view
    return fn, shapes


def _values(rng: np.random.Generator, shapes, n_rows: int) -> list[np.ndarray]:
    out = []
    for shape, dt in shapes:
        if dt == np.int32:
            out.append(rng.integers(0, n_rows, shape).astype(np.int32))
        else:
            out.append((rng.standard_normal(shape) * 2).astype(dt))
    return out


@SETTINGS
@given(data=st.data(), seed=seeds)
def test_op_replay_is_eager_bit_for_bit(data, seed):
    rng = np.random.default_rng(seed)
    fn, shapes = _op_case(data, rng)
    n_rows = shapes[0][0][0]  # (the embedding table's rows)
    inputs = [wt.tensor(a, device=CPU) for a in _values(rng, shapes, n_rows)]
    g = CPU.capture(lambda: fn(*inputs))
    for _ in range(3):  # fresh inputs each replay
        fresh = _values(rng, shapes, n_rows)
        for t, a in zip(inputs, fresh, strict=True):
            fill(t, a)
        got = g.replay().numpy()
        want = fn(*[wt.tensor(a, device=CPU) for a in fresh]).numpy()
        assert same(got, want)
    g.release()


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 5), n_ctx=st.integers(1, 20), h=st.integers(1, 3), d=st.integers(1, 12),
       data=st.data())
def test_cache_ops_replay_is_eager_bit_for_bit(seed, slots, n_ctx, h, d, data):
    """cache_write and cached_attention (with the fused append) write the cache in place: a replay
    and the eager ops leave the same cache and give the same attention."""
    rng = np.random.default_rng(seed)
    rows = data.draw(st.integers(1, slots))
    cache0 = [rng.standard_normal((slots, n_ctx, h, d)).astype(np.float32) for _ in range(2)]
    kc, vc = (wt.tensor(c, device=CPU) for c in cache0)
    q, k, v = (wt.tensor(rng.standard_normal((rows, h, d)).astype(np.float32), device=CPU) for _ in range(3))
    pos, slot = wt.tensor(np.zeros(rows, np.int32), device=CPU), wt.tensor(np.arange(rows, dtype=np.int32), device=CPU)
    g = CPU.capture(lambda: wt.cached_attention(q, kc, vc, pos, slot, k_new=k, v_new=v))
    ekc, evc = (wt.tensor(c, device=CPU) for c in cache0)
    for _ in range(3):
        p = rng.integers(0, n_ctx + 2, rows).astype(np.int32)  # (past the context: not written)
        s = rng.permutation(slots)[:rows].astype(np.int32)
        new = [rng.standard_normal((rows, h, d)).astype(np.float32) for _ in range(3)]
        for t, a in zip((q, k, v, pos, slot), (*new, p, s), strict=True):
            fill(t, a)
        got = g.replay().numpy()
        want = wt.cached_attention(*(wt.tensor(a, device=CPU) for a in new[:1]), ekc, evc, wt.tensor(p, device=CPU),
                                   wt.tensor(s, device=CPU), k_new=wt.tensor(new[1], device=CPU),
                                   v_new=wt.tensor(new[2], device=CPU)).numpy()
        assert same(got, want)
        assert same(kc.numpy(), ekc.numpy()) and same(vc.numpy(), evc.numpy())


def test_advance_tokens_replays_in_place():
    new = wt.tensor(np.array([5, 7], np.int32), device=CPU)
    ids, pos, tokens, count = (R.int_tensor(v, CPU) for v in ([1, 2], [10, 20], [0] * 6, [0]))
    g = CPU.capture(lambda: wt.advance_tokens(new, ids, pos, tokens, count))
    assert R.read_ints(pos) == [10, 20]  # capturing ran nothing
    g.replay(2)
    assert R.read_ints(ids) == [5, 7] and R.read_ints(pos) == [12, 22]
    assert R.read_ints(tokens) == [5, 7, 5, 7, 0, 0] and R.read_ints(count) == [2]


# -- a GPT-2 decode step ---------------------------------------------------------------------------
def random_gpt2(seed: int, n_layer: int, n_head: int, head_dim: int, vocab: int, n_ctx: int) -> GPT2:
    rng = np.random.default_rng(seed)
    C = n_head * head_dim
    cfg = GPT2Config(vocab_size=vocab, n_positions=n_ctx, n_embd=C, n_layer=n_layer, n_head=n_head)
    arrays = {n: (rng.standard_normal(s.shape) * 0.3).astype(np.float32) for n, s in gpt2_names.tensors(cfg).items()}
    return GPT2.from_arrays(cfg, arrays, CPU)


@settings(max_examples=10, deadline=None)
@given(seed=seeds, n_layer=st.integers(1, 2), n_head=st.integers(1, 3), head_dim=st.integers(1, 8),
       rows=st.integers(1, 6), data=st.data())
def test_decode_step_replay_is_eager_bit_for_bit(seed, n_layer, n_head, head_dim, rows, data):
    """The batched decode step (the server's), captured once; each replay takes new ids, positions
    and slots and must give eager's logits and leave eager's caches."""
    vocab, n_ctx, slots = 50, 24, rows + 2
    m = random_gpt2(seed, n_layer, n_head, head_dim, vocab, n_ctx)
    rng = np.random.default_rng(seed)
    runner, eager_runner = m.runner(slots), m.runner(slots)
    cache, eager = runner.cache, eager_runner.cache
    for s in range(slots):  # the same prompt in both caches
        ids = rng.integers(0, vocab, 4).tolist()
        runner.prefill(s, ids)
        eager_runner.prefill(s, ids)
    state = StepBatch(*(R.int_tensor([0] * rows, CPU) for _ in range(3)))

    def step():
        logits = m.forward(state, cache)
        return logits, wt.argmax(logits)
    g = CPU.capture(step)
    length = [4] * slots
    for _ in range(data.draw(st.integers(1, 4))):
        ids = rng.integers(0, vocab, rows).tolist()
        slot = rng.permutation(slots)[:rows].tolist()
        pos = [length[s] for s in slot]
        for s in slot:
            length[s] += 1
        for t, v in ((state.ids, ids), (state.pos, pos), (state.slot, slot)):
            R.upload_ints(t, v)
        logits, best = g.replay()
        want = m.forward(StepBatch(R.int_tensor(ids, CPU), R.int_tensor(pos, CPU), R.int_tensor(slot, CPU)), eager)
        assert same(logits.numpy(), want.numpy())
        assert same(best.numpy(), wt.argmax(want).numpy())
    for a, b in zip(cache.k + cache.v, eager.k + eager.v, strict=True):
        for s in range(slots):  # (each sequence's positions, through its runner's block table)
            assert same(wt.cache_gather(a, s, length[s], cache.table).numpy(),
                        wt.cache_gather(b, s, length[s], eager.table).numpy())


def test_generate_with_graphs_equals_op_by_op():
    m = random_gpt2(3, 2, 2, 8, 64, 48)
    prompt = [1, 5, 9, 3]

    def pick(logits, pos):
        return int(np.argsort(logits)[-2])  # not the argmax: another path than greedy's

    def run(use_graph: bool, greedy: bool) -> list[int]:
        return list(generate(m.runner(1, use_graph=use_graph), prompt, 30, greedy, pick))
    for greedy in (True, False):
        assert run(True, greedy) == run(False, greedy)
    assert list(generate_batch(m.runner(2), [prompt, prompt[:2]], 12))  # the batch graph runs


def test_batched_engine_replays_graphs_on_the_cpu():
    from webtensor.models.gpt2.model import GPT2

    model = GPT2.from_pretrained(None, device=CPU)
    e = ModelEngine(model, 4)
    assert e.use_graph
    from webtensor.serve.engine import Row, Sampling

    first = e.step([Row(s, (1 + s, 2, 3), 0, Sampling()) for s in range(4)])
    e.step([Row(s, (first[s],), 3, Sampling()) for s in range(4)])
    assert all(isinstance(g.graph, CpuGraph) and g.graph.n_dispatches > 0 for g in e.runner._graphs.values())
    e.close()


# -- what a graph refuses ----------------------------------------------------------------------------
def test_capture_refuses_host_traffic():
    x = wt.tensor(np.ones(4, np.float32), device=CPU)
    for read in (lambda t: t.numpy(), lambda t: t.tobytes(), lambda t: CPU.backend.read_async(t), lambda t: t.tolist()):
        with pytest.raises(wt.GraphCaptureError, match="readback"):
            CPU.capture(lambda read=read: read(x + 1))
    with pytest.raises(wt.GraphCaptureError, match="upload into an existing tensor"):
        CPU.capture(lambda: CPU.backend.upload_into(x, np.zeros(4, np.float32).tobytes()))
    with pytest.raises(wt.GraphCaptureError, match="already being captured"):
        CPU.capture(lambda: CPU.capture(lambda: x + 1))
    g = CPU.capture(lambda: x + wt.tensor(np.ones(4, np.float32), device=CPU))  # a new tensor: a constant
    assert g.replay().numpy().tolist() == [2.0] * 4  # the device goes on working
    assert (x * 3).numpy().tolist() == [3.0] * 4
    g.release()
    with pytest.raises(wt.GraphCaptureError, match="released"):
        g.replay()


def test_capturing_runs_nothing_and_constants_are_made_afresh():
    state = wt.tensor(np.arange(4, dtype=np.float32), device=CPU)

    def fn():
        acc = wt.zeros((4,), device=CPU)
        wt.copy_into(acc, wt.add(acc, state))  # writes into its own constant
        wt.copy_into(state, wt.add(state, 1.0))
        return acc
    g = CPU.capture(fn)
    assert state.numpy().tolist() == [0, 1, 2, 3]  # not run
    assert g.replay().numpy().tolist() == [0, 1, 2, 3]
    assert g.replay().numpy().tolist() == [1, 2, 3, 4]  # acc zeroed again, as fn would make it
    assert state.numpy().tolist() == [2, 3, 4, 5]


def test_replayed_embedding_checks_its_ids():
    table = wt.tensor(np.ones((5, 3), np.float32), device=CPU)
    ids = wt.tensor(np.array([0, 4], np.int32), device=CPU)
    g = CPU.capture(lambda: wt.embedding(table, ids))
    assert g.replay().numpy().shape == (2, 3)
    R.upload_ints(ids, [1, 5])
    with pytest.raises(wt.ShapeError, match="id 5 is out of range for a table of 5 rows"):
        g.replay()
    with pytest.raises(wt.ShapeError, match="id -1 is out of range"):
        wt.embedding(table, wt.tensor(np.array([-1], np.int32), device=CPU))


def test_other_threads_run_eagerly_during_a_capture():
    x = wt.tensor(np.ones(3, np.float32), device=CPU)
    inside, outside = threading.Event(), threading.Event()
    got = []

    def other():
        inside.wait(10)
        got.append((x + 1).numpy().tolist())  # a readback: fine on this thread
        outside.set()

    t = threading.Thread(target=other)
    t.start()

    def fn():
        inside.set()
        outside.wait(10)
        return x * 2
    g = CPU.capture(fn)
    t.join()
    assert got == [[2.0] * 3] and g.names == ["constant", "mul"]  # (2: a constant)
