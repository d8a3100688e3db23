"""The batched engine against the reference engine (its batch-invariance oracle): the same tokens for
many concurrent mixed requests (greedy and seeded sampling, prompts of 1 to 150 tokens read in
chunks, staggered arrivals, cancellations, slots released and reused), on the CPU and on lavapipe;
a step's rows bit for bit what each gets alone; bad rows refused with ArgumentErrors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from webtensor.errors import ArgumentError, ContextLengthError
from webtensor.models.gpt2.model import GPT2
from webtensor.runtime import runner as R
from webtensor.runtime.batch import StepBatch
from webtensor.serve.engine import ModelEngine, Row, Sampling


def BatchedEngine(model, n):  # noqa: N802
    return ModelEngine(model, n)


def ReferenceEngine(model, n):  # noqa: N802
    return ModelEngine(model, n, engine="reference")

CHUNK = 64


@pytest.fixture(scope="module")
def cpu_model():
    return GPT2.from_pretrained(None, device="cpu")


@pytest.fixture(scope="module")
def gpu_model(gpu):
    return GPT2.from_pretrained(None, device=gpu)


def _requests(n: int, seed: int, max_new: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        n_prompt = rng.choice([1, 2, 5, 17, 63, 64, 65, 100, 129, 150])
        if i % 3 == 0:
            s = Sampling()
        else:
            s = Sampling(rng.choice([0.7, 1.0, 1.3]), rng.choice([None, 40]), rng.choice([None, 0.9]), 1000 + i)
        out.append(dict(prompt=[rng.randrange(4096) for _ in range(n_prompt)], sampling=s,
                        n_new=rng.randint(1, max_new), arrive=0 if i % 5 else rng.randint(1, 8),
                        cancel=rng.randint(1, max_new) if i % 7 == 3 else None))
    return out


def drive(engine, reqs: list[dict], seed: int, widths: list[int] | None = None) -> list[list[int]]:
    """Run `reqs` through `engine` as the scheduler would (free slots taken in arrival order, prompts
    cut every CHUNK tokens from their start, one row per active sequence a step, rows shuffled);
    the tokens each request got. Finished or cancelled sequences release their slot at once."""
    rng = random.Random(seed)
    free = list(range(engine.max_batch))
    waiting = sorted(range(len(reqs)), key=lambda i: reqs[i]["arrive"])
    active: dict[int, dict] = {}
    got: list[list[int]] = [[] for _ in reqs]
    step = 0
    while waiting or active:
        while waiting and free and reqs[waiting[0]]["arrive"] <= step:
            i = waiting.pop(0)
            active[free.pop(0)] = dict(i=i, fed=0)
        rows = []
        for slot, st in active.items():
            r = reqs[st["i"]]
            if st["fed"] < len(r["prompt"]):
                chunk = tuple(r["prompt"][st["fed"]:st["fed"] + CHUNK])
                last = st["fed"] + len(chunk) == len(r["prompt"])
                rows.append(Row(slot, chunk, st["fed"], r["sampling"], sample=last))
            else:
                out = got[st["i"]]
                rows.append(Row(slot, (out[-1],), len(r["prompt"]) + len(out) - 1, r["sampling"]))
        rng.shuffle(rows)
        if widths is not None:
            widths.append(len(rows))
        for row, tok in zip(rows, engine.step(rows), strict=True):
            st = active[row.slot]
            r, out = reqs[st["i"]], got[st["i"]]
            if st["fed"] < len(r["prompt"]):
                st["fed"] += len(row.ids)
            if tok is not None:
                out.append(tok)
            if len(out) >= r["n_new"] or (r["cancel"] is not None and len(out) >= r["cancel"]):
                del active[row.slot]
                engine.release(row.slot)
                free.append(row.slot)
        step += 1
    return got


def _check_same(model, n: int, max_batch: int, max_new: int, seed: int) -> None:
    reqs = _requests(n, seed, max_new)
    widths: list[int] = []
    ref = drive(ReferenceEngine(model, max_batch), reqs, seed)
    engine = BatchedEngine(model, max_batch)
    assert engine.use_graph  # the replayed decode step, on the CPU as on WebGPU
    bat = drive(engine, reqs, seed, widths)
    assert bat == ref
    assert max(widths) == max_batch  # all slots busy at once
    assert sum(map(len, ref)) > n  # they really generated


def test_cpu_batched_equals_reference(cpu_model):
    _check_same(cpu_model, n=40, max_batch=32, max_new=12, seed=1)  # 32 at once, then slots reused


def test_step_shapes_are_few_and_their_graphs_bounded(cpu_model, monkeypatch):
    """bucket(): every width fits, padding bounded, few distinct shapes; with MAX_GRAPHS = 3 the
    engine releases the least recently used graphs and still gives the reference's tokens."""
    widths = [R.bucket(n) for n in range(1, 2049)]
    assert all(w >= n for n, w in zip(range(1, 2049), widths, strict=True))
    for n, w in zip(range(1, 2049), widths, strict=True):  # padding: < n, then 8, 64, 256 rows
        assert w - n < (n if n <= 8 else 8 if n <= 64 else 64 if n <= 512 else 256), (n, w)
    assert len(set(widths[:64])) == 11 and len(set(widths)) <= 32
    monkeypatch.setattr(R, "MAX_GRAPHS", 3)
    reqs = _requests(12, 5, 5)
    engine = BatchedEngine(cpu_model, 6)
    sizes: list[int] = []
    real = engine.runner._graph

    def spy(*a):
        g = real(*a)
        sizes.append(len(engine.runner._graphs))
        return g

    engine.runner._graph = spy
    assert drive(engine, reqs, 5) == drive(ReferenceEngine(cpu_model, 6), reqs, 5)
    assert max(sizes) == 3 and len(sizes) > 6
    stats = engine.graph_stats  # (what /health reports)
    assert stats["held"] == 3 and stats["captured"] > 3 and stats["capture_ms"] > 0


