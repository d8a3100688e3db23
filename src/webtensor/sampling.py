"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), min-p, seeded;
the logits first moved by the sequence's state (min_tokens, logit_bias, repetition / presence /
frequency penalties).

One sampler for every path: `LanguageModel.generate` (CPU and WebGPU), the server's engine and the web page
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
0. `x = float(logit)` in float64, then, in this order and only where the parameters ask (vLLM's
   order; every step elementwise, so both implementations compute the same numbers):
   a. min_tokens: while the sequence has generated fewer than `min_tokens` tokens, x = -inf for
      every id in `state.stop_ids` (the model's EOS ids, given by the caller) and `stop_token_ids`.
   b. logit_bias: x[i] += bias[i] (OpenAI's logit_bias, -100..100).
   c. repetition_penalty r (HF's and vLLM's, over prompt and generated tokens): for every id in
      the prompt or generated so far, x = x / r where x > 0, else x * r.
   d. presence / frequency penalties (OpenAI's formula, over generated tokens only): for every id
      generated c > 0 times, x -= c * frequency_penalty + presence_penalty.
   The counts come from `state` (a `SequenceState`: the prompt's ids, the generated ids' counts),
   which the caller keeps for each sequence and moves on with `state.add(token)`.
1. temperature 0: greedy, `argmax(x)`: the first index among equal maxima; a NaN wins, as in
   `numpy.argmax` (the first NaN is returned). The draw is not used. (Without a step a-d, x is the
   logits themselves: the device's argmax is this choice.)
2. a NaN anywhere in x is refused (SamplingError).
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
6. min-p (0 or None: off): keep the tokens with w >= min_p (w of the largest kept x is exp(0) = 1:
   probability >= min_p times the top token's, as HF's and vLLM's min_p, applied after top-p).
7. inverse CDF: over the kept tokens in index order, the first whose running sum of w exceeds
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
from .validate import check_max_new_tokens, check_sampling, check_transforms

__all__ = ["SamplingParams", "SequenceState", "check_max_new_tokens", "choice_seed", "sample", "uniform",
           "with_seed"]

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int | None = None  # 0 or None: off
    top_p: float | None = None
    seed: int | None = None
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: off
    logit_bias: Any = ()  # {token id: bias} or its items; kept as sorted (id, bias) pairs
    min_tokens: int = 0  # the stop ids are masked until this many tokens are generated
    stop_token_ids: Any = ()  # ids that end the sequence besides the model's EOS ids (masked as they are)

    def __post_init__(self) -> None:  # the checks and their messages live in validate.py
        t, k, p, seed = check_sampling(self.temperature, self.top_k, self.top_p, self.seed)
        for name, value in (("temperature", t), ("top_k", k), ("top_p", p), ("seed", seed),
                            *check_transforms(self.min_p, self.presence_penalty, self.frequency_penalty,
                                              self.repetition_penalty, self.logit_bias, self.min_tokens,
                                              self.stop_token_ids).items()):
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def moves_logits(self) -> bool:
        """Whether step 0 (min_tokens, logit_bias, penalties) can change the logits: if not, greedy is the
        plain argmax of the logits (the device's)."""
        return bool(self.min_tokens or self.logit_bias or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)


class SequenceState:
    """What one sequence's sampling reads besides its logits: its prompt's ids (repetition_penalty), how
    often each id was generated and how many tokens were (penalties, min_tokens), and the ids that end it
    (`stop_ids`: the model's EOS ids; masked while fewer than min_tokens were generated). The caller keeps
    one per sequence and calls `add` with each token chosen."""

    __slots__ = ("prompt", "counts", "generated", "stop_ids")

    def __init__(self, prompt: Sequence[int] = (), stop_ids: Sequence[int] | frozenset[int] = ()):
        self.prompt = frozenset(prompt)
        self.counts: dict[int, int] = {}
        self.generated = 0
        self.stop_ids = frozenset(stop_ids)

    def add(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        self.generated += 1


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` of a request for several choices (OpenAI's `n`) with `seed`: seed itself
    for choice 0, seed + index * 2**64 for the others. The generator folds a seed's 64-bit limbs in (see
    `uniform`), so each choice draws its own stream, none of them a stream a 64-bit seed alone gives, and
    choice 0 of n is the one choice of n = 1."""
    return seed + (index << 64)


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
def sample(logits: Any, params: SamplingParams, position: int, state: SequenceState | None = None) -> int:
    """The token id for absolute position `position` from `logits` (V,) under `params`, for a sequence
    in `state` (None: nothing generated yet, no prompt, no EOS ids known) (see the module docstring for
    the exact definition). `logits`: a 1-D numpy array (the fast path) or any sequence of floats (list,
    array.array; pure Python)."""
    np = sys.modules.get("numpy")  # never imported here: a numpy array means numpy is loaded already
    if np is not None and not isinstance(logits, np.ndarray):
        np = None  # np: set on the fast path alone (numpy logits)
    if np is not None and logits.ndim != 1:
        raise SamplingError(f"logits must be 1-D (one row), got shape {logits.shape}")
    if len(logits) == 0:
        raise SamplingError("cannot sample from empty logits")
    if params.moves_logits:
        state = state if state is not None else SequenceState()
        logits = _moved_numpy(np, logits, params, state) if np is not None else _moved_python(logits, params, state)
    if params.greedy:
        return int(np.argmax(logits)) if np is not None else _argmax(logits)
    seed = params.seed if params.seed is not None else secrets.randbits(64)
    u = uniform(seed, position)
    if np is not None:
        return _sample_numpy(np, logits, params, u)
    return _sample_python(logits, params, u)


def _moved_ids(p: SamplingParams, state: SequenceState, n: int) -> tuple[list[int], list[int]]:
    """(ids masked by min_tokens, ids the repetition penalty touches), ascending, each checked < n."""
    masked = sorted(state.stop_ids | set(p.stop_token_ids)) if state.generated < p.min_tokens else []
    seen = sorted(state.prompt | state.counts.keys()) if p.repetition_penalty != 1.0 else []
    for ids in (masked, seen, [i for i, _ in p.logit_bias], list(state.counts)):
        if ids and max(ids) >= n:
            raise SamplingError(f"token id {max(ids)} is out of range for {n} logits")
    return masked, seen


def _moved_python(logits: Sequence[float], p: SamplingParams, state: SequenceState) -> list[float]:
    x = [float(v) for v in logits]
    masked, seen = _moved_ids(p, state, len(x))
    for i in masked:
        x[i] = -math.inf
    for i, b in p.logit_bias:
        x[i] += b
    r = p.repetition_penalty
    for i in seen:
        x[i] = x[i] / r if x[i] > 0 else x[i] * r
    if p.frequency_penalty or p.presence_penalty:
        for i, c in state.counts.items():
            x[i] -= c * p.frequency_penalty + p.presence_penalty
    return x


def _moved_numpy(np: Any, logits: Any, p: SamplingParams, state: SequenceState) -> Any:
    x = logits.astype(np.float64)
    masked, seen = _moved_ids(p, state, x.size)
    if masked:
        x[masked] = -np.inf
    if p.logit_bias:
        ids, bias = zip(*p.logit_bias, strict=True)
        x[list(ids)] += np.array(bias, np.float64)
    if seen:
        v = x[seen]
        x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and state.counts:
        ids = np.fromiter(state.counts.keys(), np.int64, len(state.counts))
        c = np.fromiter(state.counts.values(), np.float64, len(state.counts))
        x[ids] -= c * p.frequency_penalty + p.presence_penalty
    return x


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
    if p.min_p:
        sel = [i for i, v in enumerate(w) if v >= p.min_p]
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
    if p.min_p:
        sel = np.flatnonzero(w >= p.min_p)
        w = w[sel]
        keep = keep[sel] if keep is not None else sel
    cum = np.cumsum(w)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if i >= w.size:
        i = int(np.flatnonzero(w > 0)[-1])
    return int(keep[i]) if keep is not None else i
