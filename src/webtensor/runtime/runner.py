"""`ModelRunner`: one model's sequences on one device — the paged KV cache, the captured graphs and the feed-back
ring — and the only code that runs a model's forward. `generate`, `generate_batch`, both serving engines, the web
page and the benchmarks are its clients.

A runner holds `n_slots` sequences (rows of the KV cache's block table, plus a scratch row that decode padding
rows write) over one pool of KV blocks (`runtime.cache.KVCache`, docs/design-kv.md). A sequence's blocks are chosen
either by the runner itself (rows without `blocks`: its own `BlockManager` grows a sequence's list as its rows
reach new blocks; `truncate` / `release` give them back) or by the caller (rows with `blocks`: the server's
scheduler owns the pool's bookkeeping); the table rows that changed are uploaded before each launch. Where every
layer of the model slides (`ModelSpec.kv_window`), the runner's own blocks behind the window of a row's first
position are given back before the row runs (`runtime.blocks.stale_blocks`; HOLE in the table row, which no
kernel reads), so a sequence holds at most the window's blocks and a step's (`runtime.blocks.window_blocks`) and a
prompt's blocks are taken chunk by chunk. Its clients ask for two kinds of work:

- `prefill(slot, ids, p0)`: a prompt of one sequence, read in chunks of `prefill_chunk` tokens (the device
  policy's, `prefill_policy`), each chunk a replay of a captured prompt-chunk graph (`_ChunkGraph`: the rows'
  tokens, positions and slot in device tensors, `StepBatch.store`: products as matrix-matrix products, attention
  by `ops.chunk_attention` through the block table, the LM head on the last real row only). Chunk shapes are
  bucketed (`chunk_bucket`), the padding rows repeating the last token and position and stored nowhere, so a
  prompt of any length is a handful of replays (one submit each: each replay's inputs are uploaded first) whose
  host cost is their encoding, not the planning of every op.
- `launch(rows)`: a step of `RunRow`s, at most one per slot: its prompt chunks (rows of several tokens) each as
  above, its one-token rows (decode tokens) as one forward of the decode-step graph (`_StepGraph`) with the LM
  head on the rows that choose a token. Decode shapes are bucketed (`bucket`), padding rows writing the scratch
  slot. A step of greedy one-token rows ends by feeding its argmax back on the device (`ops.advance_tokens`: ids
  = best, pos += 1, tokens appended to a ring), so `follow` can replay it for the next steps before the host has
  read a single token. `collect` reads a launch's tokens (the argmax of each choosing row) and, for rows that
  asked, their logits (host-side sampling).

Every shape is captured as a graph on first use and replayed (on WebGPU its launches, on the CPU its plan of numpy
steps); at most `MAX_GRAPHS` graphs are held, the least recently used released. A runner without graphs
(`use_graph=False`, the reference engine) runs the same forwards at the same shapes eagerly: the same numbers.

Batch invariance: with `invariant` (the default) every product of a decode step is a stack of one-row products
(see `StepBatch.invariant`), so in float32 a row's tokens do not depend on the other rows of its step; a prompt
chunk runs alone, so its numbers depend only on its prompt (and the chunk size).
"""

from __future__ import annotations

import struct
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import ops
from ..errors import ArgumentError, ContextLengthError
from ..tensor import Tensor, from_buffer
from ..validate import check_ids
from .batch import StepBatch
from .blocks import HOLE, BlockManager, stale_blocks
from .cache import BLOCK_SIZE, KVCache, binding_cap, sequence_blocks

MAX_GRAPHS = 64  # captured shapes kept, decode steps and prompt chunks (least recently used released beyond)
RING_STEPS = 16  # steps one `follow` may launch (its tokens: a ring of this many rows of the step's width)


class Runnable(Protocol):
    """What a runner needs of a model (`models.base.LanguageModel` has it)."""

    device: Any
    n_ctx: int
    use_graph: bool

    @property
    def vocab_size(self) -> int: ...

    @property
    def spec(self) -> Any: ...

    def position_bytes(self) -> int: ...

    def new_cache(self, n_seqs: int = 1, n_blocks: int | None = None, block_size: int = BLOCK_SIZE) -> KVCache: ...

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor: ...


@dataclass(frozen=True)
class RunRow:
    """One sequence's work in one step: tokens `ids` at positions start.. of `slot` (the slot holds exactly
    `start` tokens before the step); `pick`: choose the token after ids (False: a prompt chunk that is not the
    last); `read_logits`: also read that row's logits back (the caller samples on the host); `every_logits`:
    the LM head runs on every one of the row's tokens and their logits are read back (a prompt whose own
    log-probabilities are asked for: OpenAI's `echo`), the last one's being the choosing row's when `pick`;
    `mask`: the tokens the choosing row may take (a grammar's), as int32 little-endian words (bit c % 32 of word
    c // 32 for token c: `ops.token_mask`), applied to its logits on the device before the argmax and the
    readback. `blocks`: the sequence's KV blocks in position order, covering every position through the row's last
    (a caller that manages the pool: the server's scheduler); None: the runner's own (see the module docstring)."""

    slot: int
    ids: tuple[int, ...]
    start: int
    pick: bool = True
    read_logits: bool = False
    every_logits: bool = False
    mask: bytes | None = None
    blocks: tuple[int, ...] | None = None

    @property
    def next_position(self) -> int:
        return self.start + len(self.ids)

    @property
    def head_rows(self) -> int:
        """How many of the row's tokens the LM head runs on."""
        return len(self.ids) if self.every_logits else int(self.pick)

    @property
    def reads(self) -> bool:
        """Whether the step's logits are read back for this row."""
        return self.every_logits or (self.pick and self.read_logits)


