"""What the scheduler drives: the `Engine` protocol, and `ModelEngine`, the engine over a model's runner.

An engine owns `max_batch` sequence slots over one paged KV pool (`kv_blocks` blocks of `block_size` positions:
docs/design-kv.md). Each scheduler step hands it a list of `Row`s, at most one per slot: the tokens to feed that
slot this step (a prefill chunk or one decoded token) at the positions `start`.., whether to choose a next token
after them, and the sequence's KV blocks (`Row.blocks`: the scheduler decides them; rows without blocks leave the
engine's runner to allocate its own). The engine returns, per row in order,
the chosen token id (or None where `sample` is False), a `Picked` where log-probabilities are reported with it
(the chosen token's, and with `Row.targets` the prompt's: OpenAI's echo), or a `RowError` where choosing that
row's token raised (its sampling refused its logits or parameters, its grammar failed): that row alone failed,
the step and every other row in it are good. When a sequence is done the scheduler calls `release(slot, keep)`;
the slot's next row starts at position `keep` (its first `keep` positions are a prefix the scheduler may reuse).

All engine calls come from one worker thread, one at a time.

Sampling is per row, through the one sampler `webtensor.sampling.sample`: greedy (temperature 0: the argmax the
device computed) or seeded, the random draw for the token at position p a function of (seed, p) alone, so a
request yields the same tokens whether it runs alone or among others and whatever steps its prefill was cut into,
and the same tokens as `LanguageModel.generate` and the web page with that seed. A sequence whose sampling moves
its logits (penalties, logit_bias, min_tokens) has a `sampling.SequenceState` here, per slot, started by its first
row (`Row.new`, with the prompt where the repetition penalty reads it) and moved on by each token chosen; one with
a `response_format` has a `grammar.Constraint`, whose mask for the next token goes with the row to the device
(`RunRow.mask`: applied to the logits before the argmax and the readback). Rows read their logits back only
where the token is chosen or reported on the host (`Sampling.on_host`); greedy rows that ask for none of that
keep the device's argmax and can be followed.

`ModelEngine` runs the steps on the model's `runtime.ModelRunner`. "batched" (the server's default): a whole step,
decode tokens and prompt chunks alike, as one forward (the weights read once a step for all rows), captured step
graphs replayed, greedy steps followed on the device (`follow`). "reference": each row alone, eagerly, through the
same forward — the oracle the batched engine must equal: in float32 a request's tokens are bit for bit the same
alone or among any others (the runner's products are stacks of one-row products). float16 and quantized weights
on a GPU: a step of more than the kernel policy's `gemv_stack_f16_max_rows` / `gemv_stack_quant_max_rows` rows
(16) runs its products on the tiled engine, whose sums differ from the GEMV's in the last bits: logits agree to
the product's rounding, and a greedy token can differ where two logits are that close.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from ..errors import ArgumentError
from ..models.base import memory_line
from ..runtime.blocks import held_blocks
from ..runtime.logprobs import TokenLogprob, report, report_rows
from ..runtime.runner import Collected, Launched, RunRow, prefill_policy
from ..sampling import SamplingParams, SequenceState, sample

if TYPE_CHECKING:
    from ..models.base import LanguageModel


class Tokenizer(Protocol):
    """What the server asks of a tokenizer (`webtensor.text.Tokenizer` has it)."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """`add_special_tokens`: with the tokenizer's own special tokens (a BOS), as HF's tokenizer(text)."""
        ...

    def token_bytes(self, i: int, *, skip_special_tokens: bool = True) -> bytes:
        """The bytes token `i` stands for; b"" for a special token unless `skip_special_tokens=False`."""
        ...


@dataclass(frozen=True)
class Sampling:
    """How to choose a sequence's tokens (`webtensor.sampling.SamplingParams`' fields: temperature 0 is greedy,
    `seed` drives the draws), and what to report with them: `logprobs` (None: nothing; k: each chosen token's
    log-probability and the k most likely)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    constrained: bool = False  # the tokens follow a grammar (given with the sequence's first row: `Row.grammar`)

    @functools.cached_property
    def _params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed, self.min_p, self.presence_penalty,
                              self.frequency_penalty, self.repetition_penalty, self.logit_bias, self.min_tokens,
                              self.stop_token_ids)

    def params(self) -> SamplingParams:
        """The sampler's parameters (checked: SamplingError for what it refuses)."""
        return self._params

    @property
    def stateful(self) -> bool:
        """Whether choosing reads the sequence's state (penalties, logit_bias, min_tokens: `SequenceState`); as
        `SamplingParams.moves_logits`, from the fields alone (parameters the sampler refuses fail their row
        when it chooses, not the step that reads this)."""
        return bool(self.min_tokens or self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)

    @property
    def on_host(self) -> bool:
        """Whether the token is chosen on the host from the logits read back (else: the device's argmax, and
        the step may be followed on the device)."""
        return self.temperature != 0 or self.logprobs is not None or self.stateful or self.constrained


