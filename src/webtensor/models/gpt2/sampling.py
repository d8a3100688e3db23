"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), seeded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import SamplingError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not np.isfinite(t) or t < 0:
            raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise SamplingError(f"top_k must be an integer >= 1 (or None), got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float)
                                       or not 0 < self.top_p <= 1):
            raise SamplingError(f"top_p must be in (0, 1] (or None), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_max_new_tokens(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise SamplingError(f"max_new_tokens must be a non-negative integer, got {n!r}")
    return int(n)


def sample(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from `logits` (V,) under `p`."""
    if p.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / p.temperature
    if p.top_k is not None and p.top_k < x.size:
        kth = np.partition(x, -p.top_k)[-p.top_k]
        x = np.where(x < kth, -np.inf, x)
    x -= x.max()
    probs = np.exp(x)
    probs /= probs.sum()
    if p.top_p is not None and p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cum, p.top_p) + 1)]  # smallest set with mass >= top_p
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return int(rng.choice(probs.size, p=probs))
