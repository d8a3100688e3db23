"""The scheduler in-process, on a recording fake engine: long prompts are read in request-fixed chunks
interleaved with the running sequences' decode rows; sequences leave when done; slots are released."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from webtensor.serve.engine import Row, Sampling
from webtensor.serve.scheduler import Generation, Scheduler


class _Tok:  # (serve.engine.Tokenizer)
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def token_bytes(self, i: int, *, skip_special_tokens: bool = True) -> bytes:
        return b"x"


class RecordingEngine:
    name, n_ctx, vocab_size, eos_ids, bos_id, chat_template = "fake", 512, 100, frozenset(), None, None

    def __init__(self, max_batch: int, delay: float = 0.0):
        self.max_batch, self.tokenizer, self.delay = max_batch, _Tok(), delay
        self.steps: list[list[Row]] = []
        self.released: list[int] = []
        self.length = [0] * max_batch

    def step(self, rows: Sequence[Row]) -> list[int | None]:
        assert len({r.slot for r in rows}) == len(rows)
        for r in rows:
            assert r.start == (0 if r.start == 0 else self.length[r.slot])  # rows continue their slot
            self.length[r.slot] = r.start + len(r.ids)
        self.steps.append(list(rows))
        time.sleep(self.delay)
        return [(r.next_position % 7) if r.sample else None for r in rows]

    def release(self, slot: int) -> None:
        self.released.append(slot)


async def _run(engine: RecordingEngine, jobs: list[tuple[float, int, int]]) -> list[str]:
    """jobs: (delay before submit, prompt length, max_tokens). Each job's text ("x" a token; events
    that waited for a slow consumer arrive joined)."""
    sched = Scheduler(engine, max_queue=64, prefill_chunk=64, prefill_budget=128)
    sched.start()

    async def one(delay: float, n_prompt: int, max_tokens: int) -> str:
        await asyncio.sleep(delay)
        g = Generation(list(range(1, n_prompt + 1)), max_tokens, Sampling())
        sched.submit(g)
        return "".join([ev.text async for ev in g.stream()])

    try:
        out = list(await asyncio.gather(*(one(*j) for j in jobs)))
        await asyncio.sleep(0.05)  # the last slots are released in the engine thread, just after
        return out
    finally:
        await sched.stop()


def test_long_prefill_is_chunked_and_interleaved_with_decode():
    eng = RecordingEngine(max_batch=4, delay=0.002)  # the short one runs ~60 steps of 2 ms
    out = asyncio.run(_run(eng, [(0, 3, 60), (0.01, 300, 5)]))
    assert [len(o) for o in out] == [60, 5]
    long_rows = [(i, r) for i, rows in enumerate(eng.steps) for r in rows if len(r.ids) > 3]
    assert [r.start for _, r in long_rows] == [0, 64, 128, 192, 256]  # cut from the request's start
    assert all(not r.sample for _, r in long_rows[:-1]) and long_rows[-1][1].sample
    for i, _ in long_rows:  # the short sequence decoded in every step the long prompt was read
        assert any(len(r.ids) == 1 for r in eng.steps[i])
    assert sorted(eng.released) == [0, 1]


def test_the_budget_holds_only_beside_decoding_sequences():
    """200-token prompts (chunks of 64, a budget of 128 tokens): three arriving at once with nothing decoding each
    read their next chunk every step (192 tokens a step); three arriving beside a decoding sequence share 128
    tokens a step (two chunks), the decoding one getting its token every step."""
    idle = RecordingEngine(max_batch=4, delay=0.002)
    asyncio.run(_run(idle, [(0, 200, 3), (0, 200, 3), (0, 200, 3)]))
    assert sorted(len(r.ids) for r in idle.steps[0]) == [64, 64, 64]
    busy = RecordingEngine(max_batch=4, delay=0.002)
    out = asyncio.run(_run(busy, [(0, 3, 80), (0.02, 200, 3), (0.02, 200, 3), (0.02, 200, 3)]))
    assert [len(o) for o in out] == [80, 3, 3, 3]
    reading = [rows for rows in busy.steps if any(len(r.ids) > 1 for r in rows)][1:]  # (the short one's own first)
    assert reading and all(any(len(r.ids) == 1 for r in rows) for rows in reading)
    assert max(sum(len(r.ids) for r in rows if len(r.ids) > 1) for rows in reading) == 128


def test_the_engine_names_the_chunk_and_budget():
    """An engine's `prefill_chunk` / `prefill_budget` (ModelEngine: its device's policy) are the scheduler's unless
    given; an engine naming none gets DEFAULT_PREFILL."""
    from webtensor.serve.scheduler import DEFAULT_PREFILL

    eng = RecordingEngine(max_batch=1)
    assert (Scheduler(eng, 1).prefill_chunk, Scheduler(eng, 1).prefill_budget) == DEFAULT_PREFILL
    eng.prefill_chunk, eng.prefill_budget = 512, 1024  # type: ignore[attr-defined]
    sched = Scheduler(eng, 1)
    assert (sched.prefill_chunk, sched.prefill_budget) == (512, 1024)
    assert Scheduler(eng, 1, prefill_chunk=32, prefill_budget=64).prefill_budget == 64


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 200), st.integers(1, 30)), min_size=1, max_size=10),
       st.integers(1, 4))
def test_every_request_gets_its_tokens_whatever_the_batch(jobs, max_batch):
    eng = RecordingEngine(max_batch)
    out = asyncio.run(_run(eng, [(0, n, m) for n, m in jobs]))
    assert [len(o) for o in out] == [m for _, m in jobs]
    assert max(len(rows) for rows in eng.steps) <= max_batch
    assert len(eng.released) == len(jobs)


def test_events_a_slow_consumer_missed_arrive_joined():
    from webtensor.serve.protocol import APIError
    from webtensor.serve.scheduler import Event

    async def main() -> list[Event]:
        g = Generation([1], 9, Sampling())
        for e in (Event("a", 1), Event("b", 1), Event("c", 1), Event(error=APIError(500, "boom"))):
            g.events.put_nowait(e)
        got = [ev async for ev in g.stream()]
        g2 = Generation([1], 9, Sampling())
        for e in (Event("a", 1), Event("", 1), Event("z", 1, "length"), Event("never", 1)):
            g2.events.put_nowait(e)
        return got + [ev async for ev in g2.stream()]

    a, err, b = asyncio.run(main())
    assert (a.text, a.tokens, a.finish, a.error) == ("abc", 3, None, None)
    assert err.error is not None and err.tokens == 0
    assert (b.text, b.tokens, b.finish) == ("az", 3, "length")  # nothing after the finish


class _Letters(_Tok):
    def token_bytes(self, i: int, *, skip_special_tokens: bool = True) -> bytes:
        return bytes([ord("a") + i])


def test_the_next_step_is_launched_before_the_tokens_are_streamed(monkeypatch):
    """Step N+1 goes to the engine as soon as step N's tokens are back; they are turned into text
    and events while it runs. A stop string found then has a row in N+1 already: that token is
    dropped (neither streamed nor counted) and the slot is released after it."""
    launched: list[int] = []
    emitted: list[tuple[int, int]] = []  # (steps launched so far, the token's index in its sequence)
    launch, emit = Scheduler._launch, Scheduler._emit

    def spy_launch(self, loop, work):
        launched.append(len(work))
        return launch(self, loop, work)

    def spy_emit(self, req, tok, ending):
        emitted.append((len(launched), len(req.generated) - 1))
        emit(self, req, tok, ending)

    monkeypatch.setattr(Scheduler, "_launch", spy_launch)
    monkeypatch.setattr(Scheduler, "_emit", spy_emit)
    eng = RecordingEngine(max_batch=2, delay=0.002)
    eng.tokenizer = _Letters()

    async def main() -> tuple[str, Generation, str, Generation]:
        sched = Scheduler(eng, max_queue=8)
        sched.start()
        try:
            long = Generation([1, 2], 8, Sampling())  # tokens (next_position % 7): 2 3 4 5 6 0 1 2 -> "cdefgabc"
            stop = Generation([1, 2], 8, Sampling(), stops=["f"])  # ends at its 4th token
            sched.submit(long)
            sched.submit(stop)
            texts = [("".join([ev.text async for ev in g.stream()])) for g in (long, stop)]
            await asyncio.sleep(0.05)
            return texts[0], long, texts[1], stop
        finally:
            await sched.stop()

    text, long, stopped, stop = asyncio.run(main())
    assert text == "cdefgabc" and len(long.generated) == 8
    assert stopped == "cde" and len(stop.generated) == 4  # "f" ended it; the token after was dropped
    rows_of = [sum(1 for rows in eng.steps for r in rows if r.slot == s) for s in (0, 1)]
    assert rows_of == [1 + 7, 1 + 4]  # the stopped one: prefill, 3 decode rows, 1 row already in flight
    firsts = [n for n, i in emitted if i == 0]
    assert all(n == 2 for n in firsts)  # token 0 (the prefill's) was streamed with the first decode step out
    assert all(n >= i + 2 for n, i in emitted if i < 7)  # every token but the last: the next step was out
    assert sorted(eng.released) == [0, 1]


class FollowingEngine(RecordingEngine):
    """RecordingEngine with the batched engine's launch / follow / collect: a followed step's rows
    take the step before's tokens as their ids, as the device's feedback does; a follow may launch
    several steps."""

    def __init__(self, max_batch: int, eos: int | None):
        super().__init__(max_batch)
        self.eos_ids, self.follows, self.multi = frozenset(() if eos is None else (eos,)), 0, 0
        self._last: tuple[list[Row], list[list[int | None]]] | None = None

    def launch(self, rows: Sequence[Row]) -> tuple[list[Row], list[list[int | None]]]:
        self._last = (list(rows), [self.step(rows)])
        return self._last

    def can_follow(self, rows: Sequence[Row], steps: int = 1) -> bool:
        return all(len(r.ids) == 1 and r.sample and r.start + steps < self.n_ctx for r in rows)

    def follow(self, prev, rows: Sequence[Row], steps: int = 1) -> tuple[list[Row], list[list[int | None]]]:
        assert prev is self._last, "follow continues the last launched step only"
        assert [(r.slot, r.start) for r in rows] == [(r.slot, r.start + len(prev[1])) for r in prev[0]]
        assert self.can_follow(rows, steps)
        self.follows += 1
        self.multi += steps > 1
        out, last = [], prev[1][-1]
        for i in range(steps):
            last = self.step([Row(r.slot, (t,), r.start + i, r.sampling) for r, t in zip(rows, last, strict=True)])
            out.append(last)
        self._last = (list(rows), out)
        return self._last

    def collect(self, h) -> list[list[int | None]]:
        return h[1]


async def _texts(engine, jobs: list[tuple[int, int]]) -> list[tuple[str, int, str | None]]:
    """jobs (prompt length, max_tokens), all at once: each one's (text, tokens, finish reason)."""
    sched = Scheduler(engine, max_queue=64)
    sched.start()

    async def one(n_prompt: int, max_tokens: int) -> tuple[str, int, str | None]:
        g = Generation(list(range(1, n_prompt + 1)), max_tokens, Sampling(), stops=["d"] if n_prompt == 5 else ())
        sched.submit(g)
        evs = [ev async for ev in g.stream()]
        return "".join(ev.text for ev in evs), sum(ev.tokens for ev in evs), evs[-1].finish

    try:
        out = list(await asyncio.gather(*(one(*j) for j in jobs)))
        await asyncio.sleep(0.05)
        return out
    finally:
        await sched.stop()


