"""The decode loops, written once for every model and device over a `ModelRunner`: one sequence
(`generate`, greedy or sampled, streaming token by token) and several greedy sequences together
(`generate_batch`). Importable without numpy (the page).

The prompt runs through the runner's prompt-chunk graphs (`prefill`). Greedy decoding then launches one step and
follows it with submits of growing size (1, 2, 4 .. `batch` steps), each queued before the previous one's
tokens are read: the argmax runs on the device and feeds the next step there (`ModelRunner.follow`), so the
device never waits for the host. Sampled decoding reads each step's logits row back and picks on the host
(`pick(logits, position)`: the one sampler, `webtensor.sampling`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import ops
from .runner import RING_STEPS, Launched, ModelRunner, RunRow, logits_rows, read_ints

Pick = Callable[[Any, int], int]  # (logits row, position) -> token id


def first_row(logits: Any) -> Any:
    """A (1, V) logits tensor as a float32 row (numpy, or array.array without numpy)."""
    return logits_rows(logits.tobytes(), logits.dtype.name, logits.shape[-1])[0]


def generate(runner: ModelRunner, ids: Sequence[int], n_new: int, greedy: bool, pick: Pick,
             eos: frozenset[int] | set[int] = frozenset(), batch: int = RING_STEPS, slot: int = 0,
             reuse_prefix: bool = False) -> Iterator[int]:
    """Yield up to `n_new` tokens after prompt `ids` (checked and fitted by the caller) in `slot` of `runner`,
    stopping after a token in `eos`. `reuse_prefix`: the prompt's first tokens that the slot still holds from the
    last generation (a conversation's earlier turns) are not computed again."""
    out: list[int] = []
    try:
        for tok in _generate(runner, ids, n_new, greedy, pick, eos, batch, slot, reuse_prefix):
            out.append(tok)
            yield tok
    finally:  # the cache holds the prompt and every token but the last (whose keys no step has computed)
        runner.hold(slot, [*ids, *out[:-1]])


def _generate(runner: ModelRunner, ids: Sequence[int], n_new: int, greedy: bool, pick: Pick,
              eos: frozenset[int] | set[int], batch: int, slot: int, reuse_prefix: bool) -> Iterator[int]:
    p0 = runner.common_prefix(slot, ids) if reuse_prefix else 0
    runner.truncate(slot, p0)
    logits = runner.prefill(slot, ids[p0:], p0)
    pos = len(ids)
    tok = read_ints(ops.argmax(logits))[0] if greedy else pick(first_row(logits), pos)
    yield tok
    if tok in eos or n_new <= 1:
        return
    row = RunRow(slot, (tok,), pos, read_logits=not greedy)
    if greedy and runner.can_follow([row]):
        for (nxt,) in followed(runner, [row], n_new - 1, batch):
            yield nxt  # type: ignore[misc]
            if nxt in eos:
                return
        return
    for _ in range(n_new - 1):  # step by step: sampled, or a runner without graphs
        out = runner.collect(runner.launch([row]))
        pos += 1
        tok = out.tokens[0][0] if greedy else pick(out.logits[0], pos)  # type: ignore[assignment]
        yield tok
        if tok in eos:
            return
        row = RunRow(slot, (tok,), pos, read_logits=not greedy)


def followed(runner: ModelRunner, rows: list[RunRow], steps: int,
             batch: int = RING_STEPS) -> Iterator[list[int | None]]:
    """`steps` greedy steps from one-token choosing `rows`: yield each step's tokens (per row). A launch, then
    follows of 2, 4 .. `batch` steps, each queued before the previous one is read (double buffering)."""
    pending: deque[Launched] = deque([runner.launch(rows)])
    queued, size = 1, 2
    try:
        while pending:
            if queued < steps:
                k = min(size, steps - queued, batch)
                pending.append(runner.follow(pending[-1], k))
                queued += k
                size = min(batch, size * 2)
            if len(pending) >= 2 or queued >= steps:
                yield from runner.collect(pending.popleft()).tokens
    finally:
        for h in pending:  # an early stop (EOS, close) still waits for the staging buffers
            runner.collect(h)


def generate_batch(runner: ModelRunner, prompts: Sequence[Sequence[int]], n_new: int,
                   batch: int = RING_STEPS) -> Iterator[list[int | None]]:
    """Greedy decoding of several sequences together (prompt r in slot r): yield, step by step, the list of each
    row's next token (the first right after the prompts' prefills). Prompts (checked by the caller) must leave
    room for `n_new` tokens."""
    first = [read_ints(ops.argmax(runner.prefill(r, p)))[0] for r, p in enumerate(prompts)]
    yield list(first)
    if n_new > 1:
        rows = [RunRow(r, (t,), len(p)) for r, (t, p) in enumerate(zip(first, prompts, strict=True))]
        yield from followed(runner, rows, n_new - 1, batch)


class RunnerPool:
    """Free runners of one model, reused by generate() (a thread takes one, gives it back). The pool holds no
    reference to the model (no cycle: a dropped model is freed at once)."""

    def __init__(self) -> None:
        self._free: dict[Any, list[ModelRunner]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Any, make: Callable[[], ModelRunner]) -> ModelRunner:
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return make()

    def release(self, key: Any, runner: ModelRunner) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(runner)

    def clear(self) -> None:
        with self._lock:
            for runners in self._free.values():
                for r in runners:
                    r.close()
            self._free = {}