@dataclass(frozen=True)
class Row:
    """One sequence's work in one step."""

    slot: int  # 0 <= slot < engine.max_batch
    ids: tuple[int, ...]  # tokens to feed: a prefill chunk or the one token decoded last step
    start: int  # the position of ids[0]; the slot holds exactly this many tokens before the step
    sampling: Sampling
    sample: bool = True  # choose the token after ids (False: a prefill chunk that is not the last)
    new: bool = False  # the sequence's first row: its sampling state starts here
    prompt: tuple[int, ...] = ()  # with `new`: the whole prompt, where the state reads it (repetition_penalty)
    targets: tuple[int, ...] | None = None  # echo: the prompt tokens after each of ids (their log-probabilities)
    grammar: str | None = None  # with `new`: the llguidance grammar the sequence's tokens follow (serve.grammar)
    history: tuple[int, ...] = ()  # with `new`: tokens the sequence generated before (a resume after preemption)
    blocks: tuple[int, ...] | None = None  # the sequence's KV blocks, covering the row's positions (None: the runner's)

    @property
    def next_position(self) -> int:
        """The position the chosen token will take."""
        return self.start + len(self.ids)

    def run_row(self, mask: bytes | None = None) -> RunRow:
        """The runner's row: read the logits back where the token is chosen on the host (a greedy row with only a
        grammar's `mask`: the device's argmax of the masked logits), and every position's where the prompt's own
        log-probabilities are asked for."""
        s = self.sampling
        host = s.on_host and not (mask is not None and s.temperature == 0 and s.logprobs is None and not s.stateful)
        return RunRow(self.slot, self.ids, self.start, self.sample, self.sample and host, self.targets is not None,
                      mask if self.sample else None, self.blocks)


@dataclass(frozen=True)
class RowError:
    """In place of a row's token: choosing it raised (`message`: the exception's type and text).
    Only that row failed; the scheduler ends its request with an error and goes on with the rest."""

    message: str


@dataclass(frozen=True)
class Picked:
    """In place of a row's token where log-probabilities are reported: the token (None: a prompt chunk that
    does not choose), its report (None unless the sampling's `logprobs` asks), and the reports of the prompt
    tokens the row's `targets` named (echo)."""

    token: int | None
    logprob: TokenLogprob | None = None
    prompt: tuple[TokenLogprob, ...] = ()


Token = int | Picked | RowError | None  # what `step` / `collect` return per row


class Engine(Protocol):
    name: str  # the model's name, as /v1/models lists it
    max_batch: int  # slots
    n_ctx: int  # positions per slot (prompt + generated tokens)
    vocab_size: int
    eos_ids: frozenset[int]  # generation stops at any of these
    bos_id: int | None  # an empty prompt starts from this (else from an EOS id)
    tokenizer: Tokenizer
    chat_template: str | None  # the model's jinja2 chat template (None: webtensor's plain one)
    # optional: `engine`, the kind ("batched", "reference") that /health reports; `kv_blocks` and `block_size`,
    # the KV pool the scheduler then allocates from (rows carry their blocks), `kv_window` (every layer's window,
    # where all slide: the blocks behind it are given back as a sequence moves on), `kv_dtype` and `memory` (a line)

    def step(self, rows: Sequence[Row]) -> list[Token]:
        """Run `rows` (at most one per slot); per row in order, the chosen token, None (a row that
        does not sample) or a RowError (that row's choice raised)."""
        ...

    def release(self, slot: int, keep: int = 0) -> None:
        """The slot's sequence is done (finished, cancelled or failed); its next row starts at position `keep`
        (the first `keep` positions' keys and values stay: the scheduler reuses them for a prompt that
        starts with the same tokens)."""
        ...


