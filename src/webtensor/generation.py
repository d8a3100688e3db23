"""Generation, written once for every model and device: KV caches, workspaces, the decode step as
a captured graph, the greedy and sampling loops, streaming. Importable without numpy (the page).

A model gives `generate` what the `Decodable` protocol names: its device, context length,
vocabulary size, `new_cache(n_slots)` and `forward(ids, pos, slot, cache, span, last_only) ->
logits` — one forward over rows of (token, position, cache slot) tensors (`GPT2Weights` in
`models/gpt2/forward.py` is GPT-2's). Everything else is here:

- the prompt runs eagerly in one dispatch scope (its positions are known on the host, so `span`
  lets attention read the cache rows directly: the flash kernels);
- each decode step is `forward` over the state tensors (ids, pos, slot) captured once per
  workspace as a graph (`Device.capture`) and replayed: greedy steps end in an on-device argmax
  and `advance_tokens`, which moves the state on and appends the token to a ring that the host
  reads in batches while the next batch runs; sampled steps read one row of logits back;
- on the CPU a graph is a plan of numpy steps (`backends.cpu.CpuGraph`): the same loop, the same
  tokens, bit for bit what running the step again would give;
- `generate_batch` decodes several prompts together (one forward over all rows a step).
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from . import dtypes as dt
from . import ops
from .tensor import Tensor, empty, from_buffer


class Decodable(Protocol):
    device: Any
    n_ctx: int
    vocab_size: int
    use_graph: bool

    def new_cache(self, n_slots: int = 1) -> KVCache: ...

    def forward(self, ids: Tensor, pos: Tensor, slot: Tensor, cache: KVCache, span: tuple[int, int] | None,
                last_only: bool, batch_invariant: bool = True) -> Tensor: ...


class KVCache:
    """Per layer, keys and values for `n_slots` sequences of up to `n_ctx` positions:
    (n_slots, n_ctx, H, D) float32 each, on the device. `length` counts the positions written
    (for single-sequence callers such as the server's reference engine)."""

    def __init__(self, n_layer: int, n_slots: int, n_ctx: int, n_head: int, head_dim: int, device: Any):
        shape = (n_slots, n_ctx, n_head, head_dim)
        self.k = [empty(shape, dt.float32, device) for _ in range(n_layer)]
        self.v = [empty(shape, dt.float32, device) for _ in range(n_layer)]
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.length = 0


def int_tensor(values: Sequence[int], device: Any) -> Tensor:
    """An int32 tensor of `values` on `device` (no numpy needed)."""
    return from_buffer(struct.pack(f"<{len(values)}i", *values), (len(values),), dt.int32, device)


def upload_ints(t: Tensor, values: Sequence[int]) -> None:
    """Write `values` into the int32 tensor `t` (an upload between replays)."""
    t.device.backend.upload_into(t, struct.pack(f"<{len(values)}i", *values))


class DecodeState:
    """A graph's inputs and outputs on the device: rows of (token, position, slot), and the ring of
    tokens the greedy graph appends to (ring steps x rows) with its step counter."""

    def __init__(self, device: Any, rows: int, ring: int):
        self.rows, self.ring = rows, ring
        self.ids = int_tensor([0] * rows, device)
        self.pos = int_tensor([0] * rows, device)
        self.slot = int_tensor(list(range(rows)), device)
        self.tokens = int_tensor([0] * (ring * rows), device)
        self.count = int_tensor([0], device)

    def set(self, ids: Sequence[int], pos: Sequence[int], slots: Sequence[int] | None = None) -> None:
        upload_ints(self.ids, ids)
        upload_ints(self.pos, pos)
        if slots is not None:
            upload_ints(self.slot, slots)
        upload_ints(self.count, [0])


class Workspace:
    """What one generation needs besides the weights: a KV cache and, built on first use, the
    decode graphs over its state. Reused across calls (one per concurrent generation)."""

    def __init__(self, model: Decodable, cache: KVCache):
        self.cache = cache
        self.state = DecodeState(model.device, 1, model.n_ctx)
        self._greedy: Any = None
        self._logits: Any = None

    def _step(self, model: Decodable) -> Tensor:
        s = self.state
        return model.forward(s.ids, s.pos, s.slot, self.cache, None, False)  # (rows, V)

    def _stepper(self, model: Decodable) -> Callable[[], Tensor]:
        # (the model by weak reference: the CPU's graph keeps its function, and the model keeps
        # this workspace; a cycle would keep a dropped model alive until the next collection)
        ref, me = weakref.ref(model), weakref.ref(self)
        return lambda: me()._step(ref())  # type: ignore[union-attr, arg-type]

    def greedy_graph(self, model: Decodable) -> Any:
        if self._greedy is None:
            state, step = self.state, self._stepper(model)

            def greedy_step() -> Tensor:
                new = ops.argmax(step())  # (rows,)
                ops.advance_tokens(new, state.ids, state.pos, state.tokens, state.count)
                return new
            self._greedy = model.device.capture(greedy_step)
        return self._greedy

    def logits_graph(self, model: Decodable) -> Any:
        if self._logits is None:
            self._logits = model.device.capture(self._stepper(model))
        return self._logits

    def release(self) -> None:
        for g in (self._greedy, self._logits):
            if g is not None:
                g.release()
        self._greedy = self._logits = None


class WorkspacePool:
    """Free workspaces of one model, reused by generate() (a thread takes one, gives it back).
    The pool holds no reference to the model (no cycle: a dropped model is freed at once)."""

    def __init__(self) -> None:
        self._free: list[Workspace] = []
        self._lock = threading.Lock()

    def acquire(self, make: Callable[[], Workspace]) -> Workspace:
        with self._lock:
            if self._free:
                return self._free.pop()
        return make()

    def release(self, ws: Workspace) -> None:
        with self._lock:
            self._free.append(ws)

    def clear(self) -> None:
        with self._lock:
            for ws in self._free:
                ws.release()
            self._free = []


def prefill(model: Decodable, cache: KVCache, ids: Sequence[int], p0: int = 0, slot: int = 0) -> Tensor:
    """Run prompt `ids` at positions p0.. of cache slot `slot` (one dispatch scope): the last
    position's logits (1, V). Its keys and values stay in the cache."""
    dev, T = model.device, len(ids)
    with dev.dispatch_scope():
        return model.forward(int_tensor(list(ids), dev), int_tensor(list(range(p0, p0 + T)), dev),
                             int_tensor([slot] * T, dev), cache, (slot, p0), True)


def read_ints(t: Tensor) -> list[int]:
    raw = t.tobytes()
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))


