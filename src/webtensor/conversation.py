"""A conversation with a model, as the terminal chat (`webtensor chat`) keeps one: its messages (a system message
first, kept through a reset and through dropping), the prompt they render to with the model's chat template, what
happens when the conversation outgrows the context (refused, or its oldest exchanges dropped), and each reply,
streamed as text that ends where the turn ends (`chat.turn_stops`), with the reason it ended.

    conv = Conversation(model, system="Be brief.", drop_oldest=True)
    turn = conv.prepare("Hello!")        # the prompt's ids; a ChatTemplateError or ContextLengthError changes nothing
    reply = conv.reply(turn, temperature=0.7, seed=1)
    for piece in reply:                  # text as it forms (special tokens never shown)
        print(piece, end="")
    conv.commit(turn, reply)             # the exchange joins the conversation (a stopped reply as far as it got)
    reply.finish                         # "stop", "length" (max_new_tokens), "context" (no room left), "interrupted"

A reply reuses the KV cache of the turns before it (`generate_ids(..., reuse_prefix=True)`): each turn computes only
the tokens the last one did not. Nothing here reads a terminal or prints: the front end does (`chat_cli`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .chat import TurnStops, turn_stops
from .errors import ContextLengthError
from .serve.textstream import TextStream
from .validate import check_text

Message = dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """A user message ready to be answered: the messages the prompt renders (after any dropping), its ids, how many
    of the oldest exchanges were dropped to make room, and the positions left for the reply."""

    messages: list[Message]
    ids: list[int]
    dropped: int
    room: int


class Conversation:
    def __init__(self, model: Any, system: str | None = None, drop_oldest: bool = False,
                 max_new_tokens: int | None = None):
        """`model`: a LanguageModel. `drop_oldest`: when the conversation and a new message leave less room than a
        reply needs (`max_new_tokens`, or a quarter of the context when that is None), drop the oldest exchanges
        (the system message stays) instead of refusing the message. `max_new_tokens`: the most a reply may take
        (None: up to the rest of the context)."""
        self.model, self.drop_oldest, self.max_new_tokens = model, drop_oldest, max_new_tokens
        self.system = None if system is None else check_text(system)
        self.history: list[Message] = []  # the exchanges, oldest first (no system message)
        self.stops: TurnStops = turn_stops(model)

    @property
    def messages(self) -> list[Message]:
        """The whole conversation: the system message (if any), then the exchanges."""
        return [*self._head(), *self.history]

    def _head(self) -> list[Message]:
        return [{"role": "system", "content": self.system}] if self.system is not None else []

    def reset(self) -> None:
        """Start over: no exchanges (the system message stays)."""
        self.history = []

    def set_system(self, text: str | None) -> None:
        """Set (None: remove) the system message; the exchanges stay."""
        self.system = None if text is None else check_text(text)

    def prepare(self, text: str) -> Turn:
        """The prompt for the next user message `text`: SamplingError for text that is not valid Unicode,
        ChatTemplateError where the template refuses the conversation, ContextLengthError where it does not fit
        (with `drop_oldest`: not even after dropping every earlier exchange). None of them changes the conversation."""
        user = {"role": "user", "content": check_text(text)}
        head, history = self._head(), list(self.history)
        n_ctx = self.model.n_ctx
        need = (self.max_new_tokens or max(1, n_ctx // 4)) if self.drop_oldest else 1
        dropped = 0
        while True:
            messages = [*head, *history, user]
            ids: list[int] = self.model.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            room = n_ctx - len(ids)
            if room >= need or not (self.drop_oldest and history):
                break
            history = history[_first_exchange(history):]
            dropped += 1
        if room < 1:
            what = (f"the conversation with this message is {len(ids)} tokens" if history else
                    f"this message is {len(ids)} tokens as the chat template renders it"
                    f"{' after the system message' if head else ''}")
            raise ContextLengthError(f"{what}, over the context of {n_ctx} positions")
        return Turn(messages, ids, dropped, room)

    def reply(self, turn: Turn, **sampling: Any) -> Reply:
        """The assistant's reply to `turn` (not started until iterated): at most `max_new_tokens` and the room left.
        `sampling`: temperature, top_k, top_p, seed and the rest `generate_ids` takes."""
        n = min(self.max_new_tokens or turn.room, turn.room)
        return Reply(self.model, turn.ids, n, self.stops, by_context=n == turn.room, **sampling)

    def commit(self, turn: Turn, reply: Reply) -> None:
        """Make the exchange part of the conversation: `turn`'s messages (after its dropping) and the reply's text,
        as far as it went. A reply interrupted before any text leaves the conversation as it was."""
        if reply.finish == "interrupted" and not reply.text:
            return
        self.history = [*turn.messages[len(self._head()):], {"role": "assistant", "content": reply.text}]


def _first_exchange(history: list[Message]) -> int:
    """How many messages the oldest exchange takes: its user message and everything up to the next user message
    (so that what is left still starts with a user message, as templates that check roles alternate expect)."""
    return next((i for i, m in enumerate(history) if i > 0 and m["role"] == "user"), len(history))


class Reply:
    """One assistant turn, streamed: iterate for the text as it forms (leading whitespace left out; a stop string,
    and what follows, never shown), then read `text` (the whole reply, stripped: what the conversation keeps),
    `finish` and `n_tokens`. `stop()` ends it at the next token (safe to call from a signal handler)."""

    def __init__(self, model: Any, ids: list[int], max_new_tokens: int, stops: TurnStops, by_context: bool,
                 **sampling: Any):
        self.model, self.ids, self.max_new_tokens, self.stops = model, ids, max_new_tokens, stops
        self.by_context = by_context  # the limit is the context's end (else max_new_tokens)
        self.sampling = sampling
        self.finish: str | None = None  # "stop", "length", "context" or "interrupted"
        self.n_tokens = 0
        self._pieces: list[str] = []
        self._stop_asked = False

    @property
    def text(self) -> str:
        return "".join(self._pieces).strip()

    def stop(self) -> None:
        self._stop_asked = True

    def __iter__(self) -> Iterator[str]:
        model = self.model
        ends = model.eos_ids | frozenset(self.stops.token_ids)
        # someone reads the reply as it forms: each token is read back as soon as it is chosen (follow_steps=1)
        tokens = model.generate_ids(self.ids, self.max_new_tokens, reuse_prefix=True,
                                    stop_token_ids=self.stops.token_ids, follow_steps=1, **self.sampling)
        text = TextStream(self.stops.strings)
        try:
            for tok in tokens:
                if self._stop_asked:  # (asked while this token formed: it is not shown)
                    self.finish = "interrupted"
                    break
                self.n_tokens += 1
                yield from self._shown(text.push(model.tokenizer.token_bytes(tok)))
                if text.stopped or tok in ends:
                    self.finish = "stop"
                    break
            else:
                self.finish = "context" if self.by_context else "length"
        except BaseException:
            self.finish = "interrupted"  # (a KeyboardInterrupt, or the caller's error: as far as it got)
            raise
        finally:
            tokens.close()  # (a stop: the tokens after it are not generated)
        yield from self._shown(text.finish())

    def _shown(self, piece: str) -> Iterator[str]:
        if not self._pieces:
            piece = piece.lstrip()
        if piece:
            self._pieces.append(piece)
            yield piece