def _follow_check(jobs: list[tuple[int, int]], extra: int = 1) -> FollowingEngine:
    """Run `jobs` on a plain and a following engine: every request gets exactly the tokens, text and
    finish it gets step by step: none past an EOS (token 0, at next position 7), a stop string ("d",
    for 5-token prompts) or max_tokens, and no row past max_tokens either (after an EOS or a stop
    string at most `extra` in flight: 1, or with several steps a follow, the rest of its steps and
    the next follow's)."""
    plain, fol = RecordingEngine(max_batch=8), FollowingEngine(max_batch=8, eos=0)
    plain.eos_ids = frozenset({0})
    plain.tokenizer = fol.tokenizer = _Letters()
    want = asyncio.run(_texts(plain, jobs))
    got = asyncio.run(_texts(fol, jobs))
    assert got == want
    for slot in range(8):
        assert sum(1 for rows in fol.steps for r in rows if r.slot == slot) <= \
            sum(1 for rows in plain.steps for r in rows if r.slot == slot) + extra
    assert sorted(fol.released) == sorted(plain.released)
    return fol


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 20)), min_size=1, max_size=6))
def test_followed_steps_stream_what_plain_steps_stream(jobs):
    """With an engine that can follow, runs of greedy decode steps are queued two deep."""
    _follow_check(jobs)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 20)), min_size=1, max_size=6))