@pytest.mark.wgpu
def test_lavapipe_batched_equals_reference(gpu_model):
    _check_same(gpu_model, n=40, max_batch=32, max_new=6, seed=2)  # one forward of up to 32 rows a step


def _rows_alone_and_together(model, B: int) -> tuple[np.ndarray, np.ndarray]:
    dev = model.device
    runner = model.runner(B)
    rng = np.random.default_rng(0)
    lens = [3 + 5 * s for s in range(B)]
    for s in range(B):
        runner.prefill(s, rng.integers(0, 4096, lens[s]).tolist())
        runner.reserve(s, lens[s] + 1)  # (the rows below store at position lens[s])
    toks = rng.integers(0, 4096, B).tolist()

    def rows(slots: list[int]) -> np.ndarray:
        with dev.dispatch_scope():
            batch = StepBatch(R.int_tensor([toks[s] for s in slots], dev), R.int_tensor([lens[s] for s in slots], dev),
                              R.int_tensor(slots, dev))
            return model.forward(batch, runner.cache).numpy()
    together = rows(list(range(B)))
    alone = [rows([s])[0] for s in range(B)]
    return together, np.stack(alone)


def test_cpu_rows_bit_identical_to_alone(cpu_model):
    together, alone = _rows_alone_and_together(cpu_model, 32)
    assert np.array_equal(together, alone)


@pytest.mark.wgpu
def test_lavapipe_rows_bit_identical_to_alone(gpu_model):
    together, alone = _rows_alone_and_together(gpu_model, 32)
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("make", [ReferenceEngine, BatchedEngine], ids=["reference", "batched"])
def test_bad_rows_are_argument_errors(cpu_model, make):
    e = make(cpu_model, 2)
    greedy = Sampling()
    for slot in (-1, 2):
        with pytest.raises(ArgumentError, match=f"slot {slot} is out of range for 2 slots"):
            e.step([Row(slot, (1, 2), 0, greedy)])
    with pytest.raises(ArgumentError, match="slot 0 holds 0 tokens, the row starts at 3"):
        e.step([Row(0, (5,), 3, greedy)])
    tok = e.step([Row(0, (1, 2, 3), 0, greedy)])[0]
    assert isinstance(tok, int)
    with pytest.raises(ArgumentError, match="slot 0 holds 3 tokens, the row starts at 4"):
        e.step([Row(0, (tok,), 4, greedy)])
    assert e.step([Row(0, (tok,), 3, greedy)])[0] is not None
    e.release(0)
    with pytest.raises(ArgumentError, match="slot 0 holds 0 tokens, the row starts at 4"):
        e.step([Row(0, (tok,), 4, greedy)])