def int_tensor(values: Sequence[int], device: Any) -> Tensor:
    """An int32 tensor of `values` on `device` (no numpy needed)."""
    return from_buffer(struct.pack(f"<{len(values)}i", *values), (len(values),), "int32", device)


def int_rows(device: Any, *rows: Sequence[int]) -> tuple[Tensor, ...]:
    """int32 rows of one length T as views of one (len(rows), T) tensor: the KV kernels bind positions and slots as
    one buffer (a step's positions and slots; a chunk's positions, store positions and slots)."""
    T = len(rows[0])
    flat = [v for r in rows for v in r]
    both = from_buffer(struct.pack(f"<{len(flat)}i", *flat), (len(rows), T), "int32", device)
    return tuple(both[i] for i in range(len(rows)))


def upload_ints(t: Tensor, values: Sequence[int]) -> None:
    """Write `values` into the int32 tensor `t` (an upload between replays)."""
    t.device.backend.upload_into(t, struct.pack(f"<{len(values)}i", *values))


def read_ints(t: Tensor) -> list[int]:
    raw = t.tobytes()
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def logits_rows(raw: bytes, dtype: str, width: int) -> list[Any]:
    """Rows of `width` logits from raw bytes: float32 numpy arrays, or array.array('f') without numpy (the page)."""
    try:
        import numpy as np
    except ImportError:
        import array

        vals = array.array("f", raw) if dtype == "float32" else array.array("f", struct.unpack(
            f"<{len(raw) // 2}e", raw))
        return [vals[i:i + width] for i in range(0, len(vals), width)]
    arr = np.frombuffer(raw, dtype).astype(np.float32, copy=False).reshape(-1, width)
    return list(arr)


def _stack(rows: list[Any]) -> Any:
    """Logits rows as one (n, V) array (numpy), or the list itself without numpy."""
    try:
        import numpy as np
    except ImportError:
        return rows
    return np.stack(rows) if rows else np.zeros((0, 0), np.float32)