def test_several_steps_a_follow_stream_what_plain_steps_stream(jobs):
    from unittest import mock

    from webtensor.serve import scheduler

    with mock.patch.object(scheduler, "FOLLOW_STEPS_MIN_ROWS", 1):
        _follow_check(jobs, 2 * scheduler.FOLLOW_STEPS - 1)


def test_runs_of_greedy_decode_steps_are_followed():
    fol = _follow_check([(2, 20), (3, 4), (5, 9), (1, 30)])
    assert fol.follows >= 2


def test_many_rows_follow_several_steps_at_once(monkeypatch):
    from webtensor.serve import scheduler

    monkeypatch.setattr(scheduler, "FOLLOW_STEPS_MIN_ROWS", 3)
    extra = 2 * scheduler.FOLLOW_STEPS - 1
    fol = _follow_check([(1, 40), (2, 17), (3, 26), (4, 9), (1, 3)], extra)  # (EOS at next position 7)
    fol2 = _follow_check([(1, 40), (8, 30), (9, 23), (10, 31), (5, 12)], extra)  # (past 7: EOS at 14; a stop)
    assert fol.multi + fol2.multi >= 1


def test_admission_counts_running_and_waiting_and_a_cancelled_waiter_leaves_the_queue():
    from webtensor.serve.protocol import APIError

    async def main() -> list[str]:
        sched = Scheduler(RecordingEngine(max_batch=1, delay=0.005), max_queue=1)
        sched.start()
        got = []
        try:
            a, b, c = (Generation([1, 2], 40, Sampling()) for _ in range(3))
            sched.submit_all([a, b])  # (a burst: counted at once, before either is admitted to a slot)
            for g in (c,):
                try:
                    sched.submit(g)
                except APIError as e:
                    got.append(f"{e.status} {e.code}")
            try:
                sched.submit_all([Generation([1], 2, Sampling()) for _ in range(3)])
            except APIError as e:
                got.append(f"{e.status} {e.code}")
            sched.cancel(b)  # waiting: it leaves the queue at once
            sched.submit(c)
            got.append("c admitted")
            texts = ["".join([ev.text async for ev in g.stream()]) for g in (a, c)]
            got.append(f"{len(texts[0])} {len(texts[1])} {b.done} {sched.queued}")
        finally:
            await sched.stop()
        return got

    assert asyncio.run(main()) == ["429 queue_full", "400 too_many_prompts", "c admitted", "40 40 True 0"]