def test_batched_step_is_checked_whole(cpu_model):
    e = BatchedEngine(cpu_model, 3)
    greedy = Sampling()
    a, b = e.step([Row(0, (1, 2), 0, greedy), Row(1, (3,), 0, greedy)])
    with pytest.raises(ArgumentError, match="slot 0 has two rows in one step"):
        e.step([Row(0, (a,), 2, greedy), Row(0, (a,), 2, greedy)])
    with pytest.raises(ArgumentError, match="slot 1 holds 1 tokens, the row starts at 5"):
        e.step([Row(0, (a,), 2, greedy), Row(1, (b,), 5, greedy)])
    with pytest.raises(ContextLengthError):
        e.step([Row(2, tuple(range(e.n_ctx + 1)), 0, greedy)])
    with pytest.raises(ArgumentError):
        e.release(3)
    # nothing ran: slot 0 still holds 2 tokens and continues as if the bad steps never were
    ref = ReferenceEngine(cpu_model, 3)
    assert ref.step([Row(0, (1, 2), 0, greedy), Row(1, (3,), 0, greedy)]) == [a, b]
    assert e.step([Row(0, (a,), 2, greedy)]) == ref.step([Row(0, (a,), 2, greedy)])


def _follow_equals_steps(model) -> None:
    """`follow` (the next step launched before this one's tokens are read, its inputs fed back on
    the device) gives the tokens that stepping one at a time gives; bad follows are refused."""
    greedy = Sampling()
    prompts = [Row(0, (5, 6, 7), 0, greedy), Row(1, (9,), 0, greedy), Row(2, tuple(range(20, 31)), 0, greedy)]
    ref, e = BatchedEngine(model, 4), BatchedEngine(model, 4)
    first = ref.step(prompts)
    assert e.step(prompts) == first
    want, last = [], first
    for k in range(7):  # reference: step by step, each step's tokens fed in by the host
        last = ref.step([Row(p.slot, (t,), len(p.ids) + k, greedy) for p, t in zip(prompts, last, strict=True)])
        want.append(last)
    rows = [Row(p.slot, (t,), len(p.ids), greedy) for p, t in zip(prompts, first, strict=True)]
    handles = [e.launch(rows)]
    for steps in (1, 3, 2):  # 1 + 1 + 3 + 2 steps
        rows = [Row(r.slot, (0,), r.start + handles[-1].steps, greedy) for r in rows]  # ids unread: fed back
        assert e.can_follow(rows, steps)
        handles.append(e.follow(handles[-1], rows, steps))
    assert [t for h in handles for t in e.collect(h)] == want

    with pytest.raises(ArgumentError, match="previous step's, moved on by its steps"):
        e.follow(handles[-1], rows)  # the same positions again
    with pytest.raises(ArgumentError, match="last launched step"):
        e.follow(handles[0], [Row(r.slot, (0,), r.start + 2, greedy) for r in rows])  # not the last
    with pytest.raises(ArgumentError, match=f"1 to {R.RING_STEPS}"):
        e.follow(handles[-1], [Row(r.slot, (0,), r.start + 2, greedy) for r in rows], R.RING_STEPS + 1)
    chunk = e.launch([Row(3, (1, 2), 0, greedy)])  # a prompt chunk's step does not feed back
    with pytest.raises(ArgumentError, match="one-token choosing rows only"):
        e.follow(chunk, [Row(3, (0,), 2, greedy)])
    e.collect(chunk)
    assert not e.can_follow([Row(0, (1,), 7, Sampling(0.8, None, None, 1))])  # sampling: host-side
    assert not e.can_follow([Row(0, (1,), e.n_ctx - 1, greedy)])  # no room for one more position
    assert e.can_follow([Row(0, (1,), e.n_ctx - 4, greedy)], 3) and not e.can_follow(
        [Row(0, (1,), e.n_ctx - 4, greedy)], 4)
    # the refused follows changed nothing: the sequences go on as the reference's
    nxt = [Row(r.slot, (t,), r.start + 2, greedy) for r, t in zip(rows, want[-1], strict=True)]
    assert e.step(nxt) == ref.step(nxt)


def test_cpu_follow_equals_steps(cpu_model):
    _follow_equals_steps(cpu_model)


@pytest.mark.wgpu
def test_lavapipe_follow_equals_steps(gpu_model):
    _follow_equals_steps(gpu_model)
