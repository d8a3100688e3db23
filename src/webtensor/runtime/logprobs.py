"""Log-probabilities of a logits row, as the server reports them (OpenAI's `logprobs`, vLLM's "raw" ones):
`log_softmax` of the model's logits in float64 — before any sampling transform (temperature, penalties,
logit_bias, top-k/p) — for one token and for the `k` most likely ones.

    lp[i] = x[i] - m - log(sum_j exp(x[j] - m)),   m = max_j x[j]

(-inf for a -inf logit; NaN logits give NaN). The top k are ordered by log-probability, largest first, ties
by the lower id (as the sampler breaks them). Needs numpy (the server has it; the page does not report
log-probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_TOP = 20  # OpenAI's limit on top_logprobs (and on the completions API's logprobs: 5 there, 20 here as vLLM)


@dataclass(frozen=True)
class TokenLogprob:
    """One position's report: the token there, its log-probability, and the `k` most likely (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits: Any) -> Any:
    """float64 log-probabilities of a (V,) or (N, V) logits array (rows: the last axis)."""
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # (a row of -inf: every lp -inf, not NaN from -inf - -inf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = x - m
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def top(lp: Any, k: int) -> tuple[tuple[int, float], ...]:
    """The k largest of one row of log-probabilities as (id, logprob), largest first, ties by the lower id."""
    if k <= 0:
        return ()
    k = min(k, lp.size)
    part = np.argpartition(-lp, k - 1)[:k] if k < lp.size else np.arange(lp.size)
    # (argpartition may cut among equals at the k-th value: take every id tied with it, then the k first)
    kth = lp[part].min()
    cand = np.union1d(part, np.flatnonzero(lp == kth))
    order = cand[np.lexsort((cand, -lp[cand]))][:k]
    return tuple((int(i), float(lp[i])) for i in order)


def report(logits: Any, token: int, k: int) -> TokenLogprob:
    """`token`'s log-probability under one logits row (V,), with the k most likely."""
    lp = log_softmax(logits)
    return TokenLogprob(int(token), float(lp[token]), top(lp, k))


def report_rows(logits: Any, tokens: Any, k: int) -> list[TokenLogprob]:
    """Row i's report for tokens[i] (logits (N, V), N == len(tokens))."""
    lp = log_softmax(logits)
    return [TokenLogprob(int(t), float(lp[i, t]), top(lp[i], k)) for i, t in enumerate(tokens)]