class LaunchingEngine(Engine, Protocol):
    """An engine whose steps are started and collected apart (the device works on one while the scheduler
    plans the next); `step(rows)` is `collect(launch(rows))[0]`. The handle is the engine's own."""

    def launch(self, rows: Sequence[Row]) -> Any: ...

    def collect(self, handle: Any) -> list[list[Token]]:
        """The launched work's tokens, per step (one, unless followed steps)."""
        ...


class FollowingEngine(LaunchingEngine, Protocol):
    """A launching engine that can follow a launched step with `steps` more, each fed the last one's argmax on
    the device (greedy decode rows: `followable`)."""

    def can_follow(self, rows: Sequence[Row], steps: int = 1) -> bool: ...

    def follow(self, prev: Any, rows: Sequence[Row], steps: int = 1) -> Any: ...


def launches(engine: Engine) -> TypeGuard[LaunchingEngine]:
    """Whether `engine` launches and collects its steps apart (else: `step` alone)."""
    return hasattr(engine, "launch")


def follows(engine: Engine) -> TypeGuard[FollowingEngine]:
    """Whether `engine` can follow its launched steps on the device."""
    return hasattr(engine, "can_follow")


def followable(rows: Sequence[Row], n_ctx: int, steps: int = 1) -> bool:
    """Whether `rows` can start `steps` followed steps (an engine's `follow`: each step's argmax fed back on the
    device as the next one's input): greedy one-token decode rows, each step's token within the context."""
    return bool(rows) and all(len(r.ids) == 1 and r.sample and not r.sampling.on_host
                              and r.targets is None and r.start + steps < n_ctx for r in rows)


def choose(logits: Any, s: Sampling, position: int, state: SequenceState | None = None) -> int | RowError:
    """The token for `position` from its logits (V,): argmax, or the draw for (seed, position); a
    RowError where that raises (NaN logits, every logit -inf, parameters the sampler refuses): the
    failure is this row's alone, whatever else its step holds."""
    try:
        return sample(logits, s.params(), position, state)
    except Exception as e:  # noqa: BLE001 - any failure here concerns this row only
        return RowError(f"{type(e).__name__}: {e}")


@dataclass
class _Handle:
    """Launched work: the rows and the runner's handles (one for a batched step, one per row for the reference)."""

    rows: list[Row]
    launched: list[Launched]

    @property
    def steps(self) -> int:
        """Steps this launch runs (followed steps: several)."""
        return self.launched[-1].steps


