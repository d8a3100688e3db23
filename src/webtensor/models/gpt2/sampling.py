"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), seeded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validate import check_max_new_tokens, check_sampling

__all__ = ["SamplingParams", "check_max_new_tokens", "sample"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None  # 0 or None: off
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:  # the checks and their messages live in validate.py
        t, k, p, seed = check_sampling(self.temperature, self.top_k, self.top_p, self.seed)
        for name, value in (("temperature", t), ("top_k", k), ("top_p", p), ("seed", seed)):
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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
