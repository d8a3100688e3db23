"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), seeded.

One sampler for every path: `GPT2.generate` (CPU and WebGPU), the server's engine and the web page
(Pyodide, where there is no numpy) all call `sample(logits, params, position)`, so the same seed gives
the same tokens everywhere. This module needs only the standard library (and webtensor's numpy-free
`errors` and `validate`).

The random draw
---------------
The token at absolute position `position` (its index in the context: the first generated token of a
prompt of n tokens has position n) uses one uniform double `u = uniform(seed, position)` in [0, 1)
from a counter-based generator, SplitMix64 (Steele, Lea & Flood 2014; Vigna's reference code),
written with plain Python ints:

    mix(z)    = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^ (z >> 31)
                (all mod 2**64)
    key(seed) = mix(seed + G) for seed < 2**64, G = 0x9E3779B97F4A7C15; a larger seed folds each
                further 64-bit limb l (low to high) in as key = mix((key ^ l) + G)
    z         = mix(key(seed) + (position + 1) * G)     (output `position + 1` of SplitMix64 from state key)
    u         = (z >> 11) / 2**53

So a token depends on (seed, position) alone: not on how many tokens came before in this call, on
other requests batched alongside, or on how a prefill was cut into chunks.

`seed=None` means a fresh random seed: `with_seed(params)` draws one (64 bits from the OS) and the
generators call it once per call of generate, so the tokens of one call all come from one seed. A
direct call of `sample` with seed None draws a fresh seed for that one call.

The choice
----------
1. temperature 0: greedy, `argmax(logits)`: the first index among equal maxima; a NaN wins, as in
   `numpy.argmax` (the first NaN is returned). The draw is not used.
2. `x = float(logit)` in float64; a NaN anywhere is refused (SamplingError).
3. top-k (None or 0: off): keep the k largest x, ties broken by the lower index (exactly k kept).
4. softmax at the temperature t over the kept tokens in float64: `w = exp((x - max) / t)`
   unnormalised (+inf logits share all the mass evenly; all -inf is refused); `total` = their sum
   in index order. The largest logit is subtracted before dividing, so no t > 0 overflows: as t
   goes to 0 (a denormal such as 5e-324 included) every token below the maximum gets weight 0 and
   the draw becomes greedy's choice, the maximum (shared evenly among exact ties), never a draw
   among tokens whose x / t overflowed to the same infinity.
5. top-p (None or 1: off): order the kept tokens by x, largest first, ties by the lower index; keep
   the shortest prefix whose running sum of w reaches top_p * total (smallest set with mass >= top_p;
   all of them if rounding keeps the sum short of it).
6. inverse CDF: over the kept tokens in index order, the first whose running sum of w exceeds
   u * (their sum) (the last one with w > 0 if that product rounds up to the sum).

Sums run left to right (no pairwise or compensated summation), so both implementations below add
the same numbers in the same order.

Two implementations, one definition: a numpy fast path when `logits` is a numpy array and a
pure-Python path for any other sequence of floats (a list, `array.array('f')`). They agree on the
token except where `u` falls within rounding of a CDF boundary (or top_p within rounding of a
running mass): `numpy.exp` and `math.exp` may differ in the last bit, so a boundary can move by about
1e-16 relative. The same holds across platforms (another libm), and for logits that themselves differ
in rounding (the CPU device against WebGPU).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from .errors import SamplingError
from .validate import check_max_new_tokens, check_sampling

__all__ = ["SamplingParams", "check_max_new_tokens", "sample", "uniform", "with_seed"]

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


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


def with_seed(params: SamplingParams) -> SamplingParams:
    """`params` itself when it has a seed (or is greedy), else a copy with a fresh random 64-bit seed."""
    if params.seed is not None or params.greedy:
        return params
    return dataclasses.replace(params, seed=secrets.randbits(64))


# -- the counter-based generator ------------------------------------------------------------------
def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _key(seed: int) -> int:
    key = _mix((seed + _GAMMA) & _M64)
    seed >>= 64
    while seed:
        key = _mix(((key ^ (seed & _M64)) + _GAMMA) & _M64)
        seed >>= 64
    return key


def uniform(seed: int, position: int) -> float:
    """The uniform double in [0, 1) for the token at `position` under `seed` (both ints >= 0)."""
    for name, v in (("seed", seed), ("position", position)):
        if not isinstance(v, Integral) or isinstance(v, bool) or v < 0:
            raise SamplingError(f"{name} must be an integer >= 0, got {v!r}")
    seed, position = int(seed), int(position)
    z = _mix((_key(seed) + (position + 1) * _GAMMA) & _M64)
    return (z >> 11) * (1.0 / (1 << 53))


# -- the sampler ----------------------------------------------------------------------------------
def sample(logits: Any, params: SamplingParams, position: int) -> int:
    """The token id for absolute position `position` from `logits` (V,) under `params` (see the
    module docstring for the exact definition). `logits`: a 1-D numpy array (the fast path) or any
    sequence of floats (list, array.array; pure Python)."""
    np = sys.modules.get("numpy")  # never imported here: a numpy array means numpy is loaded already
    fast = np is not None and isinstance(logits, np.ndarray)
    if fast and logits.ndim != 1:
        raise SamplingError(f"logits must be 1-D (one row), got shape {logits.shape}")
    if len(logits) == 0:
        raise SamplingError("cannot sample from empty logits")
    if params.greedy:
        return int(np.argmax(logits)) if fast else _argmax(logits)
    seed = params.seed if params.seed is not None else secrets.randbits(64)
    u = uniform(seed, position)
    if fast:
        return _sample_numpy(np, logits, params, u)
    return _sample_python(logits, params, u)


def _argmax(xs: Sequence[float]) -> int:
    """numpy.argmax's answer: the first NaN, else the first of the largest."""
    if any(map(math.isnan, xs)):
        return next(i for i, v in enumerate(xs) if math.isnan(v))
    return xs.index(max(xs)) if hasattr(xs, "index") else max(range(len(xs)), key=xs.__getitem__)


def _refuse_nan() -> None:
    raise SamplingError("cannot sample: the logits contain NaN")


def _refuse_all_masked() -> None:
    raise SamplingError("cannot sample: every logit is -inf")


def _sample_python(logits: Sequence[float], p: SamplingParams, u: float) -> int:
    x = [float(v) for v in logits]
    if any(map(math.isnan, x)):
        _refuse_nan()
    n = len(x)
    keep: list[int] | None = None  # kept indices, ascending; None: all
    if p.top_k is not None and p.top_k < n:
        keep = sorted(heapq.nlargest(p.top_k, range(n), key=x.__getitem__))
        x = [x[i] for i in keep]
    w = _weights_python(x, p.temperature)
    if p.top_p is not None and p.top_p < 1.0:
        sel = _nucleus_python(x, w, p.top_p)
        w = [w[i] for i in sel]
        keep = [keep[i] for i in sel] if keep is not None else sel
    cum = list(itertools.accumulate(w))
    i = bisect.bisect_right(cum, u * cum[-1])
    if i >= len(w):  # u * total rounded up to the total: the last token with weight
        i = max(j for j, v in enumerate(w) if v > 0)
    return keep[i] if keep is not None else i


def _weights_python(x: list[float], t: float) -> list[float]:
    m = max(x)
    if m == math.inf:
        return [1.0 if v == math.inf else 0.0 for v in x]
    if m == -math.inf:
        _refuse_all_masked()
    exp = math.exp
    return [exp((v - m) / t) for v in x]


def _total(w: list[float]) -> float:
    s = 0.0
    for v in w:  # left to right, as numpy.cumsum (not sum(): compensated on Python >= 3.12)
        s += v
    return s


def _nucleus_python(x: list[float], w: list[float], top_p: float) -> list[int]:
    """Indices (into x, ascending) of the shortest largest-first prefix with mass >= top_p."""
    n = len(x)
    cutoff = top_p * _total(w)
    count = min(n, 64)
    while True:  # the largest `count` only (a full sort of 50k in Pyodide is slow); grow if short
        order = heapq.nlargest(count, range(n), key=x.__getitem__)  # stable: ties by the lower index
        acc = 0.0
        for j, i in enumerate(order):
            acc += w[i]
            if acc >= cutoff:
                return sorted(order[: j + 1])
        if count == n:
            return sorted(order)
        count = min(n, count * 4)


def _sample_numpy(np: Any, logits: Any, p: SamplingParams, u: float) -> int:
    x = logits.astype(np.float64)
    if np.isnan(x).any():
        _refuse_nan()
    n = x.size
    keep = None  # kept indices, ascending; None: all
    if p.top_k is not None and p.top_k < n:
        kth = np.partition(x, n - p.top_k)[n - p.top_k]  # the k-th largest
        above = np.flatnonzero(x > kth)
        ties = np.flatnonzero(x == kth)[: p.top_k - above.size]  # the lowest indices among equals
        keep = np.sort(np.concatenate([above, ties]))
        x = x[keep]
    m = x.max()
    if m == np.inf:
        w = (x == np.inf).astype(np.float64)
    elif m == -np.inf:
        _refuse_all_masked()
    else:
        with np.errstate(over="ignore"):  # (a tiny temperature: -inf, weight 0, as documented)
            w = np.exp((x - m) / p.temperature)
    if p.top_p is not None and p.top_p < 1.0:
        cutoff = p.top_p * np.cumsum(w)[-1]
        order = np.argsort(-x, kind="stable")
        reached = np.cumsum(w[order]) >= cutoff
        j = int(np.argmax(reached)) if reached.any() else x.size - 1
        sel = np.sort(order[: j + 1])
        w = w[sel]
        keep = keep[sel] if keep is not None else sel
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if i >= w.size:
        i = int(np.flatnonzero(w > 0)[-1])
    return int(keep[i]) if keep is not None else i