class ModelEngine:
    """A model's sequences served from one runner of `max_batch` slots (see the module docstring)."""

    def __init__(self, model: LanguageModel, max_batch: int, name: str | None = None, engine: str = "batched",
                 use_graph: bool | None = None, prefix_reuse: bool = True, kv_blocks: int | None = None,
                 prefill_chunk: int | None = None, prefill_budget: int | None = None):
        """`prefix_reuse`: the scheduler shares the KV blocks of prompts' common starts (its prefix cache); False:
        every prompt is computed whole. `kv_blocks`: the KV pool's blocks (default: `max_batch` whole contexts).
        `prefill_chunk` (the tokens of a prompt row: one replayed prompt-chunk graph) and `prefill_budget` (the
        prompt tokens a step reads beside decoding sequences), what the scheduler asks of this engine: None for the
        device policy's (`runtime.runner.prefill_policy`)."""
        if model.tokenizer is None:
            raise ArgumentError("serving needs a model with a tokenizer")
        if max_batch < 1:
            raise ArgumentError(f"max_batch must be >= 1, got {max_batch}")
        if engine not in ("batched", "reference"):
            raise ArgumentError(f"engine must be 'batched' or 'reference', got {engine!r}")
        self.model, self.max_batch, self.engine = model, max_batch, engine
        self.name = name or model.name
        self.n_ctx, self.vocab_size = model.n_ctx, model.vocab_size
        self.eos_ids, self.bos_id = model.eos_ids, model.spec.bos_id
        self.tokenizer, self.chat_template = model.tokenizer, model.chat_template
        self.runner = model.runner(max_batch, use_graph=use_graph if engine == "batched" else False,
                                   kv_blocks=kv_blocks, prefill_chunk=prefill_chunk)
        self.prefill_chunk = self.runner.prefill_chunk
        self.prefill_budget = prefill_budget or prefill_policy(model.device)[1]
        if self.prefill_budget < 1:
            raise ArgumentError(f"prefill_budget must be >= 1, got {self.prefill_budget}")
        self.use_graph = self.runner.use_graph
        cache = self.runner.cache
        self.kv_blocks, self.block_size, self.kv_dtype = cache.n_blocks, cache.block_size, cache.kv_dtype
        self.kv_window = self.runner.kv_window  # (every layer's window: the scheduler gives back the blocks behind it)
        self.memory = memory_line(model.weight_bytes, model.dtype or "as stored", cache.kv_dtype, cache.position_bytes,
                                  cache.positions, cache.n_blocks, cache.block_size, self.kv_window,
                                  held_blocks(self.n_ctx, cache.block_size, self.kv_window, self.runner.step_rows))
        self.prefix_reuse = prefix_reuse
        self._states: dict[int, SequenceState] = {}  # slot -> its sequence's sampling state (where it reads one)
        self._constraints: dict[int, Any] = {}  # slot -> its sequence's grammar.Constraint (or the error making it)

    # -- the protocol ---------------------------------------------------------------------------------------
    def step(self, rows: Sequence[Row]) -> list[Token]:
        return self.collect(self.launch(rows))[0]

    def release(self, slot: int, keep: int = 0) -> None:
        """The slot's sequence is done; its first `keep` positions stay valid for a prompt that starts with the same
        tokens in this slot (rows without blocks: the runner's own), its next row starts there."""
        self._states.pop(slot, None)
        self._constraints.pop(slot, None)
        self.runner.truncate(slot, keep)

    def launch(self, rows: Sequence[Row]) -> _Handle:
        """Start a step (the device works on it while the caller goes on); `collect` its tokens."""
        for r in rows:
            if r.new:
                self._states.pop(r.slot, None)
                self._constraints.pop(r.slot, None)
                if r.sampling.stateful:
                    self._states[r.slot] = state = SequenceState(r.prompt, self.eos_ids)
                    for tok in r.history:  # (a resumed sequence: its state as it was)
                        state.add(tok)
                if r.grammar is not None:
                    self._constraints[r.slot] = self._resumed(self._constraint(r.grammar), r.history)
        run = [r.run_row(self._mask(r)) for r in rows]
        if self.engine == "batched":
            return _Handle(list(rows), [self.runner.launch(run)])
        self.runner._check(run)  # (every row checked before any runs)
        return _Handle(list(rows), [self.runner.launch([r]) for r in run])

    def can_follow(self, rows: Sequence[Row], steps: int = 1) -> bool:
        """Whether `follow` can launch `steps` steps from these rows (greedy one-token decode rows)."""
        return self.engine == "batched" and followable(rows, self.n_ctx, steps) and \
            self.runner.can_follow([r.run_row() for r in rows], steps)

    def follow(self, prev: _Handle, rows: Sequence[Row], steps: int = 1) -> _Handle:
        """Launch `steps` steps after `prev` (the last launched) for the same sequences before prev's tokens are
        known, each step's input the token the step before chose (fed back on the device). `rows` are prev's rows
        moved on by prev's steps: the first followed step's (their ids are not read)."""
        last = prev.launched[-1]
        self.runner.check_follow(last)
        if [(r.slot, r.start) for r in rows] != [(r.slot, r.start + last.steps) for r in prev.rows]:
            raise ArgumentError("follow's rows must be the previous step's, moved on by its steps")
        blocks = {r.slot: r.blocks for r in rows if r.blocks is not None}
        return _Handle(list(rows), [self.runner.follow(last, steps, blocks or None)])

    def collect(self, h: _Handle) -> list[list[Token]]:
        """The tokens of launched steps: per step, per row in order (None where a row does not choose)."""
        if self.engine == "batched":
            return self._choose(h.rows, self.runner.collect(h.launched[0]))
        out: list[Token] = []
        for r, launched in zip(h.rows, h.launched, strict=True):
            out.extend(self._choose([r], self.runner.collect(launched))[0])
        return [out]

    def _choose(self, rows: list[Row], got: Collected) -> list[list[Token]]:
        if len(got.tokens) > 1 or not got.logits:  # followed steps (greedy) or an empty step
            return got.tokens  # type: ignore[return-value]
        every = got.every_logits or [None] * len(rows)
        return [[self._pick(r, tok, logits, e)
                 for r, tok, logits, e in zip(rows, got.tokens[0], got.logits, every, strict=True)]]

    def _pick(self, r: Row, tok: int | None, logits: Any, every: Any) -> Token:
        """One row's result from what the step read back: the device's argmax, or the token chosen on the host
        from the row's logits (moved on by its state), with the log-probabilities it asks for."""
        s = r.sampling
        try:
            prompt: tuple[TokenLogprob, ...] = ()
            if r.targets is not None:  # (position i's logits give the log-probability of targets[i])
                prompt = tuple(report_rows(every[:len(r.targets)], r.targets, s.logprobs or 0))
            constraint = self._constraints.get(r.slot)
            if isinstance(constraint, Exception) and tok is not None:  # (its grammar failed: this row fails)
                raise constraint
            if tok is None or (logits is None and constraint is None):
                return Picked(tok, None, prompt) if prompt else tok
            state = self._states.get(r.slot)
            if logits is not None and s.on_host:  # (a grammar's mask is on them already: the device applied it)
                tok = sample(logits, s.params(), r.next_position, state)
            if state is not None:
                state.add(tok)
            if constraint is not None:
                constraint.consume(tok)
            lp = None if s.logprobs is None else report(logits, tok, s.logprobs)
            return Picked(tok, lp, prompt) if lp is not None or prompt else tok
        except Exception as e:  # noqa: BLE001 - any failure here concerns this row only
            return RowError(f"{type(e).__name__}: {e}")

    def _mask(self, r: Row) -> bytes | None:
        """The grammar's mask for the token `r` chooses (None: no grammar, or a failed one: its row fails when
        collected); applied on the device (`RunRow.mask`)."""
        c = self._constraints.get(r.slot)
        if c is None or isinstance(c, Exception) or not r.sample:
            return None
        try:
            return bytes(c.mask().tobytes())
        except Exception as e:  # noqa: BLE001 - the sequence's own failure
            self._constraints[r.slot] = e
            return None

    @staticmethod
    def _resumed(constraint: Any, history: tuple[int, ...]) -> Any:
        """A resumed sequence's grammar, moved on by the tokens it generated before (or the error doing so)."""
        try:
            for tok in history:
                if not isinstance(constraint, Exception):
                    constraint.consume(tok)
        except Exception as e:  # noqa: BLE001 - the sequence's own failure
            return e
        return constraint

    def _constraint(self, grammar: str) -> Any:
        """A sequence's grammar.Constraint, or the exception making it raised (its rows then fail alone)."""
        from . import grammar as g

        try:
            return g.Constraint(g.grammar_tokenizer(self.tokenizer, self.vocab_size, self.eos_ids), grammar,
                                self.vocab_size)
        except Exception as e:  # noqa: BLE001 - the sequence's own failure
            return e

    @property
    def graph_stats(self) -> dict[str, float]:
        return self.runner.graph_stats

    def close(self) -> None:
        """Free the captured graphs."""
        self.runner.close()
