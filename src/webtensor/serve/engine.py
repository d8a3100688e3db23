"""What the scheduler drives: the `Engine` protocol, and `GPT2Engine`, its reference implementation.

An engine owns `max_batch` sequence slots, each with its own KV cache. Each scheduler step hands it
a list of `Row`s, at most one per slot: the tokens to feed that slot this step (a prefill chunk or
one decoded token) at the positions `start`.., and whether to choose a next token after them. The
engine returns, per row in order, the chosen token id (or None where `sample` is False), or a
`RowError` where choosing that row's token raised (its sampling refused its logits or parameters):
that row alone failed, the step and every other row in it are good. When a sequence is done the
scheduler calls `release(slot)`; the slot's next row starts at position 0.

All engine calls come from one worker thread, one at a time.

Sampling is per row, through the one sampler `webtensor.sampling.sample`: greedy (temperature 0)
or seeded, the random draw for the token at position p a function of (seed, p) alone, so a request
yields the same tokens whether it runs alone or among others and whatever steps its prefill was cut
into, and the same tokens as `GPT2.generate` and the web page with that seed.

`GPT2Engine` runs rows one after another, each alone, through the model's row path (`GPT2.forward`
with span=None: a decode token as `GPT2.generate`'s decode steps run it, a prompt chunk's tokens as
rows of one sequence, `shared_slots`). It is the oracle for `batched.BatchedGPT2Engine`, the
server's default, which runs all of a step's rows as one forward and must give exactly these
tokens (float16 on GPUs: see batched.py). A prompt read this way matches `GPT2.generate`'s prompt
pass (the span path: matrix-matrix products) to float rounding, so the server's tokens for a seed
are generate's except where two logits are that close.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .. import ops
from ..errors import ArgumentError, ContextLengthError
from ..generation import int_tensor
from ..models.gpt2.model import GPT2, KVCache
from ..sampling import SamplingParams, sample
from ..validate import check_ids


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def token_bytes(self, i: int) -> bytes: ...


@dataclass(frozen=True)
class Sampling:
    """How to choose a sequence's tokens: temperature 0 is greedy; `seed` drives the rest."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


@dataclass(frozen=True)
class Row:
    """One sequence's work in one step."""

    slot: int  # 0 <= slot < engine.max_batch
    ids: tuple[int, ...]  # tokens to feed: a prefill chunk or the one token decoded last step
    start: int  # the position of ids[0]; the slot holds exactly this many tokens before the step
    sampling: Sampling
    sample: bool = True  # choose the token after ids (False: a prefill chunk that is not the last)

    @property
    def next_position(self) -> int:
        """The position the chosen token will take."""
        return self.start + len(self.ids)


@dataclass(frozen=True)
class RowError:
    """In place of a row's token: choosing it raised (`message`: the exception's type and text).
    Only that row failed; the scheduler ends its request with an error and goes on with the rest."""

    message: str


Token = int | RowError | None  # what `step` / `collect` return per row


class Engine(Protocol):
    name: str  # the model's name, as /v1/models lists it
    max_batch: int  # slots
    n_ctx: int  # positions per slot (prompt + generated tokens)
    vocab_size: int
    eos_token_id: int | None
    tokenizer: Tokenizer
    # optional: `engine`, the kind ("batched", "reference") that /health reports

    def step(self, rows: Sequence[Row]) -> list[Token]:
        """Run `rows` (at most one per slot); per row in order, the chosen token, None (a row that
        does not sample) or a RowError (that row's choice raised)."""
        ...

    def release(self, slot: int) -> None:
        """The slot's sequence is done (finished, cancelled or failed); it may be reused from position 0."""
        ...


def followable(rows: Sequence[Row], n_ctx: int, steps: int = 1) -> bool:
    """Whether `rows` can start `steps` followed steps (an engine's `follow`: each step's argmax
    fed back on the device as the next one's input): greedy one-token decode rows, each step's
    token within the context (the last at position start + steps <= n_ctx - 1)."""
    return bool(rows) and all(len(r.ids) == 1 and r.sample and r.sampling.temperature == 0
                              and r.start + steps < n_ctx for r in rows)


def choose(logits: np.ndarray, s: Sampling, position: int) -> int | RowError:
    """The token for `position` from its logits (V,): argmax, or the draw for (seed, position); a
    RowError where that raises (NaN logits, every logit -inf, parameters the sampler refuses): the
    failure is this row's alone, whatever else its step holds."""
    try:
        return sample(logits, s.params(), position)
    except Exception as e:  # noqa: BLE001 - any failure here concerns this row only
        return RowError(f"{type(e).__name__}: {e}")


class GPT2EngineBase:
    """What both GPT-2 engines know of their model: its name, context, vocabulary, tokenizer."""

    def __init__(self, model: GPT2, max_batch: int, name: str | None = None):
        if model.tokenizer is None:
            raise ArgumentError("serving needs a model with a tokenizer")
        if max_batch < 1:
            raise ArgumentError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.max_batch = model, max_batch
        self.name = name or model.name
        cfg = model.config
        self.n_ctx, self.vocab_size = cfg.n_positions, cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        self.tokenizer = model.tokenizer


class GPT2Engine(GPT2EngineBase):
    """The reference engine: one KV cache per slot (made on first use), rows run one at a time."""

    engine = "reference"

    def __init__(self, model: GPT2, max_batch: int, name: str | None = None):
        super().__init__(model, max_batch, name)
        self._caches: list[KVCache | None] = [None] * max_batch

    def step(self, rows: Sequence[Row]) -> list[Token]:
        return [self._run(r) for r in rows]

    def release(self, slot: int) -> None:
        cache = self._caches[slot]
        if cache is not None:
            cache.length = 0

    def _run(self, row: Row) -> Token:
        if not 0 <= row.slot < self.max_batch:
            raise ArgumentError(f"slot {row.slot} is out of range for {self.max_batch} slots")
        cache = self._caches[row.slot]
        if cache is None:
            cache = self._caches[row.slot] = self.model.new_cache()
        if row.start == 0:
            cache.length = 0
        elif cache.length != row.start:
            raise ArgumentError(f"slot {row.slot} holds {cache.length} tokens, the row starts at {row.start}")
        dev, T = self.model.device, len(row.ids)
        if not T:
            raise ArgumentError(f"the row for slot {row.slot} has no tokens")
        tok = check_ids(row.ids, self.vocab_size)
        if row.start + T > self.n_ctx:
            raise ContextLengthError(f"{row.start} cached + {T} new tokens exceed the context of "
                                     f"{self.n_ctx} positions")
        with dev.dispatch_scope():
            logits = self.model.forward(int_tensor(tok, dev), int_tensor(list(range(row.start, row.start + T)), dev),
                                        int_tensor([0] * T, dev), cache, None, True, shared_slots=T > 1)  # (1, V)
            cache.length += T
            if not row.sample:
                return None
            if row.sampling.temperature == 0:
                return int(ops.argmax(logits).numpy()[0])  # a 4-byte readback
            return choose(logits.numpy()[0].astype(np.float32, copy=False), row.sampling, row.next_position)