def logits_row(t: Tensor) -> Any:
    """A (1, V) or (V,) float32 logits tensor as a numpy array, or an array.array('f') without numpy."""
    try:
        import numpy as np
    except ImportError:
        import array

        return array.array("f", t.tobytes())
    return np.frombuffer(t.tobytes(), np.float32)


Pick = Callable[[Any, int], int]  # (logits row, position) -> token id


def generate(model: Decodable, ws: Workspace, ids: Sequence[int], n_new: int, greedy: bool, pick: Pick,
             eos: frozenset[int] | set[int] = frozenset(), batch: int = 16) -> Iterator[int]:
    """Yield up to `n_new` tokens after prompt `ids` (checked and fitted by the caller), stopping
    after a token in `eos`. `pick(logits, position)` chooses a sampled token (not used when
    `greedy`: the argmax runs on the device). Greedy submits grow from 1 to `batch` steps; submit
    k+1 is queued before submit k's tokens are read."""
    dev = model.device
    logits = prefill(model, ws.cache, ids)
    pos = len(ids)
    tok = read_ints(ops.argmax(logits))[0] if greedy else pick(logits_row(logits), pos)
    yield tok
    if tok in eos:
        return
    rest = n_new - 1
    if not model.use_graph:  # op by op (a debugging aid and the reference for the graphs)
        for _ in range(rest):
            ws.state.set([tok], [pos])
            with dev.dispatch_scope():
                logits = ws._step(model)
                tok = read_ints(ops.argmax(logits))[0] if greedy else pick(logits_row(logits), pos + 1)
            pos += 1
            yield tok
            if tok in eos:
                return
        return
    ws.state.set([tok], [pos])
    if not greedy:
        graph = ws.logits_graph(model)
        for _ in range(rest):
            with dev.dispatch_scope():
                out = graph.replay()
            pos += 1
            tok = pick(logits_row(out), pos)
            yield tok
            if tok in eos:
                return
            ws.state.set([tok], [pos])
        return
    for (nxt,) in replay_steps(dev, ws.greedy_graph(model), ws.state.tokens, 1, rest, batch):
        yield nxt
        if nxt in eos:
            return


def replay_steps(dev: Any, graph: Any, tokens: Tensor, rows: int, steps: int, batch: int) -> Iterator[list[int]]:
    """Replay a greedy graph (one step: argmax + advance_tokens into the ring `tokens`) `steps`
    times, yielding each step's `rows` tokens. Submits grow from 1 to `batch` steps; submit k+1 is
    queued before submit k's tokens are read back (double buffering)."""
    queued, size = 0, 1
    inflight: list[tuple[Any, int]] = []  # (a readback's handle, its steps)
    try:
        while queued < steps or inflight:
            if queued < steps:
                k = min(size, steps - queued)
                with dev.dispatch_scope():
                    graph.replay(k)
                    inflight.append((dev.backend.read_async(tokens[queued * rows:(queued + k) * rows]), k))
                queued += k
                size = min(batch, size * 2)
            if len(inflight) >= 2 or queued >= steps:
                ticket, k = inflight.pop(0)
                toks = struct.unpack(f"<{k * rows}i", bytes(ticket.wait()))
                for j in range(k):
                    yield list(toks[j * rows:(j + 1) * rows])
    finally:
        for ticket, _ in inflight:  # an early stop (EOS, close) still returns the staging buffers
            ticket.wait()


def generate_batch(model: Decodable, prompts: Sequence[Sequence[int]], n_new: int,
                   batch: int = 16) -> Iterator[list[int]]:
    """Greedy decoding of several sequences together: yield, step by step, the list of each row's
    next token (the first right after the prompts' prefills). Prompt r runs in cache slot r; then
    every step is one forward over all rows (no span: each row attends by its own position; one
    matrix product for the batch, so a row may differ in the last bits from decoding it alone),
    captured once and replayed in submits of up to `batch` steps while the previous submit's tokens
    are read back. Prompts (checked by the caller) must leave room for `n_new` tokens."""
    dev, B = model.device, len(prompts)
    cache = model.new_cache(B)
    first = [read_ints(ops.argmax(prefill(model, cache, p, 0, r)))[0] for r, p in enumerate(prompts)]
    yield first
    rest = n_new - 1
    if rest <= 0:
        return
    state = DecodeState(dev, B, rest)
    state.set(first, [len(p) for p in prompts], list(range(B)))

    def step() -> Tensor:
        logits = model.forward(state.ids, state.pos, state.slot, cache, None, False, batch_invariant=False)
        new = ops.argmax(logits)  # (B,)
        ops.advance_tokens(new, state.ids, state.pos, state.tokens, state.count)
        return new

    graph = dev.capture(step)
    try:
        yield from replay_steps(dev, graph, state.tokens, B, rest, batch)
    finally:
        graph.release()
