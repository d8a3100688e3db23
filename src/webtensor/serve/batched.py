"""`BatchedGPT2Engine`: a whole server step as one forward. Every row of the step (a running
sequence's decode token, or an arriving prompt's chunk, each of whose tokens becomes a row) is
flattened into rows of (token, position, slot), and the model's forward runs them all at once
(`shared_slots`: every row's key and value is in the cache before any row attends, so a prompt
token sees the tokens before it); the LM head runs only on the rows that choose a token
(`head_rows`). The weights are read once a step for all rows, however many sequences arrive or
run, instead of once per row (`GPT2Engine`) or once per prompt chunk.

Batch invariance: a row's numbers never depend on the other rows of its step.

- On the CPU the forward holds the rows as (T, 1, C) (`models.gpt2.forward`): numpy's matmul of a
  stack of one-row matrices calls the same BLAS matrix-vector product for each row that a lone
  row gets, where a (T, C) operand would go to the matrix-matrix kernel, which sums in another
  order.
- On WebGPU the same layout makes every product a stack of one-row products, run as one GEMV
  launch over all rows (gemv.wgsl / gemv_q8.wgsl, 8 rows a workgroup, each row's sum in the order
  of a one-row launch: `backends.wgpu.ops.gemv_group`). Attention, layer norms and the cache
  writes are row by row already. So in float32 (and int8) a request's tokens are bit for bit the
  same alone or among any others, and equal `GPT2Engine`'s, which runs each row by itself through
  the same forward. float16 weights on a GPU: a step of more than
  `backends.wgpu.ops.GEMV_STACK_F16_MAX_ROWS` (16) rows runs its products on the tiled engine (the
  weights read once per 64-row tile, ~2-3x faster at 64 rows), whose sums differ from the GEMV's
  in the last bits: the logits then agree to float16's precision, and a greedy token can differ
  where two logits are that close.

Each step shape is captured as a graph on first use and replayed: on WebGPU its launches, on the
CPU its plan of numpy steps (no validation, Tensors or views a step: `backends.cpu.CpuGraph`).
Shapes are bucketed (`bucket`: rows padded to 1, 2, 4, 8, multiples of 8, then coarser, the padding
rows writing a scratch slot of the cache; the LM head's rows to a power of two), so a handful of
graphs serve every mix of decode rows and prompt chunks; at most `MAX_GRAPHS` are kept, the
least recently used released.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops
from ..errors import ArgumentError, ContextLengthError
from ..generation import int_tensor, upload_ints
from ..models.gpt2.model import GPT2
from ..tensor import Tensor
from ..validate import check_ids
from .engine import GPT2EngineBase, Row, Token, choose, followable


def bucket(n: int) -> int:
    """The rows a graph is captured for: n rounded up to 1, 2, 4, 8, then a multiple of 8 up to 64
    (decode steps), of 64 up to 512 and of 256 beyond (steps with prompt chunks, whose rows vary
    most: 20 shapes up to 1,024 rows, each padded by less than 64 rows, or 256 beyond 512)."""
    if n <= 8:
        return 1 << max(n - 1, 0).bit_length()
    step = 8 if n <= 64 else 64 if n <= 512 else 256
    return -(-n // step) * step


MAX_GRAPHS = 48  # captured step shapes kept (least recently used released beyond: their buffers)
FOLLOW_MAX_STEPS = 8  # steps one `follow` may launch (its tokens: a ring of this many rows)


class _StepGraph:
    """One step shape's captured forward over its own input tensors: `width` rows of
    (token, position, slot), the LM head on `picks` of them (None: on every row), `shared` slots.
    A step of decode rows only (picks None, not shared) ends by feeding its argmax back as its
    next input (`ops.advance_tokens`: ids = best, pos += 1, the tokens appended to `ring` at row
    `count`), so that a greedy step can be replayed again, several times, before its tokens are
    read (`BatchedGPT2Engine.follow`)."""

    def __init__(self, model: GPT2, cache: Any, width: int, picks: int | None, shared: bool):
        dev = model.device
        self.ids, self.pos, self.slot = (int_tensor([0] * width, dev) for _ in range(3))
        self.sel = None if picks is None else int_tensor([0] * picks, dev)
        self.feeds_back = picks is None and not shared
        if self.feeds_back:
            self.ring = int_tensor([0] * (width * FOLLOW_MAX_STEPS), dev)  # (FOLLOW_MAX_STEPS, width) tokens
            self.count = int_tensor([0], dev)  # the ring's next row

        def step() -> tuple[Tensor, Tensor]:
            logits = model.forward(self.ids, self.pos, self.slot, cache, None, False, shared_slots=shared,
                                   head_rows=self.sel)
            best = ops.argmax(logits)
            if self.feeds_back:
                ops.advance_tokens(best, self.ids, self.pos, self.ring, self.count)
            return logits, best
        self.graph = dev.capture(step)

    def release(self) -> None:
        self.graph.release()


@dataclass
class _Launched:
    """Steps on their way: the first one's rows, the graph (None: run eagerly), and the readbacks
    of its argmax and (where a row samples) its logits, started when it was queued; or, for
    `steps` followed steps, of their ring of tokens (`ring`)."""

    rows: list[Row]
    graph: _StepGraph | None
    best: Any
    logits: tuple[Any, tuple[int, ...], str] | None
    steps: int = 1
    ring: Any = None


class BatchedGPT2Engine(GPT2EngineBase):
    """The batched engine: one KV cache of `max_batch` slots (and a scratch slot for padding rows);
    each step's rows, decode tokens and prompt chunks alike, as one forward."""

    engine = "batched"

    def __init__(self, model: GPT2, max_batch: int, name: str | None = None, use_graph: bool | None = None):
        super().__init__(model, max_batch, name)
        self.use_graph = model.use_graph if use_graph is None else use_graph
        self.cache = model.new_cache(max_batch + 1)  # slot max_batch: the padding rows' scratch
        self._length = [0] * max_batch  # tokens held per slot
        self._graphs: dict[tuple[int, int | None, bool], _StepGraph] = {}
        self._last: _Launched | None = None  # the step `follow` may continue
        self._captured, self._capture_ms = 0, 0.0

    # -- the protocol ---------------------------------------------------------------------------
    def release(self, slot: int) -> None:
        self._check_slot(slot)
        self._length[slot] = 0

    def step(self, rows: Sequence[Row]) -> list[Token]:
        return self.collect(self.launch(rows))[0]

    def launch(self, rows: Sequence[Row]) -> _Launched:
        """Start a step (the device works on it while the caller goes on); `collect` its tokens."""
        self._check(rows)
        dev = self.model.device
        ids: list[int] = []
        pos: list[int] = []
        slot: list[int] = []
        picks: list[int] = []  # the flat row of each row that chooses a token
        for r in rows:
            n = len(r.ids)
            ids.extend(r.ids)
            pos.extend(range(r.start, r.start + n))
            slot.extend([r.slot] * n)
            if r.sample:
                picks.append(len(ids) - 1)
        shared = len(ids) > len(rows)  # a row of several tokens (a prompt chunk)
        every = len(picks) == len(ids)  # every flat row chooses (a step of decode rows): no gather
        g = None
        if not rows:
            logits = best = None
        elif self.use_graph:
            width = bucket(len(ids))
            n_sel = None if every else 1 << (len(picks) - 1).bit_length() if picks else 1  # (a power of two)
            g = self._graph(width, n_sel, shared)
            pad = width - len(ids)
            upload_ints(g.ids, ids + [0] * pad)
            upload_ints(g.pos, pos + [0] * pad)
            upload_ints(g.slot, slot + [self.max_batch] * pad)
            if g.sel is not None:
                upload_ints(g.sel, picks + [0] * (g.sel.shape[0] - len(picks)))
            with dev.dispatch_scope():
                logits, best = g.graph.replay()
        else:
            with dev.dispatch_scope():
                logits = self.model.forward(int_tensor(ids, dev), int_tensor(pos, dev), int_tensor(slot, dev),
                                            self.cache, None, False, shared_slots=shared,
                                            head_rows=None if every else int_tensor(picks or [0], dev))
                best = ops.argmax(logits)
        return self._launched(rows, g, logits, best)

    def can_follow(self, rows: Sequence[Row], steps: int = 1) -> bool:
        """Whether `follow` can launch `steps` steps from these rows: greedy one-token decode rows
        (a graph that feeds its tokens back), each with room for `steps` more positions."""
        return self.use_graph and 1 <= steps <= FOLLOW_MAX_STEPS and followable(rows, self.n_ctx, steps)

    def follow(self, prev: _Launched, rows: Sequence[Row], steps: int = 1) -> _Launched:
        """Launch `steps` steps after `prev` (the last launched; `can_follow(rows, steps)`) for
        the same sequences before prev's tokens are known: each step's input is the token the
        step before chose, fed back on the device. `rows` are prev's rows moved on by prev's
        steps: the first followed step's (their ids are not read)."""
        g = prev.graph
        if prev is not self._last or g is None or not g.feeds_back:
            raise ArgumentError("follow continues the last launched step of greedy decode rows only")
        if [(r.slot, r.start) for r in rows] != [(r.slot, r.start + prev.steps) for r in prev.rows]:
            raise ArgumentError("follow's rows must be the previous step's, moved on by its steps")
        if not 1 <= steps <= FOLLOW_MAX_STEPS:
            raise ArgumentError(f"follow launches 1 to {FOLLOW_MAX_STEPS} steps, got {steps}")
        upload_ints(g.count, [0])  # (a queue write: after prev's steps, before these)
        with self.model.device.dispatch_scope():
            g.graph.replay(steps)
        h = self._launched(rows, g, None, None, steps)
        h.ring = self.model.device.backend.read_async(g.ring)
        return h

    def collect(self, h: _Launched) -> list[list[Token]]:
        """The tokens of launched steps: per step, per row in order (None where a row does not
        choose); a launch is one step."""
        if h.ring is not None:  # followed steps: greedy one-token rows, the ring's first rows
            ring = np.frombuffer(bytes(h.ring.wait()), np.int32).reshape(FOLLOW_MAX_STEPS, -1)
            return [[int(t) for t in ring[i, :len(h.rows)]] for i in range(h.steps)]
        if h.best is None:
            return [[]]
        chosen = np.frombuffer(bytes(h.best.wait()), np.int32)
        rows_logits = None
        if h.logits is not None:
            ticket, shape, dtype = h.logits
            rows_logits = np.frombuffer(bytes(ticket.wait()), dtype).reshape(-1, shape[-1])
        out: list[Token] = []
        j = 0  # the row's place among the choosing rows (the LM head's rows)
        for r in h.rows:
            if not r.sample:
                out.append(None)
                continue
            if r.sampling.temperature == 0:
                out.append(int(chosen[j]))
            else:
                out.append(choose(rows_logits[j].astype(np.float32, copy=False), r.sampling,  # type: ignore[index]
                                  r.next_position))
            j += 1
        return [out]

    # -- helpers --------------------------------------------------------------------------------
    def _launched(self, rows: Sequence[Row], g: _StepGraph | None, logits: Tensor | None,
                  best: Tensor | None, steps: int = 1) -> _Launched:
        """Readbacks of steps just queued (the argmax; the logits where a row samples), the slots'
        lengths moved on; the steps become the ones `follow` may continue."""
        read = self.model.device.backend.read_async
        sampled = any(r.sample and r.sampling.temperature != 0 for r in rows)
        h = _Launched(list(rows), g, None if best is None else read(best),
                      (read(logits), logits.shape, logits.dtype.name) if sampled and logits is not None else None,
                      steps)
        for r in rows:
            self._length[r.slot] = r.next_position + steps - 1
        self._last = h
        return h

    def _graph(self, width: int, picks: int | None, shared: bool) -> _StepGraph:
        key = (width, picks, shared)
        g = self._graphs.pop(key, None)  # (re-inserted last: the dict runs least to most recent)
        if g is None:
            excess = len(self._graphs) + 1 - MAX_GRAPHS
            if excess > 0:
                in_use = self._last.graph if self._last is not None else None  # (`follow` may replay it)
                for old in [k for k, v in self._graphs.items() if v is not in_use][:excess]:
                    self._graphs.pop(old).release()
            t0 = time.perf_counter()
            g = _StepGraph(self.model, self.cache, width, picks, shared)
            self._captured += 1
            self._capture_ms += (time.perf_counter() - t0) * 1e3
        self._graphs[key] = g
        return g

    @property
    def graph_stats(self) -> dict[str, float]:
        """Step graphs captured so far, the milliseconds that took, and how many are held (/health)."""
        return {"captured": self._captured, "capture_ms": round(self._capture_ms, 1), "held": len(self._graphs)}

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_batch:
            raise ArgumentError(f"slot {slot} is out of range for {self.max_batch} slots")

    def _check(self, rows: Sequence[Row]) -> None:
        """Every row checked before any runs: a bad one fails the step with nothing written."""
        seen: set[int] = set()
        for r in rows:
            self._check_slot(r.slot)
            if r.slot in seen:
                raise ArgumentError(f"slot {r.slot} has two rows in one step")
            seen.add(r.slot)
            if not r.ids:
                raise ArgumentError(f"the row for slot {r.slot} has no tokens")
            if r.start != 0 and self._length[r.slot] != r.start:
                raise ArgumentError(f"slot {r.slot} holds {self._length[r.slot]} tokens, the row starts at {r.start}")
            check_ids(r.ids, self.vocab_size)
            if r.start + len(r.ids) > self.n_ctx:
                raise ContextLengthError(f"{r.start} cached + {len(r.ids)} new tokens exceed the context of "
                                         f"{self.n_ctx} positions")

    def close(self) -> None:
        """Free the captured graphs."""
        for g in self._graphs.values():
            g.release()
        self._graphs.clear()
