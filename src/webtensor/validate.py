"""Checks on generation inputs: prompt ids, prompt text, sampling parameters, context fit.

One place for the rules and their messages, shared by `LanguageModel` (the API), `webtensor generate` (the
CLI, before it loads a model) and the page. It imports nothing but the standard library, so it runs
in Pyodide too; numpy integers and floats pass because numpy registers them with `numbers`.

Every check raises SamplingError (ContextLengthError for the context) naming the parameter by its
API name and the value it got, and returns the value normalised (a plain int / float / list).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any, TypeGuard

from .errors import ContextLengthError, SamplingError


def _is_int(x: object) -> TypeGuard[Integral]:
    return isinstance(x, Integral) and not isinstance(x, bool)


def _is_real(x: object) -> TypeGuard[Real]:
    return isinstance(x, Real) and not isinstance(x, bool)


def check_temperature(t: object) -> float:
    """A finite number >= 0; 0 means greedy."""
    if not _is_real(t) or not math.isfinite(float(t)) or float(t) < 0:
        raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    return float(t)


def check_top_k(k: object) -> int | None:
    """An integer >= 0, or None; 0 and None both mean no top-k (returned as None)."""
    if k is None:
        return None
    if not _is_int(k) or int(k) < 0:
        raise SamplingError(f"top_k must be an integer >= 0 (0 or None = off), got {k!r}")
    return int(k) or None


def check_top_p(p: object) -> float | None:
    """A number in (0, 1], or None (no nucleus cut; 1 keeps everything too)."""
    if p is None:
        return None
    if not _is_real(p) or not 0 < float(p) <= 1:
        raise SamplingError(f"top_p must be in (0, 1] (or None = off), got {p!r}")
    return float(p)


def check_seed(seed: object) -> int | None:
    """An integer >= 0, or None (a fresh random seed)."""
    if seed is None:
        return None
    if not _is_int(seed) or int(seed) < 0:
        raise SamplingError(f"seed must be an integer >= 0 (or None = random), got {seed!r}")
    return int(seed)


def check_max_new_tokens(n: object) -> int:
    """An integer >= 1."""
    if not _is_int(n) or int(n) < 1:
        raise SamplingError(f"max_new_tokens must be an integer >= 1, got {n!r}")
    return int(n)


def check_sampling(temperature: object = 1.0, top_k: object = None, top_p: object = None,
                   seed: object = None) -> tuple[float, int | None, float | None, int | None]:
    """All four sampling parameters at once: (temperature, top_k, top_p, seed), normalised."""
    return check_temperature(temperature), check_top_k(top_k), check_top_p(top_p), check_seed(seed)


def _check_range(name: str, v: object, lo: float, hi: float, lo_open: bool = False) -> float:
    if not _is_real(v) or not math.isfinite(float(v)) or not (lo < float(v) if lo_open else lo <= float(v)) \
            or float(v) > hi:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise SamplingError(f"{name} must be a number in {interval}, got {v!r}")
    return float(v)


def _check_id_list(name: str, ids: object) -> tuple[int, ...]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise SamplingError(f"{name} must be a sequence of token ids, got {ids!r}")
    out = tuple(ids)
    for i in out:
        if not _is_int(i) or int(i) < 0:
            raise SamplingError(f"{name} must hold token ids (integers >= 0), got {i!r}")
    return tuple(sorted({int(i) for i in out}))


def check_transforms(min_p: object = 0.0, presence_penalty: object = 0.0, frequency_penalty: object = 0.0,
                     repetition_penalty: object = 1.0, logit_bias: object = (), min_tokens: object = 0,
                     stop_token_ids: object = ()) -> dict[str, Any]:
    """The parameters that move the logits before sampling, and min_p, normalised by name: min_p in [0, 1]
    (None: 0), presence / frequency penalties in [-2, 2] (OpenAI's range), repetition_penalty in (0, 2]
    (1: off), logit_bias {id: bias in [-100, 100]} (as sorted (id, bias) pairs), min_tokens >= 0, and
    stop_token_ids (sorted, unique)."""
    out: dict[str, Any] = {
        "min_p": 0.0 if min_p is None else _check_range("min_p", min_p, 0.0, 1.0),
        "presence_penalty": _check_range("presence_penalty", presence_penalty, -2.0, 2.0),
        "frequency_penalty": _check_range("frequency_penalty", frequency_penalty, -2.0, 2.0),
        "repetition_penalty": _check_range("repetition_penalty", repetition_penalty, 0.0, 2.0, lo_open=True),
    }
    items = logit_bias.items() if isinstance(logit_bias, dict) else logit_bias
    try:
        if not isinstance(items, Iterable):
            raise TypeError
        pairs = [(i, b) for i, b in items]
    except (TypeError, ValueError):
        raise SamplingError(f"logit_bias must map token ids to numbers, got {logit_bias!r}") from None
    bias: dict[int, float] = {}
    for i, b in pairs:
        if not _is_int(i) or int(i) < 0:
            raise SamplingError(f"logit_bias keys must be token ids (integers >= 0), got {i!r}")
        bias[int(i)] = _check_range(f"logit_bias[{int(i)}]", b, -100.0, 100.0)
    out["logit_bias"] = tuple(sorted(bias.items()))
    if not _is_int(min_tokens) or int(min_tokens) < 0:
        raise SamplingError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    out["min_tokens"] = int(min_tokens)
    out["stop_token_ids"] = _check_id_list("stop_token_ids", stop_token_ids)
    return out


def check_ids(ids: Any, vocab_size: int) -> list[int]:
    """Prompt ids: a non-empty 1-D sequence (list, tuple, range, 1-D integer array) of ints in
    [0, vocab_size). Text, nested sequences, floats, bools and out-of-range ids are refused."""
    if isinstance(ids, str | bytes | bytearray):
        raise SamplingError("expected token ids; use model.stream(text) or model.encode(text) for text")
    ndim = getattr(ids, "ndim", 1)
    if ndim != 1:
        raise SamplingError(f"token ids must be a 1-D sequence, got an array of {ndim} dimensions "
                            f"(shape {getattr(ids, 'shape', '?')}); generate one prompt at a time")
    if isinstance(ids, dict | set | frozenset) or not hasattr(ids, "__iter__"):
        raise SamplingError(f"token ids must be a 1-D sequence of ints, got {type(ids).__name__}")
    out = []
    for pos, i in enumerate(ids):
        if not _is_int(i):
            what = "a nested sequence" if hasattr(i, "__iter__") and not isinstance(i, str) else repr(i)
            raise SamplingError(f"token ids must be ints, but the id at position {pos} is {what} "
                                f"({type(i).__name__}); pass one flat sequence of ints")
        if not 0 <= int(i) < vocab_size:
            raise SamplingError(f"token id {int(i)} is out of range for a vocabulary of {vocab_size}")
        out.append(int(i))
    if not out:
        raise SamplingError("the prompt is empty: give at least one token")
    return out


def check_text(text: object) -> str:
    """Prompt text: a str that is valid Unicode (no lone surrogates, e.g. from undecodable bytes)."""
    if not isinstance(text, str):
        raise SamplingError(f"the prompt must be text (str), got {type(text).__name__}; pass ids to generate()")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SamplingError(f"the prompt is not valid UTF-8 text (character {e.start} is an undecodable "
                            f"byte {text[e.start]!r})") from None
    return text


def fit_context(ids: list[int], n_new: int, n_ctx: int, truncate_prompt: bool = False) -> list[int]:
    """The prompt that runs: `ids` when prompt + new tokens fit `n_ctx` positions, else its last
    tokens if `truncate_prompt`, else ContextLengthError."""
    if len(ids) + n_new <= n_ctx:
        return ids
    if truncate_prompt and n_new >= n_ctx:
        raise ContextLengthError(
            f"{n_new} new tokens leave no room for the prompt in the model's context of {n_ctx} positions "
            f"(truncate_prompt keeps the prompt's last tokens, but at least one must fit); lower max_new_tokens "
            f"to {n_ctx - 1} or less")
    if not truncate_prompt:
        raise ContextLengthError(
            f"prompt of {len(ids)} tokens + {n_new} new tokens = {len(ids) + n_new} exceeds the model's "
            f"context of {n_ctx} positions; shorten the prompt, lower max_new_tokens, or pass "
            "truncate_prompt=True (--truncate-prompt) to keep the prompt's last tokens"
        )
    return ids[len(ids) + n_new - n_ctx:]