def bucket(n: int) -> int:
    """The rows a decode step's graph is captured for: n rounded up to 1, 2, 4, 8, then a multiple of 8 up to 64,
    of 64 up to 512 and of 256 beyond (a server of many slots)."""
    if n <= 8:
        return 1 << max(n - 1, 0).bit_length()
    step = 8 if n <= 64 else 64 if n <= 512 else 256
    return -(-n // step) * step


CHUNK_MIN_ROWS = 16  # the smallest prompt-chunk graph


def chunk_bucket(n: int) -> int:
    """The rows a prompt chunk's graph is captured for: n rounded up to 16, 24, 32, 48, 64, 96 .. (a power of two
    or 1.5 times one), so a prompt's last chunk is at most a third padding and its shapes stay few."""
    w = CHUNK_MIN_ROWS
    while w < n:
        w = w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3
    return w


def prefill_policy(device: Any) -> tuple[int, int]:
    """The device policy's prompt chunk (the rows of a prompt-chunk graph: a prompt is read this many tokens a
    replay) and per-step prompt budget (the prompt tokens a server step adds beside running decode rows):
    `KernelPolicy.prefill_chunk` / `prefill_budget` on WebGPU, CPU_PREFILL on the CPU device."""
    policy = getattr(device, "kernel_policy", None)
    if policy is None:
        return CPU_PREFILL
    return int(policy.prefill_chunk), int(policy.prefill_budget)


CPU_PREFILL = (128, 128)  # the CPU device's (chunk, budget): numpy's products, no GPU to keep busy


def step_rows(device: Any, prefill_chunk: int | None = None) -> int:
    """The most positions one step of a runner adds to a sequence: a prompt chunk (`prefill_chunk`, None: the
    device policy's) or a `follow` of RING_STEPS steps (what bounds the blocks a windowed sequence holds)."""
    return max(prefill_chunk or prefill_policy(device)[0], RING_STEPS)


def _forward(runner: ModelRunner, batch: StepBatch, bits: Tensor | None, after: Any = None) -> Any:
    """The function a graph captures: the model's forward over `batch` (the model by weak reference: a CPU graph
    keeps this function, and a model keeps its runners), the head rows' logits through `ops.token_mask` where
    `bits`, their argmax (None without head rows), then `after(best)`; -> (logits, best)."""
    model, cache = runner._model if isinstance(runner._model, weakref.ref) else weakref.ref(runner.model), \
        runner.cache

    def step() -> tuple[Tensor, Tensor | None]:
        logits = model().forward(batch, cache)  # type: ignore[union-attr]
        if bits is not None:
            logits = ops.token_mask(logits, bits)
        best = ops.argmax(logits) if logits.shape[0] else None
        if after is not None:
            after(best)
        return logits, best
    return step


def _mask_bits(runner: ModelRunner, rows: int) -> Tensor:
    """A graph's token-mask input: (rows, words) int32, every token allowed until written."""
    words = (runner.vocab_size + 31) // 32
    return from_buffer(b"\xff" * (4 * words * rows), (rows, words), "int32", runner.device)


class _StepGraph:
    """One decode step shape's captured forward over its own input tensors: `width` one-token rows of (token,
    position, slot), each its own sequence, the LM head on `picks` of them (None: every row), `masked`: the head
    rows' logits through `ops.token_mask` (the `bits` input) before the argmax. A step whose rows all choose (picks
    None, not masked) feeds its argmax back (the ring: RING_STEPS x width tokens, `count` its next row)."""

    def __init__(self, runner: ModelRunner, width: int, picks: int | None, masked: bool = False):
        dev = runner.device
        self.width = width
        self.ids = int_tensor([0] * width, dev)
        self.pos, self.slot = int_rows(dev, [0] * width, [0] * width)
        self.sel = None if picks is None else int_tensor([0] * picks, dev)
        self.bits = _mask_bits(runner, picks or width) if masked else None
        self.feeds_back = picks is None and not masked
        after = None
        if self.feeds_back:
            self.ring = int_tensor([0] * (width * RING_STEPS), dev)
            self.count = int_tensor([0], dev)

            def after(best: Tensor) -> None:
                ops.advance_tokens(best, self.ids, self.pos, self.ring, self.count)
        batch = StepBatch(self.ids, self.pos, self.slot, head_rows=self.sel, invariant=runner.invariant,
                          table=runner.cache.table)
        self.graph = dev.capture(_forward(runner, batch, self.bits, after))

    def release(self) -> None:
        self.graph.release()


class _ChunkGraph:
    """One prompt-chunk shape's captured forward: `width` rows of one sequence (`StepBatch.store`: token, position,
    the position it is stored at, slot), the LM head on `head` rows: "last" (the last real row, `sel`), "every"
    (every row: a prompt's own log-probabilities) or "none" (a chunk that chooses nothing); `masked`: the head rows
    through `ops.token_mask` (`bits`)."""

    def __init__(self, runner: ModelRunner, width: int, head: str, masked: bool = False):
        dev = runner.device
        self.width, self.head = width, head
        self.ids = int_tensor([0] * width, dev)
        self.pos, self.store, self.slot = int_rows(dev, *([0] * width for _ in range(3)))
        self.sel = None if head == "every" else int_tensor([0] * (head == "last"), dev)
        self.bits = _mask_bits(runner, width if head == "every" else 1) if masked else None
        batch = StepBatch(self.ids, self.pos, self.slot, store=self.store, head_rows=self.sel, invariant=False,
                          table=runner.cache.table)
        self.graph = dev.capture(_forward(runner, batch, self.bits))

    def release(self) -> None:
        self.graph.release()


@dataclass
class _Part:
    """Some rows of a launch and the readbacks of their results, started when they were queued: `index` their
    places among the launch's rows, `best` readbacks of the argmax of their head rows and `logits` of the head
    rows' logits (where a row reads them) as (readback, dtype name, vocabulary), in row order (a long prompt:
    one a chunk)."""

    index: list[int]
    best: list[Any]
    logits: list[tuple[Any, str, int]]


@dataclass
class Launched:
    """Steps on their way: the rows, their parts' readbacks (`_Part`: the decode rows' step and each prompt chunk),
    `graph` the decode step's graph where the launch is that step alone (`follow` may continue it); or, for `steps`
    followed steps, the readback of their ring of tokens."""

    rows: list[RunRow]
    parts: list[_Part]
    graph: _StepGraph | None = None
    steps: int = 1
    ring: Any = None


@dataclass
class Collected:
    """A launch's results: `tokens[step][row]` (the argmax of each choosing row, None elsewhere) and, for the
    first step, `logits[row]` (a float32 (V,) row for choosing rows that asked, else None) and
    `every_logits[row]` (a float32 (len(ids), V) array for rows with `every_logits`, else None)."""

    tokens: list[list[int | None]]
    logits: list[Any]
    every_logits: list[Any] | None = None


class ModelRunner:
    def __init__(self, model: Runnable, n_slots: int, use_graph: bool | None = None, invariant: bool = True,
                 bucketed: bool = True, weak: bool = False, prefill_chunk: int | None = None,
                 kv_blocks: int | None = None, block_size: int = BLOCK_SIZE):
        """`weak`: hold the model by weak reference (a runner the model itself keeps, in its pool: no cycle, so a
        dropped model is freed at once). `prefill_chunk`: the tokens of a prompt a graph replay reads (None: the
        device policy's, `prefill_policy`). `kv_blocks`: the pool's blocks of `block_size` positions (default:
        what every slot holds at most: its whole context, `ceil(n_ctx / block_size)`, or where every layer slides its
        window's and a step's, `blocks.held_blocks`; at most what one binding holds a layer)."""
        if n_slots < 1:
            raise ArgumentError(f"a runner needs at least one slot, got {n_slots}")
        self._model: Any = weakref.ref(model) if weak else (lambda: model)
        self.device, self.n_slots = model.device, n_slots
        self.n_ctx, self.vocab_size = model.n_ctx, model.vocab_size
        self.use_graph = model.use_graph if use_graph is None else use_graph
        self.invariant, self.bucketed = invariant, bucketed
        self.prefill_chunk = prefill_policy(self.device)[0] if prefill_chunk is None else prefill_chunk
        if self.prefill_chunk < 1:
            raise ArgumentError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        # bucketed: decode step shapes rounded up (`bucket`), the padding rows writing the scratch sequence
        # (n_slots) and block; else every step shape its own graph (a client whose steps have few shapes)
        self.block_size = block_size
        self.max_blocks = -(-self.n_ctx // block_size)
        # every layer's window (the largest) where all slide: the runner's own blocks behind it are given back (None:
        # every block is kept while its sequence lives); a step adds at most `step_rows` positions to a sequence
        self.kv_window: int | None = model.spec.kv_window
        self.step_rows = step_rows(self.device, self.prefill_chunk)
        per_slot = sequence_blocks(model, self.step_rows, block_size)
        n_blocks = min(n_slots * per_slot, binding_cap(model, block_size)) if kv_blocks is None else kv_blocks
        self.cache = model.new_cache(n_slots, n_blocks, block_size)
        self.blocks = BlockManager(self.cache.n_blocks, block_size, prefix_caching=False)  # (rows without blocks)
        self._owned: list[list[int]] = [[] for _ in range(n_slots)]  # each slot's blocks from self.blocks
        self._external = False  # rows have come with their blocks (the caller manages the pool)
        self._length = [0] * n_slots  # tokens held per slot
        self._held: list[list[int]] = [[] for _ in range(n_slots)]  # the tokens behind them, as far as known
        # captured graphs, least to most recently used: ("step", width, picks, masked) decode steps and
        # ("chunk", width, head, masked) prompt chunks
        self._graphs: dict[tuple[Any, ...], _StepGraph | _ChunkGraph] = {}
        self._last: Launched | None = None  # the step `follow` may continue
        self._captured, self._capture_ms = 0, 0.0

    # -- prompts ----------------------------------------------------------------------------------------
    def prefill(self, slot: int, ids: Sequence[int], p0: int = 0) -> Tensor:
        """Run prompt `ids` at positions p0.. of `slot`: chunks of `prefill_chunk` tokens (ending at multiples of
        it from position 0), each a replayed prompt-chunk graph (`_ChunkGraph`; without graphs its forward run
        eagerly); the last position's logits (1, V), a tensor of their own. The keys and values stay in the slot."""
        row = RunRow(slot, tuple(ids), p0)
        self._check([row])
        with self.device.dispatch_scope():  # (each chunk's blocks placed before it: `_prompt`)
            logits = ops.copy(list(self._prompt(slot, row.ids, p0, "last"))[-1][0])  # (a graph's output: rewritten)
        self._length[slot] = row.next_position
        self._held[slot][p0:] = ids
        return logits

    def chunks(self, start: int, n: int) -> list[tuple[int, int]]:
        """The chunks a prompt of `n` tokens at positions start.. is read in, as (first, end) offsets into it: each
        ends at a multiple of prefill_chunk from position 0 (or at the prompt's end), so a prompt's chunks are the
        same whatever was cached before it."""
        out, a, C = [], 0, self.prefill_chunk
        while a < n:
            b = min(n, ((start + a) // C + 1) * C - start)
            out.append((a, b))
            a = b
        return out

    def _prompt(self, slot: int, ids: tuple[int, ...], start: int, head: str,
                mask: bytes | None = None) -> Iterator[tuple[Tensor, Tensor | None, int]]:
        """Queue prompt `ids` at positions start.. of `slot` (its `chunks`), the LM head on `head` rows ("last":
        the prompt's last, with `mask`; "every"; "none"): per chunk, (logits, argmax, its tokens), yielded as soon as
        the chunk is queued (its outputs are a graph's, which the next chunk of its width rewrites: read them
        first)."""
        for a, b in self.chunks(start, len(ids)):
            if not self._external:  # (the runner's own blocks: each chunk's, behind its window given back)
                self._place([RunRow(slot, ids[a:b], start + a)])
            last = b == len(ids)
            yield self._chunk(slot, ids[a:b], start + a, head if last or head == "every" else "none",
                              mask if last else None)

    def _chunk(self, slot: int, ids: tuple[int, ...], start: int, head: str,
               mask: bytes | None) -> tuple[Tensor, Tensor | None, int]:
        """One prompt chunk (see `_prompt`), its graph replayed (`load_chunk`), or without graphs its forward run
        eagerly at the same shape: (logits, argmax, its tokens). A chunk of one token is a decode row (`_step`), as
        in a launch: a prompt's numbers are the same through `prefill` and through a server's steps."""
        if len(ids) == 1:
            logits, one, _ = self._step([RunRow(slot, ids, start, mask=mask)])
            return logits, None if head == "none" else one, 1
        if self.use_graph:
            logits, best = self.load_chunk(slot, ids, start, head, mask).graph.replay()
            return logits, best, len(ids)
        dev = self.device
        inputs, sel, masks = self._chunk_inputs(slot, ids, start, head, mask)
        ids_t = int_tensor(inputs[0], dev)
        pos_t, store_t, slot_t = int_rows(dev, *inputs[1:])
        batch = StepBatch(ids_t, pos_t, slot_t, store=store_t, head_rows=None if head == "every" else
                          int_tensor(sel, dev), invariant=False, table=self.cache.table)
        logits, best = _forward(self, batch, self._bits_tensor(masks) if mask is not None else None)()
        return logits, best, len(ids)

    def load_chunk(self, slot: int, ids: tuple[int, ...], start: int, head: str,
                   mask: bytes | None = None) -> _ChunkGraph:
        """The graph of a prompt chunk (captured on first use) with this chunk's inputs uploaded, ready to
        replay (what `_chunk` replays; the profiler times it)."""
        width, masked = chunk_bucket(len(ids)), mask is not None
        g = self._graph(("chunk", width, head, masked), lambda: _ChunkGraph(self, width, head, masked))
        assert isinstance(g, _ChunkGraph)
        inputs, sel, masks = self._chunk_inputs(slot, ids, start, head, mask)
        for t, values in zip((g.ids, g.pos, g.store, g.slot), inputs, strict=True):
            upload_ints(t, values)
        if g.sel is not None and sel:
            upload_ints(g.sel, sel)
        if g.bits is not None:
            self.device.backend.upload_into(g.bits, self._bits(masks, g.bits.shape[0]))
        return g

    def _chunk_inputs(self, slot: int, ids: tuple[int, ...], start: int, head: str, mask: bytes | None) -> \
            tuple[tuple[list[int], ...], list[int], list[bytes | None]]:
        """A prompt chunk's rows at `chunk_bucket` rows: (ids, positions, store positions, slots), the head rows
        (`sel`) and their masks. The padding rows repeat the last token and position (finite rows, never read) and
        are stored nowhere (their store position is the block table's end)."""
        n = len(ids)
        pad, end = chunk_bucket(n) - n, start + n
        inputs = (list(ids) + [ids[-1]] * pad, list(range(start, end)) + [end - 1] * pad,
                  list(range(start, end)) + [self.max_blocks * self.block_size] * pad, [slot] * (n + pad))
        masks: list[bytes | None] = [None] * (n - 1) + [mask] + [None] * pad if head == "every" else [mask]
        return inputs, [n - 1] if head == "last" else [], masks

    # -- steps ------------------------------------------------------------------------------------------
    def launch(self, rows: Sequence[RunRow]) -> Launched:
        """Start a step (the device works on it while the caller goes on); `collect` its results. Rows of several
        tokens (prompt chunks) run as prompt-chunk graphs (`_prompt`), the one-token rows as one decode step."""
        self._check(rows)
        self._place([r for r in rows if len(r.ids) == 1 or r.blocks is not None])  # (own prompts: per chunk)
        parts: list[_Part] = []
        step = [i for i, r in enumerate(rows) if len(r.ids) == 1]
        graph = None
        with self.device.dispatch_scope():  # (one submit a replay: each replay's inputs are uploaded first)
            for i, r in enumerate(rows):
                if len(r.ids) > 1:
                    parts.append(self._prompt_part(i, r))
            if step:
                part, graph = self._step_part(step, rows)
                parts.append(part)
        h = Launched(list(rows), parts, graph if len(step) == len(rows) else None)
        self._advance(rows, 1, True)
        self._last = h
        return h

    def _prompt_part(self, i: int, r: RunRow) -> _Part:
        """Row i of a launch, a prompt chunk, queued; its readbacks: the argmax and logits of its head rows."""
        head = "every" if r.every_logits else "last" if r.pick else "none"
        read = self.device.backend.read_async
        part = _Part([i], [], [])
        for logits, best, n in self._prompt(r.slot, r.ids, r.start, head, r.mask if r.pick else None):
            if best is None:
                continue
            k = n if head == "every" else 1
            part.best.append(read(best[:k]))
            if r.reads:
                part.logits.append((read(logits[:k]), logits.dtype.name, logits.shape[-1]))
        return part

    def _step_part(self, index: list[int], rows: Sequence[RunRow]) -> tuple[_Part, _StepGraph | None]:
        """The one-token rows `index` of a launch as one decode step, queued: its part (the readbacks), and its
        graph (None: run eagerly)."""
        step = [rows[i] for i in index]
        logits, best, g = self._step(step)
        read = self.device.backend.read_async
        want = any(r.reads for r in step)
        return _Part(index, [read(best)], [(read(logits), logits.dtype.name, logits.shape[-1])] if want else []), g

    def _step(self, rows: list[RunRow]) -> tuple[Tensor, Tensor, _StepGraph | None]:
        """One-token rows as one decode step (`_StepGraph`, or its forward eagerly), queued: the logits of its head
        rows (each choosing or every_logits row, in order), their argmax, the graph."""
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        slot: list[int] = []
        picks: list[int] = []  # the rows the LM head runs on (each choosing row, every_logits rows)
        masks: list[bytes | None] = []  # per head row: its mask (the choosing row's) or None (every token)
        for r in rows:
            if r.head_rows:
                picks.append(len(ids))
                masks.append(r.mask if r.pick else None)
            ids.append(r.ids[0])
            pos.append(r.start)
            slot.append(r.slot)
        masked = any(m is not None for m in masks)
        every = len(picks) == len(ids)  # every row chooses (a step of decode rows): no gather
        g: _StepGraph | None = None
        if self.use_graph:
            width = bucket(len(ids)) if self.bucketed else len(ids)
            n_sel = None if every else 1 << (len(picks) - 1).bit_length() if picks else 1  # (a power of two)
            found = self._graph(("step", width, n_sel, masked), lambda: _StepGraph(self, width, n_sel, masked))
            assert isinstance(found, _StepGraph)
            g = found
            pad = width - len(ids)
            upload_ints(g.ids, ids + [0] * pad)
            upload_ints(g.pos, pos + [0] * pad)
            upload_ints(g.slot, slot + [self.n_slots] * pad)
            if g.sel is not None:
                upload_ints(g.sel, picks + [0] * (g.sel.shape[0] - len(picks)))
            if g.bits is not None:
                dev.backend.upload_into(g.bits, self._bits(masks, g.bits.shape[0]))
            logits, best = g.graph.replay()
        else:
            pos_t, slot_t = int_rows(dev, pos, slot)
            batch = StepBatch(int_tensor(ids, dev), pos_t, slot_t,
                              head_rows=None if every else int_tensor(picks or [0], dev), invariant=self.invariant,
                              table=self.cache.table)
            logits, best = _forward(self, batch, self._bits_tensor(masks or [None]) if masked else None)()
        assert best is not None
        return logits, best, g

    @property
    def model(self) -> Runnable:
        return self._model()  # type: ignore[no-any-return]

    def can_follow(self, rows: Sequence[RunRow], steps: int = 1) -> bool:
        """Whether `follow` can launch `steps` steps from these rows: one-token rows that all choose, each with room
        for `steps` more positions (in the context, and in KV blocks: the rows' own, or the runner's free ones), on
        a runner that replays graphs."""
        if not (self.use_graph and 1 <= steps <= RING_STEPS and bool(rows)
                and all(len(r.ids) == 1 and r.pick and r.start + steps < self.n_ctx for r in rows)):
            return False
        if all(r.blocks is not None for r in rows):
            return all(len(r.blocks) * self.block_size >= r.start + steps for r in rows)  # type: ignore[arg-type]
        return sum(self._growth(r.slot, r.start, r.start + steps) for r in rows) <= self.blocks.free

    def follow(self, prev: Launched, steps: int = 1, blocks: dict[int, tuple[int, ...]] | None = None) -> Launched:
        """Launch `steps` steps after `prev` (the last launched, a step of one-token choosing rows) for the same
        sequences before prev's tokens are known: each step's input is the argmax the step before chose, fed back
        on the device. The followed steps' tokens come back through the ring (`collect`). `blocks`: slot -> its
        sequence's blocks, covering the followed steps' positions (a caller that manages the pool); else the
        runner's own are grown."""
        self.check_follow(prev)
        g = prev.graph
        assert g is not None
        rows = [RunRow(r.slot, (0,), r.start + prev.steps, True, blocks=None if blocks is None else blocks[r.slot])
                for r in prev.rows]
        if not self.can_follow(rows, steps):
            raise ArgumentError(f"cannot follow with {steps} steps (1 to {RING_STEPS}, within the context and the "
                                "KV pool)")
        self._place(rows, steps)
        upload_ints(g.count, [0])  # (a queue write: after prev's steps, before these)
        with self.device.dispatch_scope():
            g.graph.replay(steps)
            ring = self.device.backend.read_async(g.ring[:steps * g.width])  # (the rows these steps wrote)
        h = Launched(rows, [], g, steps, ring)
        self._advance(rows, steps, False)
        self._last = h
        return h

    def check_follow(self, prev: Launched) -> None:
        """ArgumentError unless `prev` is the last launched step, of one-token choosing rows (a graph that feeds
        back)."""
        if prev is not self._last or prev.graph is None or not prev.graph.feeds_back:
            raise ArgumentError("follow continues the last launched step of one-token choosing rows only")

    def collect(self, h: Launched) -> Collected:
        """The results of launched steps (waits for their readbacks)."""
        if h.ring is not None:  # followed steps: one-token rows, the ring's first rows
            raw = bytes(h.ring.wait())
            width = h.graph.width  # type: ignore[union-attr]
            ring = struct.unpack(f"<{len(raw) // 4}i", raw)
            return Collected([list(ring[i * width:i * width + len(h.rows)]) for i in range(h.steps)],
                             [None] * len(h.rows))
        tokens: list[int | None] = [None] * len(h.rows)
        logits: list[Any] = [None] * len(h.rows)
        every: list[Any] = [None] * len(h.rows)
        for part in h.parts:
            chosen: list[int] = []
            for ticket in part.best:
                raw = bytes(ticket.wait())
                chosen.extend(struct.unpack(f"<{len(raw) // 4}i", raw))
            rows_logits: list[Any] = []
            for ticket, dtype, V in part.logits:
                rows_logits.extend(logits_rows(bytes(ticket.wait()), dtype, V))
            j = 0  # past the row's last place among the part's head rows
            for i in part.index:
                r = h.rows[i]
                n, j = r.head_rows, j + r.head_rows
                if r.every_logits:
                    every[i] = _stack(rows_logits[j - n:j])
                if r.pick:
                    tokens[i] = int(chosen[j - 1])
                    logits[i] = rows_logits[j - 1] if r.reads else None
        return Collected([tokens], logits, every if any(r.every_logits for r in h.rows) else None)

    def release(self, slot: int) -> None:
        """The slot's sequence is done; its next row starts at position 0."""
        self.truncate(slot, 0)

    def reserve(self, slot: int, positions: int) -> None:
        """Give the slot's sequence the runner's own KV blocks for its first `positions` positions (a caller that runs
        its own `StepBatch` over `cache` at positions no row of the runner reached yet); KVCacheFullError when the
        pool is out."""
        self._check_slot(slot)
        if positions > 0:
            self._place([RunRow(slot, (0,), positions - 1)])

    def truncate(self, slot: int, n: int) -> None:
        """Keep the slot's first `n` positions (their keys and values stay valid); the next row starts at n. The
        runner's own blocks past them go back to its pool. Where the blocks a row at n would read were given back
        (behind the window: `_keepable`), nothing is kept (n = 0)."""
        self._check_slot(slot)
        n = self._keepable(slot, max(0, min(n, self._length[slot])))
        self._length[slot] = n
        del self._held[slot][n:]
        owned = self._owned[slot]
        keep = self.blocks.blocks_for(n)
        if len(owned) > keep:
            self.blocks.release(owned[keep:])
            del owned[keep:]
            self.cache.set_blocks(slot, owned)

    def hold(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that the slot's cache holds the keys and values of `tokens` at positions 0.. (a client that knows
        what followed steps fed back says so, so that a later prompt starting with them can reuse them)."""
        self._check_slot(slot)
        self._held[slot] = list(tokens[:self._length[slot]])

    def common_prefix(self, slot: int, ids: Sequence[int]) -> int:
        """How many of `ids`' first tokens the slot already holds (at most len(ids) - 1: the last one is always run,
        for its logits), as far as a row after them can read them (0 where the blocks it would read behind its
        window were given back: `_keepable`)."""
        held, n = self._held[slot], 0
        for a, b in zip(held, ids[:len(ids) - 1], strict=False):
            if a != b:
                break
            n += 1
        return self._keepable(slot, n)

    def length(self, slot: int) -> int:
        """Tokens the slot holds."""
        return self._length[slot]

    def close(self) -> None:
        """Free the captured graphs."""
        for g in self._graphs.values():
            g.release()
        self._graphs.clear()
        self._last = None

    @property
    def last_launched(self) -> Launched | None:
        """The step `follow` may continue."""
        return self._last

    @property
    def graph_stats(self) -> dict[str, float]:
        """Step graphs captured so far, the milliseconds that took, and how many are held (/health)."""
        return {"captured": self._captured, "capture_ms": round(self._capture_ms, 1), "held": len(self._graphs)}

    # -- helpers ----------------------------------------------------------------------------------------
    def _advance(self, rows: Sequence[RunRow], steps: int, known: bool) -> None:
        """The slots' lengths moved on by `steps` steps of `rows`, and the tokens they hold where `known` (followed
        steps' inputs are known to the device only)."""
        for r in rows:
            self._length[r.slot] = r.next_position + steps - 1
            held = self._held[r.slot]
            del held[r.start:]
            if known:
                held.extend(r.ids)

    def _bits(self, masks: list[bytes | None], n: int) -> bytes:
        """The head rows' masks as one (n, words) int32 upload (rows without one, and padding: every token)."""
        every = b"\xff" * (4 * ((self.vocab_size + 31) // 32))
        for m in masks:
            if m is not None and len(m) != len(every):
                raise ArgumentError(f"a token mask of {len(m)} bytes for a vocabulary of {self.vocab_size} "
                                    f"({len(every)} bytes)")
        return b"".join(m if m is not None else every for m in masks) + every * (n - len(masks))

    def _bits_tensor(self, masks: list[bytes | None]) -> Tensor:
        """`_bits` of these head rows as a new (rows, words) tensor (a launch run eagerly)."""
        return from_buffer(self._bits(masks, len(masks)), (len(masks), (self.vocab_size + 31) // 32), "int32",
                           self.device)

    def _graph(self, key: tuple[Any, ...], make: Any) -> _StepGraph | _ChunkGraph:
        """The graph of `key` (see `_graphs`), captured by `make()` on first use; beyond MAX_GRAPHS the least
        recently used are released (never the one `follow` may replay)."""
        g = self._graphs.pop(key, None)  # (re-inserted last: the dict runs least to most recent)
        if g is None:
            t0 = time.perf_counter()
            g = make()  # (a capture first submits what is pending: no replay of a graph released below is queued)
            self._captured += 1
            self._capture_ms += (time.perf_counter() - t0) * 1e3
            excess = len(self._graphs) + 1 - MAX_GRAPHS
            if excess > 0:
                in_use = self._last.graph if self._last is not None else None  # (`follow` may replay it)
                for old in [k for k, v in self._graphs.items() if v is not in_use][:excess]:
                    self._graphs.pop(old).release()
        self._graphs[key] = g
        return g

    def _place(self, rows: Sequence[RunRow], steps: int = 1) -> None:
        """Each row's sequence in the block table, covering the positions its `steps` steps write: the row's own
        blocks, or the runner's: first every row's blocks behind its window given back (`_drop_unread`), then the
        rest grown (KVCacheFullError when its pool is out); then the changed rows uploaded."""
        own = []
        for r in rows:
            if r.blocks is not None:
                self._external = True
                self.cache.set_blocks(r.slot, r.blocks)
            else:
                own.append((r, self._drop_unread(r.slot, r.start)))
        for r, changed in own:
            owned = self._owned[r.slot]
            need = self.blocks.blocks_for(r.next_position + steps - 1)
            first = stale_blocks(r.start, self.kv_window, self.block_size)
            owned.extend([HOLE] * (first - len(owned)))  # (a row far past the slot's blocks: none behind its window)
            gaps = ([i for i in range(first, min(need, len(owned))) if owned[i] == HOLE]  # (a row back at a hole)
                    if self.kv_window is not None else [])  # (holes only where blocks are given back)
            new = self.blocks.allocate(len(gaps) + max(0, need - len(owned)))
            for i, b in zip(gaps, new, strict=False):
                owned[i] = b
            owned.extend(new[len(gaps):])
            if changed or new:
                self.cache.set_blocks(r.slot, owned)
        self.cache.sync()

    def _drop_unread(self, slot: int, start: int) -> bool:
        """The slot's own blocks that no row at `start` or later reads back to the pool: every one for a new
        sequence (start 0), else those behind every layer's window (HOLE in their place). Whether any went."""
        owned = self._owned[slot]
        if start == 0:
            had = bool(owned)
            self.blocks.release(owned)
            owned.clear()
            return had
        n = min(stale_blocks(start, self.kv_window, self.block_size), len(owned))
        if n and owned[n - 1] != HOLE:  # (the holes are the list's first entries)
            self.blocks.release_front(owned, n)
            return True
        return False

    def _growth(self, slot: int, start: int, end: int) -> int:
        """How many more of the runner's blocks the slot holds once placed for a row writing positions start ..
        end - 1 (`_place`): the blocks it takes less those it gives back behind the window."""
        need = self.blocks.blocks_for(end)  # (> the stale ones: a row reads its own position)
        owned = self._owned[slot][:need] if start else self._owned[slot]  # (start 0: every block given back)
        held = len(owned) - (owned.count(HOLE) if self.kv_window is not None else 0)  # (holes only with a window)
        return need - stale_blocks(start, self.kv_window, self.block_size) - held

    def _keepable(self, slot: int, n: int) -> int:
        """n, where a row at position n reads only positions whose blocks the slot still holds; else 0 (a block it
        would read was given back: behind the window of a later position)."""
        owned = self._owned[slot]
        first = stale_blocks(n, self.kv_window, self.block_size)
        return n if HOLE not in owned[first:self.blocks.blocks_for(n)] else 0

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise ArgumentError(f"slot {slot} is out of range for {self.n_slots} slots")

    def _check(self, rows: Sequence[RunRow]) -> None:
        """Every row checked before any runs: a bad one fails the step with nothing written."""
        seen: set[int] = set()
        for r in rows:
            self._check_slot(r.slot)
            if r.slot in seen:
                raise ArgumentError(f"slot {r.slot} has two rows in one step")
            seen.add(r.slot)
            if not r.ids:
                raise ArgumentError(f"the row for slot {r.slot} has no tokens")
            if r.blocks is not None:
                if len(r.blocks) * self.block_size < r.next_position:
                    raise ArgumentError(f"the row for slot {r.slot} reaches position {r.next_position - 1}, past its "
                                        f"{len(r.blocks)} KV blocks of {self.block_size}")
                if self.blocks.used:
                    raise ArgumentError("rows with their own KV blocks on a runner that allocates its own")
            elif self._external:
                raise ArgumentError(f"the row for slot {r.slot} has no KV blocks, on a runner whose caller gives them")
            elif r.start != 0 and self._length[r.slot] != r.start:
                raise ArgumentError(f"slot {r.slot} holds {self._length[r.slot]} tokens, the row starts at {r.start}")
            check_ids(r.ids, self.vocab_size)
            if r.start + len(r.ids) > self.n_ctx:
                raise ContextLengthError(f"{r.start} cached + {len(r.ids)} new tokens exceed the context of "
                                         f"{self.n_ctx} positions")
