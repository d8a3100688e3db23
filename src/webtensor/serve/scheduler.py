"""Continuous batching: one asyncio scheduler owns the engine (and so the device).

Each step the scheduler admits waiting requests into free slots, then gives the engine one row per
active sequence: a decode token for each running sequence and a prefill chunk (at most
`prefill_chunk` tokens) for each arriving one; while sequences are decoding, a step reads at most
`prefill_budget` prompt tokens (at least one chunk), so running streams keep flowing while long
prompts are read, and with nothing decoding every arriving prompt reads its next chunk. Both numbers
are the engine's (`ModelEngine`: its device's policy, `runtime.runner.prefill_policy`: on a GPU
chunks of 512 tokens, each one replayed graph) unless given. The engine runs in one worker thread; the
event loop stays free for HTTP. Step N+1 is handed to the engine as soon as step N's tokens are
back, and step N's tokens become text and events while it runs (see `_run`): the device does not
wait for the streaming; with an engine that can `follow`, runs of greedy decode steps are queued
before the step before is read, several steps a launch at 16 rows or more. Sequences leave as
soon as they finish, are cancelled (a client that went away) or fail; their slots are released
before the next step runs.

Chunk boundaries depend only on the request (its prompt is cut every `prefill_chunk` tokens from the
start), never on the load, so a request computes the same thing alone or in company.

KV memory (an engine with a paged pool: `kv_blocks`, `block_size`; docs/design-kv.md): the scheduler owns the
pool's bookkeeping (`runtime.blocks.BlockManager`) and gives each row its sequence's blocks (`Row.blocks`).

- Admission by blocks: a waiting request is admitted when a slot is free and the pool can give the blocks of its
  whole prompt (after the prefix cache's hits) and still keep a watermark (1 % of the pool) free; so prompt chunks
  never wait for memory.
- Sliding windows (an engine whose model slides on every layer: `kv_window`, its largest window): before each
  step a sequence gives back its blocks behind the window of its next position (`runtime.blocks.stale_blocks`;
  HOLE in its list and table row, which no kernel reads; the computed ones stay in the prefix cache), so it holds
  at most the window's blocks and a step's (`runtime.blocks.held_blocks`) however long it grows. Admission then
  asks for what the sequence will hold at most while it reads its prompt and gives it the blocks of its first
  chunk; later chunks take theirs as they come (growing, or preempting as decode rows do), and the keys of the
  prompt blocks it has still to take are promised: a prompt continuing into one waits, as for a pending block, so
  requests arriving together with one long system prompt still compute it once.
- Growth and preemption: a decoding sequence takes a block every `block_size` tokens (before the step, or the run
  of followed steps, that reaches it). When none is left, the most recently admitted running sequence is
  preempted (vLLM's recompute): its blocks go back (its computed full blocks stay in the prefix cache), it goes
  back to the head of the queue, and when readmitted it reads its prompt and the tokens it generated as a prompt
  (chunks at multiples of `prefill_chunk` from its start) and goes on: its sampling draws depend on (seed,
  position) only and its penalties and grammar are rebuilt from its tokens (`Row.history`), so it gives the
  tokens of an uninterrupted run. A request is never failed for memory: the oldest running one always progresses
  (a request the whole pool cannot hold is refused when it arrives: serve/app.py).
- Prefix caching (an engine with `prefix_reuse`): a prompt's full blocks are found by the hash of the tokens up to
  them (`BlockManager.lookup`) and shared, never copied; at most all but the prompt's last token is reused (that one
  runs for its logits), and chunks still end at multiples of `prefill_chunk` from the prompt's start, so its
  numbers are a cold run's bit for bit. A prompt's blocks are registered when it is admitted, pending until the
  step that computes them has run: a request whose prompt continues into pending blocks waits (others behind it
  are admitted meanwhile) and then shares them, so requests arriving together with one long system prompt
  compute it once. `/metrics` counts the tokens looked up and reused, and the pool's blocks. A request asking for
  its prompt's log-probabilities (echo) reads its whole prompt.

A step that raises fails the requests that were in it (each gets an error event) and the scheduler
goes on with the rest; a row whose token could not be chosen (the engine's `RowError`) fails its
own request alone, every other row of that step streams on as if it had been alone.

Admission is counted when a request is submitted: at most `max_batch` running plus `max_queue`
waiting, the rest refused at once (429), however many arrive together. `begin_drain()` stops
admission of new requests (503); running ones finish, and `abort()` ends whatever is still running
(the drain's grace period is over) with an error event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..runtime.blocks import HOLE, ROOT, BlockManager, block_keys, held_blocks, stale_blocks
from ..runtime.logprobs import TokenLogprob
from .engine import Engine, Picked, Row, RowError, Sampling, Token, follows, launches
from .metrics import Metrics
from .protocol import APIError, FinishReason
from .textstream import TextStream

log = logging.getLogger("webtensor.serve")


@dataclass
class Event:
    """What a request's consumer receives: new text (possibly empty) for `tokens` new tokens; the last
    event has `finish` (or `error`)."""

    text: str = ""
    tokens: int = 0
    finish: FinishReason | None = None
    error: APIError | None = None
    logprobs: list[TokenLogprob] | None = None  # the tokens' reports, where the request asked for them


class Generation:
    """One sequence to generate: its prompt, limits and sampling, and the events it produces."""

    _ids = itertools.count()

    def __init__(self, prompt: Sequence[int], max_tokens: int, sampling: Sampling, stops: Sequence[str] = (),
                 ignore_eos: bool = False, echo: bool = False, grammar: str | None = None,
                 shown: frozenset[int] = frozenset()):
        """`echo`: report the prompt's own log-probabilities (`prompt_logprobs`, None for the first token);
        `grammar`: the llguidance grammar its tokens follow (`sampling.constrained`); `shown`: special tokens
        whose text stays in the sequence's text (a tool format's markers, which its parser reads)."""
        self.id = next(self._ids)
        self.prompt, self.max_tokens, self.sampling = tuple(prompt), max_tokens, sampling
        self.ignore_eos, self.echo, self.grammar = ignore_eos, echo, grammar
        self.prompt_logprobs: list[TokenLogprob | None] = [None] if echo else []
        self.stop_ids = frozenset(sampling.stop_token_ids)
        self.shown = shown
        self.reused = 0  # prompt tokens found in the prefix cache (not computed again)
        self.logprobs_pending: deque[TokenLogprob] = deque()  # reports of generated tokens not yet streamed
        self.reported: list[TokenLogprob] = []  # reports of the streamed tokens
        self.text = TextStream(stops)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.slot: int | None = None
        self.fed = 0  # tokens (the prompt's, then the generated ones) whose keys and values the cache holds
        self.blocks: list[int] = []  # its KV blocks, in position order (an engine with a paged pool; HOLE: given back)
        self.reading = 0  # (since admitted) the tokens it reads as a prompt: its context when admitted
        self._keys: list[tuple[int, tuple[int, ...]]] = []  # the prefix keys of its context's first full blocks
        self.ready = 0  # of them, the ones whose computing has been seen done (their prefix-cache entries ready)
        self.admitted = -1  # when it was (last) admitted: preemption takes the latest first
        self.started = False  # its first row (since it was last admitted) is planned
        self.preemptions = 0
        self.generated: list[int] = []  # (tokens past a stop string, in flight when it was found, too)
        self.streamed = 0  # tokens streamed: the completion's tokens (usage counts these)
        self.cancelled = self.done = False
        self.ending: str | None = None  # "eos" or "length": its last token is generated (not yet streamed)
        self.arrived = time.perf_counter()
        self.last_token_at: float | None = None

    def context(self) -> tuple[int, ...]:
        """Every token known: the prompt and the generated ones."""
        return self.prompt + tuple(self.generated)

    def block_keys(self, n: int, block_size: int) -> list[tuple[int, tuple[int, ...]]]:
        """The prefix keys of the first `n` full blocks of its context (`runtime.blocks.block_keys`; its context only
        grows, so they are computed once)."""
        have = len(self._keys)
        if n > have:
            parent = hash(self._keys[-1]) if self._keys else ROOT
            self._keys += block_keys(self.context()[have * block_size:n * block_size], block_size, parent)
        return self._keys[:n]

    def finish_now(self, finish: FinishReason = "length") -> None:
        """End before any token (max_tokens 0): the one event, nothing to run."""
        self.done = True
        self.events.put_nowait(Event(finish=finish))

    async def stream(self) -> AsyncIterator[Event]:
        """The events, until the last one. Events already waiting when one is taken (the consumer fell
        behind the engine) are joined into one: their text and tokens in order, the last one's finish;
        an error is never joined (it follows what came before it)."""
        while True:
            ev = await self.events.get()
            while ev.finish is None and ev.error is None and not self.events.empty():
                nxt = self.events.get_nowait()
                if nxt.error is not None:
                    yield ev
                    ev = nxt
                    break
                lps = None if ev.logprobs is None and nxt.logprobs is None else \
                    [*(ev.logprobs or ()), *(nxt.logprobs or ())]
                ev = Event(ev.text + nxt.text, ev.tokens + nxt.tokens, nxt.finish, logprobs=lps)
            yield ev
            if ev.finish is not None or ev.error is not None:
                return


@dataclass
class _Step:
    """A step handed to the engine: its (sequence, row) pairs, when, and the engine's handle for it
    (engines with `launch`/`collect`), its tokens (engines with only `step`), or the error its
    start raised."""

    work: list[tuple[Generation, Row]]  # (the first step's rows, for followed steps)
    t0: float
    steps: int = 1  # followed steps launched as one
    handle: Any = None
    tokens: list[Token] | None = None
    error: Exception | None = None


DEFAULT_PREFILL = (64, 256)  # (chunk, budget) for an engine that names none
FOLLOW_STEPS = 4  # steps one follow launches at 16 rows or more (fewer rows: one a follow)
FOLLOW_STEPS_MIN_ROWS = 16


def _moved_on(work: list[tuple[Generation, Row]], n: int) -> list[tuple[Generation, Row]]:
    """The rows of the step `n` after `work` for the same sequences (their tokens: fed back on the device)."""
    return work if n == 0 else [(req, Row(row.slot, (0,), row.start + n, row.sampling,
                                          blocks=None if row.blocks is None else tuple(req.blocks)))
                                for req, row in work]


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int, metrics: Metrics | None = None,
                 prefill_chunk: int | None = None, prefill_budget: int | None = None):
        """`prefill_chunk`, `prefill_budget`: None for the engine's (its attributes of those names), else
        DEFAULT_PREFILL's."""
        self.engine, self.max_queue = engine, max_queue
        self.metrics = metrics or Metrics()
        chunk, budget = (getattr(engine, k, d) for k, d in zip(("prefill_chunk", "prefill_budget"), DEFAULT_PREFILL,
                                                                strict=True))
        self.prefill_chunk: int = int(prefill_chunk or chunk)
        self.prefill_budget: int = int(prefill_budget or budget)
        self._waiting: deque[Generation] = deque()
        self._active: dict[int, Generation] = {}
        self._free = list(range(engine.max_batch - 1, -1, -1))  # pop() gives slot 0 first
        self._to_release: list[int] = []  # slots whose sequences are done (released before the next step)
        # the KV pool's bookkeeping (an engine with a paged pool), prefix caching where the engine reuses prefixes
        self.reuse = bool(getattr(engine, "prefix_reuse", False))
        n_blocks: int | None = getattr(engine, "kv_blocks", None)
        self.kv = None if n_blocks is None else BlockManager(n_blocks, getattr(engine, "block_size"),  # noqa: B009
                                                             prefix_caching=self.reuse)
        self.watermark = 0 if n_blocks is None else max(1, n_blocks // 100)  # blocks admission keeps free
        # every layer's window where all slide (the blocks behind a sequence's window are given back), and the most
        # positions one step adds to a sequence (a prompt chunk, or a follow's steps)
        self.kv_window: int | None = getattr(engine, "kv_window", None) if self.kv is not None else None
        self.step_rows = max(self.prefill_chunk, FOLLOW_STEPS)
        # (a windowed model, prefix caching) the keys of the full prompt blocks a running sequence has still to take
        # and compute, by that sequence: a prompt continuing into one waits for it, as for a pending block
        self._promised: dict[tuple[int, tuple[int, ...]], Generation] = {}
        self._admissions = itertools.count()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="webtensor-engine")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.draining = False
        self.steps = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="webtensor-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for r in [*self._waiting, *self._active.values()]:
            r.events.put_nowait(Event(error=APIError(503, "the server is shutting down", code="shutdown")))
        self._executor.shutdown(wait=True)

    def begin_drain(self) -> None:
        """Refuse new requests from now on; those admitted or waiting run to the end."""
        self.draining = True

    def abort(self, message: str) -> int:
        """End every running and waiting request now with an error event (503, `message`): the
        drain's grace period is over. Their streams then close with the error and [DONE]. How many."""
        reqs = [r for r in [*self._waiting, *self._active.values()] if not r.done]
        self._waiting.clear()
        err = APIError(503, message, code="shutdown")
        for r in reqs:
            self._retire(r, Event(error=err), "error")
        self.metrics.queue_depth.set(0)
        self._poke()
        return len(reqs)

    # -- requests ---------------------------------------------------------------------------------
    def submit(self, req: Generation) -> None:
        self.submit_all([req])

    def submit_all(self, reqs: Sequence[Generation]) -> None:
        """Admit `reqs` together (one request's prompts) or refuse them all: 503 while draining, 429
        when the running and waiting sequences already fill `max_batch` + `max_queue`."""
        if self.draining:
            raise APIError(503, "the server is shutting down and takes no new requests", code="shutdown")
        room = self.engine.max_batch + self.max_queue
        if len(reqs) > room:
            raise APIError(400, f"{len(reqs)} prompts in one request is more than this server holds at once "
                           f"({self.engine.max_batch} running + {self.max_queue} queued)", param="prompt",
                           code="too_many_prompts")
        if len(self._active) + len(self._waiting) + len(reqs) > room:
            raise APIError(429, f"the server is busy: {len(self._active)} running, {len(self._waiting)} queued "
                           f"(--max-queue {self.max_queue}); retry later", code="queue_full",
                           headers={"Retry-After": "1"})
        for req in reqs:
            self._waiting.append(req)
            self.metrics.prompt_tokens.inc(len(req.prompt))
            self.metrics.request_prompt.observe(len(req.prompt))
        self.metrics.queue_depth.set(len(self._waiting))
        self._poke()

    def cancel(self, req: Generation) -> None:
        """The client went away: free its slot at the next step boundary (a waiting request leaves
        the queue at once, so it no longer counts against --max-queue)."""
        if req.done:
            return
        req.cancelled = True
        if req.slot is None and req in self._waiting:
            self._waiting.remove(req)
            self._retire(req, None, "abort")
            self.metrics.queue_depth.set(len(self._waiting))
        self._poke()

    def finished_empty(self, req: Generation) -> None:
        """`req` asked for no tokens (max_tokens 0): it ends at once, without a slot; counted as such."""
        req.finish_now("length")
        self.metrics.finished.labels("length").inc()
        self.metrics.request_prompt.observe(len(req.prompt))
        self.metrics.request_generation.observe(0)

    def needs_run(self, req: Generation) -> bool:
        """Whether `req` runs on the engine: it generates, or its prompt's log-probabilities are asked for."""
        return req.max_tokens > 0 or req.echo

    @property
    def active(self) -> int:
        return len(self._active)

    def kv_stats(self) -> dict[str, Any] | None:
        """The KV pool (/health): its blocks and their states, the most held at once so far (`peak`), the kv dtype,
        every layer's window where all slide and the most blocks a whole context then holds, preemptions so far;
        None without one."""
        kv = self.kv
        if kv is None:
            return None
        return {"dtype": getattr(self.engine, "kv_dtype", None), "block_size": kv.block_size, "blocks": kv.n_blocks,
                "used": kv.used, "cached": kv.cached, "free": kv.free - kv.cached, "peak": kv.peak,
                "window": self.kv_window, "sequence_blocks": self.held_most(self.engine.n_ctx),
                "preemptions": int(self.metrics.preemptions._value.get())}

    def held_most(self, positions: int) -> int:
        """The most KV blocks a sequence of `positions` positions holds at once (all of them, or where every layer
        slides its window's and a step's: `runtime.blocks.held_blocks`)."""
        assert self.kv is not None
        return held_blocks(positions, self.kv.block_size, self.kv_window, self.step_rows)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------------------
    # Step N+1 is planned and handed to the engine as soon as step N's tokens are back, before
    # they are turned into text and events: the device computes while the host streams. Planning
    # needs only each sequence's new token and whether its length or EOS ended it (`_commit`);
    # a stop string is found while step N+1 runs (`_emit`), so a sequence it ends has already
    # got a row in N+1, whose token is dropped (its slot is released after that step).
    # With an engine that can `follow` (the batched engine: greedy decode rows whose graph feeds
    # its tokens back on the device), a step of greedy decode rows is followed by the next before
    # its own tokens are read, when nothing else would change the batch: the device then never
    # waits for the host to read, plan and launch. At FOLLOW_STEPS_MIN_ROWS rows or more, one
    # follow launches FOLLOW_STEPS steps (read back at once, their tokens streamed together): the
    # host's work a step (the readback, this loop, a send per stream) is then shared by several.
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        cur: _Step | None = None
        while True:
            if cur is None:
                self._wake.clear()
                self._admit()
                work = self._plan()
                if not work and not self._to_release:
                    await self._wake.wait()
                    continue
                cur = self._launch(loop, work)
            k = self._follow_steps(cur)
            nxt = self._launch(loop, _moved_on(cur.work, cur.steps), cur, k) if k else None
            try:
                results = await loop.run_in_executor(self._executor, self._finish, cur)
            except Exception as e:  # the engine failed: only this step's requests fail
                log.exception("engine step failed (%d rows)", len(cur.work))
                self.metrics.step_failures.inc()
                err = APIError(500, f"the engine failed during a step: {type(e).__name__}: {e}",
                               code="engine_error")
                for req, _ in cur.work:
                    self._retire(req, Event(error=err), "error")
                if nxt is not None:  # (it followed the failed step: its tokens mean nothing)
                    await asyncio.gather(loop.run_in_executor(self._executor, self._finish, nxt),
                                         return_exceptions=True)
                cur = None
                continue
            done = []
            for i, tokens in enumerate(results):  # (several for followed steps: in order)
                if cur.work:
                    self.steps += 1
                    self.metrics.step_seconds.observe((time.perf_counter() - cur.t0) / len(results))
                    self.metrics.batch_size.observe(len(cur.work))
                    self.metrics.step_tokens.observe(sum(len(row.ids) for _, row in cur.work))
                for (req, row), tok in zip(_moved_on(cur.work, i), tokens, strict=True):
                    if self._commit(req, row, tok):
                        kept = tok.token if isinstance(tok, Picked) else tok
                        if not isinstance(kept, RowError):  # (_commit takes none: it fails the sequence)
                            done.append((req, kept, req.ending))  # (the ending this token brought, if any)
            if nxt is not None:
                cur = nxt
            else:
                self._admit()
                work = self._plan()
                cur = self._launch(loop, work) if work or self._to_release else None
            for req, tok, ending in done:
                self._emit(req, tok, ending)

    def _launch(self, loop: asyncio.AbstractEventLoop, work: list[tuple[Generation, Row]],
                prev: _Step | None = None, steps: int = 1) -> _Step:
        """Queue a step's start on the engine thread (the slots to release first; `prev`: the step
        it follows, `steps` steps of it); `_finish` collects its tokens."""
        releases, self._to_release = self._to_release, []
        step = _Step(work, time.perf_counter(), steps)
        loop.run_in_executor(self._executor, self._start, releases, step, prev)
        return step

    def _start(self, releases: list[int], step: _Step, prev: _Step | None) -> None:
        """On the engine thread: the releases, then the step launched (or, for an engine with only
        `step`, run: its tokens)."""
        try:
            for slot in releases:
                self.engine.release(slot)
            rows = [row for _, row in step.work]
            engine = self.engine
            if prev is not None and follows(engine):  # (prev: only where `_follow_steps` found it can)
                step.handle = engine.follow(prev.handle, rows, step.steps)
            elif rows and launches(engine):
                step.handle = engine.launch(rows)
            else:
                step.tokens = self.engine.step(rows) if rows else []
        except Exception as e:  # raised by _finish, on the scheduler's side
            step.error = e

    def _finish(self, step: _Step) -> list[list[Token]]:
        """On the engine thread, after `_start`: the tokens, per step (one, unless followed steps)."""
        if step.error is not None:
            raise step.error
        if step.tokens is not None or not launches(self.engine):
            return [step.tokens or []]
        return self.engine.collect(step.handle)

    def _follow_steps(self, cur: _Step) -> int:
        """How many steps to follow `cur` with (0: none): the same sequences moved on, whatever
        their tokens, when nobody waits to join or to be released and no sequence may end by its
        length within them (an EOS or stop string may still end one: the tokens after it are
        dropped)."""
        if not follows(self.engine) or not cur.work or self._waiting or self._to_release:
            return 0
        k = FOLLOW_STEPS if len(cur.work) >= FOLLOW_STEPS_MIN_ROWS else 1
        for req, row in cur.work:
            if req.done or req.cancelled or req.ending is not None:
                return 0
            if len(row.ids) != 1 or req.fed < len(req.prompt):
                return 0
            k = min(k, req.max_tokens - len(req.generated) - cur.steps)  # (cur's tokens not yet in)
        for req, row in cur.work:  # (the steps queued before read what they read: the device runs them in order)
            self._drop_stale(req, row.start + cur.steps)
        while k >= 1 and not self._reserve([(req, row.start + cur.steps + k) for req, row in cur.work]):
            k //= 2  # (the blocks the followed steps reach, where the pool has them)
        rows = [row for _, row in _moved_on(cur.work, cur.steps)]
        while k >= 1 and not self.engine.can_follow(rows, k):
            k //= 2
        return max(k, 0)

    # -- KV blocks --------------------------------------------------------------------------------
    def _reserve(self, needs: list[tuple[Generation, int]]) -> bool:
        """Grow each sequence's blocks to hold `positions` positions, all or none: False where the pool has too few
        (nothing taken). True without a pool."""
        kv = self.kv
        if kv is None:
            return True
        more = [(req, kv.blocks_for(n) - len(req.blocks)) for req, n in needs]
        if sum(m for _, m in more if m > 0) > kv.free:
            return False
        for req, m in more:
            if m > 0:
                self._grow(req, m)
        return True

    def _grow(self, req: Generation, n: int) -> None:
        """`n` more blocks at the end of `req`'s list; those that hold full blocks of the tokens it reads as a prompt
        are registered in the prefix cache, pending until the step that computes them has run."""
        kv = self.kv
        assert kv is not None
        first = len(req.blocks)
        req.blocks += kv.allocate(n)
        full = min(len(req.blocks), req.reading // kv.block_size)
        if first < full:
            keys = req.block_keys(full, kv.block_size)[first:]
            kv.register(req.blocks[first:full], keys, ready=False)
            for k in keys:  # (promised at admission: registered now)
                if self._promised.get(k) is req:
                    del self._promised[k]

    def _drop_stale(self, req: Generation, start: int) -> None:
        """Give back `req`'s blocks that no layer reads from position `start` on (every layer slides: they are
        behind its window); those computed whose tokens are known go to the prefix cache like any full block
        (cached: a later prompt may find them), the others to the free list."""
        kv = self.kv
        if kv is None or self.kv_window is None:
            return
        n = min(stale_blocks(start, self.kv_window, kv.block_size), len(req.blocks))
        if n == 0 or req.blocks[n - 1] == HOLE:  # (the holes are the list's first entries)
            return
        known = min(n, req.fed // kv.block_size)  # (followed steps in flight: computed, their tokens not yet read)
        kv.register(req.blocks[:known], req.block_keys(known, kv.block_size))
        kv.release_front(req.blocks, n)

    def _grow_or_preempt(self, work: list[tuple[Generation, Row]]) -> list[tuple[Generation, Row]]:
        """Blocks for every row's positions, the oldest sequences first; where the pool is out, the latest admitted
        running sequence is preempted (possibly the one asking), until each remaining row fits. The rows that
        remain, with their blocks."""
        if self.kv is None:
            return work
        for req, row in work:  # (first what no row reads any more: behind the windows)
            self._drop_stale(req, row.start)
        out = []
        for req, row in sorted(work, key=lambda w: w[0].admitted):
            while req.slot is not None and not self._reserve([(req, row.next_position)]):
                self._preempt(max((r for r in self._active.values() if r.ending is None), key=lambda r: r.admitted))
            if req.slot is not None:
                out.append((req, row))
        return [(req, dataclasses.replace(row, blocks=tuple(req.blocks)))
                for req, row in sorted(out, key=lambda w: w[1].slot)]

    def _preempt(self, req: Generation) -> None:
        """Take `req` off the device (vLLM's recompute): its blocks back to the pool (the computed full ones kept in
        the prefix cache), its slot freed, and it first in the queue, to read its tokens again when readmitted."""
        log.info("sequence %d preempted at %d tokens (KV cache full)", req.id, req.fed)
        self.metrics.preemptions.inc()
        req.preemptions += 1
        self._give_back(req, req.context()[:req.fed])
        del self._active[req.slot]  # type: ignore[arg-type]
        self._to_release.append(req.slot)  # type: ignore[arg-type]
        self._free.append(req.slot)  # type: ignore[arg-type]
        req.slot, req.fed, req.ready, req.started = None, 0, 0, False
        if req.echo and len(req.prompt_logprobs) < len(req.prompt):  # (its prompt's reports: computed again)
            req.prompt_logprobs = [None]
        self._waiting.appendleft(req)

    def _give_back(self, req: Generation, held: tuple[int, ...]) -> None:
        """`req`'s blocks back to the pool; the full ones of `held` (the tokens its cache holds, computed) stay in
        the prefix cache, registrations of blocks it had not computed are dropped."""
        kv = self.kv
        if kv is None or not req.blocks:
            return
        for k in req.block_keys(req.reading // kv.block_size, kv.block_size) if self._promised else ():
            if self._promised.get(k) is req:  # (blocks it will not compute now)
                del self._promised[k]
        computed = len(held) // kv.block_size
        kv.forget(req.blocks[computed:])
        kv.register(req.blocks[:computed], req.block_keys(computed, kv.block_size))
        kv.release(req.blocks)
        req.blocks = []

    def _pool_metrics(self) -> None:
        kv = self.kv
        if kv is not None:
            m = self.metrics
            m.kv_usage.set(kv.used / kv.n_blocks)
            m.kv_blocks.labels("used").set(kv.used)
            m.kv_blocks.labels("cached").set(kv.cached)
            m.kv_blocks.labels("free").set(kv.free - kv.cached)

    def _admit(self) -> None:
        """Waiting requests into free slots, in order, while the pool has their prompts' blocks; a request whose
        prompt continues into blocks another is computing waits for them (those behind it go first)."""
        waited: list[Generation] = []
        while self._waiting and self._free:
            req = self._waiting.popleft()
            if req.cancelled:
                req.done = True
                continue
            got = self._place(req)
            if got is None and not self._active:  # (the whole pool cannot hold its prompt: never runs)
                err = APIError(400, f"the prompt ({len(req.prompt)} tokens) needs more KV cache than this server's "
                               f"pool holds ({self.kv.n_blocks * self.kv.block_size} positions)",  # type: ignore[union-attr]
                               param="prompt", code="context_length_exceeded")
                self._retire(req, Event(error=err), "error")
                continue
            if got is None:  # (the pool is too full: it and those behind it wait)
                self._waiting.appendleft(req)
                break
            if not got:
                waited.append(req)
                continue
            req.slot = self._free.pop()
            req.admitted = next(self._admissions)
            self._active[req.slot] = req
            if not req.preemptions:
                self.metrics.queue_time.observe(time.perf_counter() - req.arrived)
        self._waiting.extendleft(reversed(waited))
        self.metrics.queue_depth.set(len(self._waiting))
        self.metrics.active.set(len(self._active))
        self._pool_metrics()

    def _place(self, req: Generation) -> bool | None:
        """KV blocks for `req`'s tokens (its prompt; resumed: its prompt and generated tokens), the prefix cache's
        first (all but the last token at most, which must run for its logits). False: its next block is being
        computed by another request (wait for it); None: the pool cannot give the rest now. Without a pool: True.
        Where every layer slides, the blocks found behind the window of its first new position are not taken (HOLE),
        the pool must have what it will hold at most while it reads its prompt, and it gets its first chunk's blocks
        (`_grow_or_preempt` gives the later chunks theirs)."""
        kv = self.kv
        first = req.preemptions == 0
        if kv is None:
            return True
        tokens = req.context()
        keys = req.block_keys((len(tokens) - 1) // kv.block_size, kv.block_size) if not req.echo else []
        found = kv.lookup(keys)
        if found.pending or (len(found.blocks) < len(keys) and keys[len(found.blocks)] in self._promised):
            return False  # (its next block is being computed, or a running sequence reading it will compute it)
        n = len(found.blocks) * kv.block_size
        stale = stale_blocks(n, self.kv_window, kv.block_size)
        kept = found.blocks[stale:]
        end = len(tokens) if self.kv_window is None else self._chunk_end(n, len(tokens))
        need = kv.blocks_for(end) - len(found.blocks)  # (now: the whole prompt's, or with a window its first chunk's)
        most = self.held_most(len(tokens)) - len(kept)  # (what it holds at most while reading its prompt, new)
        free = kv.free - sum(1 for b in kept if not kv.held(b))  # (taking a cached block uses it up)
        if max(need, most) > free - (self.watermark if self._active else 0):
            return None
        kv.take(kept)
        req.blocks, req.reading = [*([HOLE] * stale), *kept], len(tokens)
        self._grow(req, need)
        if self.kv_window is not None and kv.prefix_caching:  # (its later chunks' blocks: promised)
            for k in req.block_keys(len(tokens) // kv.block_size, kv.block_size)[len(req.blocks):]:
                self._promised.setdefault(k, req)
        req.fed, req.ready = n, len(found.blocks)
        if first:
            req.reused = n
        self.metrics.prefix_queries.inc(len(tokens))  # (a resumed sequence looks its tokens up again)
        if n:
            self.metrics.prefix_hits.inc(n)
        return True

    def _chunk_end(self, fed: int, n: int) -> int:
        """Where the row of a sequence of `n` tokens that holds `fed` of them ends: at the next multiple of
        prefill_chunk from its start, or its end."""
        return min(n, (fed // self.prefill_chunk + 1) * self.prefill_chunk)

    def _plan(self) -> list[tuple[Generation, Row]]:
        work: list[tuple[Generation, Row]] = []
        # the prompt tokens this step may read: the budget while any sequence decodes, else every waiting chunk
        # (a resumed sequence decodes again once its prompt and generated tokens but the last are back in)
        decoding = any(r.fed >= max(len(r.prompt), len(r.generated) + len(r.prompt) - 1) and r.ending is None
                       and not r.cancelled for r in self._active.values())
        budget = self.prefill_budget if decoding else sum(len(r.context()) for r in self._active.values())
        full = budget
        for slot, req in list(self._active.items()):  # (slot: req.slot, set when admitted)
            if req.cancelled:
                self._retire(req, None, "abort")
                continue
            if req.ending is not None:  # its last token is in, not yet streamed: no more rows
                continue
            # the tokens not yet in the cache: a chunk of the prompt (a resumed sequence: of its prompt and generated
            # tokens), ending at a multiple of prefill_chunk from the sequence's start, also after a reused prefix;
            # once all are in but the last generated one, that one (a decode row)
            tokens = req.context()
            end = self._chunk_end(req.fed, len(tokens))
            ids = tokens[req.fed:end]
            if len(ids) > 1 or req.fed < len(req.prompt):
                if len(ids) > budget and budget < full:
                    continue  # over this step's prefill budget: next step (at least one chunk always runs)
                budget -= len(ids)
            first, req.started = not req.started, True
            echo = req.echo and len(req.prompt_logprobs) < len(req.prompt)
            row = Row(slot, ids, req.fed, req.sampling, sample=end == len(tokens) and req.max_tokens > 0, new=first,
                      prompt=req.prompt if first and req.sampling.repetition_penalty != 1 else (),
                      targets=req.prompt[req.fed + 1:end + 1] if echo else None,
                      grammar=req.grammar if first else None, history=tuple(req.generated) if first else ())
            work.append((req, row))
        work = self._grow_or_preempt(work)
        self.metrics.active.set(len(self._active))
        self._pool_metrics()
        return work

    def _commit(self, req: Generation, row: Row, tok: Token) -> bool:
        """Step results into the sequence, as far as the next step's plan needs them: the prompt
        read so far, the new token, and an end by EOS or length (`req.ending`). False where there
        is nothing to stream: no token, the sequence ended (or went away) while the step ran, or its
        token could not be chosen (a RowError: the sequence fails, alone)."""
        if req.done or req.ending is not None:
            return False
        req.fed += len(row.ids)
        kv = self.kv
        if kv is not None and req.fed // kv.block_size > req.ready:  # (blocks it has computed: ready to share)
            kv.mark_ready(req.blocks[req.ready:req.fed // kv.block_size])
            req.ready = req.fed // kv.block_size
        lp = None
        if isinstance(tok, Picked):
            req.prompt_logprobs.extend(tok.prompt)
            lp = tok.logprob
            tok = tok.token
        if tok is None:
            if req.max_tokens == 0 and req.fed >= len(req.prompt):  # (echo: the prompt's log-probabilities)
                req.ending = "length"
                return True
            return False
        if isinstance(tok, RowError):
            log.warning("sequence %d failed choosing its token at position %d: %s", req.id, row.next_position,
                        tok.message)
            self.metrics.row_failures.inc()
            err = APIError(500, f"choosing this request's next token failed: {tok.message}", code="sampling_error")
            self._retire(req, Event(error=err), "error")
            return False
        req.generated.append(tok)
        if lp is not None:
            req.logprobs_pending.append(lp)
        if (tok in self.engine.eos_ids and not req.ignore_eos) or tok in req.stop_ids:
            req.ending = "eos"
        elif len(req.generated) >= req.max_tokens or row.next_position + 1 >= self.engine.n_ctx:
            req.ending = "length"
        return True

    def _emit(self, req: Generation, tok: int | None, ending: str | None) -> None:
        """A committed token as text and an event (the last, where the token brought the sequence's
        `ending` or a stop string ends it, with its finish reason). No token: an echo request for no new
        tokens has read its prompt (its one event)."""
        if req.done:  # (cancelled meanwhile)
            return
        now = time.perf_counter()
        if tok is None:
            self.metrics.request_generation.observe(0)
            self._retire(req, Event(finish="length"), "length")
            return
        if req.last_token_at is None:
            self.metrics.ttft.observe(now - req.arrived)
        else:
            self.metrics.inter_token.observe(now - req.last_token_at)
        req.last_token_at = now
        req.streamed += 1
        self.metrics.generated_tokens.inc()
        finish: FinishReason | None = None
        tok_bytes = self.engine.tokenizer.token_bytes(tok, skip_special_tokens=tok not in req.shown)
        if ending == "eos":
            # a stop_token_ids token keeps its text (vLLM's rule; a special token has none to show), EOS has none
            text = req.text.push(tok_bytes) if tok in req.stop_ids and tok not in self.engine.eos_ids else ""
            text, finish = text + req.text.finish(), "stop"
        else:
            text = req.text.push(tok_bytes)
            if req.text.stopped:
                finish = "stop"
            elif ending == "length":
                text += req.text.finish()
                finish = "stop" if req.text.stopped else "length"
        lps = [req.logprobs_pending.popleft()] if req.logprobs_pending else None
        if lps:
            req.reported.extend(lps)
        ev = Event(text, 1, finish, logprobs=lps)
        if finish is None:
            req.events.put_nowait(ev)
        else:
            self.metrics.e2e.observe(now - req.arrived)
            self.metrics.request_generation.observe(req.streamed)
            self._retire(req, ev, finish)

    def _retire(self, req: Generation, last: Event | None, reason: str) -> None:
        """`req` is done (`reason`: its finish, "abort" or "error"): its last event, its slot freed."""
        req.done = True
        self.metrics.finished.labels(reason).inc()
        if last is not None:
            req.events.put_nowait(last)
        if req.slot is not None and self._active.get(req.slot) is req:
            del self._active[req.slot]
            # the cache holds the tokens fed so far (the prompt read and every generated token but the last); after
            # a failed step, nothing known
            held = () if reason == "error" else req.context()[:req.fed]
            self._give_back(req, held)
            self._to_release.append(req.slot)
            self._free.append(req.slot)
        self.metrics.active.set(len(self._active))
        self._pool_metrics()
