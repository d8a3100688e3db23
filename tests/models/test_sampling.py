"""The one sampler (`webtensor.sampling`): its counter-based draw, its numpy and pure-Python paths
against each other and against a reference written out here, greedy's ties and NaNs, and the
distribution it samples."""

from __future__ import annotations

import array
import bisect
import itertools
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.sampling import SamplingParams, sample, uniform, with_seed

SRC = Path(__file__).resolve().parents[2] / "src"
INF = math.inf
EPS = 1e-12  # how far a draw / top_p must be from a CDF boundary: >> the paths' rounding (~1e-14 here)


# -- the draw --------------------------------------------------------------------------------------
def _splitmix64(state: int):
    """SplitMix64 as in Vigna's reference C code, statefully: the generator the module documents."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        yield z ^ (z >> 31)


def test_uniform_is_splitmix64_of_seed_and_position():
    assert next(_splitmix64(0)) == 0xE220A8397B1DCDAF  # the published first output for seed 0
    for seed in (0, 1, 7, 2**63 + 5, 2**64 - 1):
        key = next(_splitmix64(seed))
        outs = _splitmix64(key)
        for position in range(40):
            assert uniform(seed, position) == (next(outs) >> 11) / 2**53, (seed, position)


def test_uniform_is_uniform_and_depends_on_seed_and_position_only():
    us = [uniform(12345, p) for p in range(20000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert abs(np.mean(us) - 0.5) < 0.01 and abs(np.var(us) - 1 / 12) < 0.005
    assert np.histogram(us, bins=10, range=(0, 1))[0].min() > 1800  # 2000 expected per bin
    assert uniform(12345, 77) == us[77]  # no hidden state
    assert len({uniform(s, 0) for s in range(1000)}) == 1000
    assert uniform(0, 3) != uniform(2**64, 3) and uniform(1, 3) != uniform(2**64 + 1, 3)  # big seeds fold in
    # neighbouring seeds are not shifted copies of one stream
    assert not set(uniform(1, p) for p in range(200)) & set(uniform(2, p) for p in range(200))
    for bad in ((-1, 0), (0, -1), (0, 1.5), (True, 0), ("1", 0)):
        with pytest.raises(wt.SamplingError):
            uniform(*bad)


def test_with_seed_draws_one_fresh_seed_when_none():
    p = SamplingParams(0.8, 40, 0.9, None)
    seeds = {with_seed(p).seed for _ in range(20)}
    assert len(seeds) == 20 and all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds)
    fixed = SamplingParams(0.8, 40, 0.9, 5)
    assert with_seed(fixed) is fixed
    greedy = SamplingParams(0.0)
    assert with_seed(greedy) is greedy
    q = with_seed(p)
    assert (q.temperature, q.top_k, q.top_p) == (0.8, 40, 0.9)


# -- a reference, written out plainly: sort, exact sums (fractions) ------------------------------------
def _reference(logits: list[float], t: float, top_k: int | None, top_p: float | None):
    """(kept tokens in index order, their CDF boundaries, the top-p prefix masses) as documented,
    with exact sums."""
    x = [float(v) for v in logits]
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    kept = order[:top_k] if top_k and top_k < len(x) else order
    m = x[kept[0]]
    w = {i: (1.0 if x[i] == INF else 0.0) if m == INF else math.exp((x[i] - m) / t) for i in kept}
    total = sum(Fraction(v) for v in w.values())
    masses = [float(s / total) for s in itertools.accumulate(Fraction(w[i]) for i in kept)]  # exact sums
    if top_p is not None and top_p < 1:
        kept = kept[: next((j for j, s in enumerate(masses) if s >= top_p), len(kept) - 1) + 1]
    sel = sorted(kept)
    cum = list(itertools.accumulate(Fraction(w[i]) for i in sel))
    cdf = [float(c / cum[-1]) for c in cum]
    return sel, cdf, masses


def _far(v: float, bounds: list[float]) -> bool:
    """No boundary within EPS of v (`bounds` ascending)."""
    i = bisect.bisect_left(bounds, v)
    return all(abs(v - bounds[j]) > EPS for j in (i - 1, i) if 0 <= j < len(bounds))


def _away_from(top_p: float, masses: list[float]) -> float:
    """top_p itself, or the nearest value at least 2 EPS from every prefix mass (so that which
    prefix is kept cannot depend on rounding)."""
    if top_p >= 1 or _far(top_p, masses):
        return top_p
    cands = [c for b in masses for c in (b - 2 * EPS, b + 2 * EPS) if 0 < c < 1 and _far(c, masses)]
    return min(cands, key=lambda c: abs(c - top_p))


finite32 = st.floats(-60, 60, width=32)


@st.composite
def cases(draw):
    if draw(st.booleans()):  # short rows, drawn value by value (hypothesis' edge cases, shrinking)
        logits = draw(st.lists(st.one_of(finite32, st.integers(-3, 3).map(float)), min_size=1, max_size=12))
    else:  # long rows (past the pure path's first 64-token nucleus window), drawn in one go
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        x = rng.standard_normal(draw(st.integers(13, 300))) * draw(st.sampled_from([0.05, 1.0, 4.0, 30.0]))
        logits = (np.round(x) if draw(st.booleans()) else x).astype(np.float32).tolist()  # round: many ties
    n = len(logits)
    for _ in range(draw(st.integers(0, 3))):  # masked tokens
        logits[draw(st.integers(0, n - 1))] = -INF
    if draw(st.integers(0, 9)) == 0:  # a +inf logit now and then: it takes all the mass
        logits[draw(st.integers(0, n - 1))] = INF
    t = draw(st.one_of(st.floats(0.05, 4.0), st.sampled_from([1.0, 0.8, 1e-3, 50.0, 1e-300, 5e-324])))
    top_k = draw(st.one_of(st.none(), st.integers(0, n + 2)))
    top_p = draw(st.one_of(st.none(), st.just(1.0), st.floats(1e-3, 1.0), st.sampled_from([0.5, 0.9])))
    seed = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**80)))
    position = draw(st.integers(0, 2**20))
    return logits, t, top_k, top_p, seed, position


@settings(max_examples=250, deadline=None)
@given(case=cases())
def test_numpy_and_python_paths_agree_with_the_reference(case):
    logits, t, top_k, top_p, seed, position = case
    if all(v == -INF for v in logits):  # nothing to sample: both paths refuse
        p = SamplingParams(t, top_k, top_p, seed)
        for form in (np.array(logits, np.float32), array.array("f", logits)):
            with pytest.raises(wt.SamplingError, match="every logit is -inf"):
                sample(form, p, position)
        return
    # by construction, away from rounding: top_p moved off the prefix masses, the position moved on
    # until its draw is off the CDF boundaries (the paths' sums differ in the last bits: exp's ulp)
    _, _, masses = _reference(logits, t, top_k, None)
    top_p = None if top_p is None else _away_from(top_p, masses)
    kept, cdf, _ = _reference(logits, t, top_k, top_p)
    while not _far(uniform(seed, position), [0.0, *cdf]):
        position += 1
    u = uniform(seed, position)
    want = kept[next(j for j, c in enumerate(cdf) if c > u)]
    p = SamplingParams(t, top_k, top_p, seed)
    got_np = sample(np.array(logits, np.float32), p, position)
    got_py = sample(array.array("f", logits), p, position)
    assert got_np == got_py == want, (got_np, got_py, want)
    assert sample(list(logits), p, position) == want
    assert isinstance(got_np, int) and isinstance(got_py, int)


@settings(max_examples=150, deadline=None)
@given(logits=st.lists(st.one_of(st.floats(width=32, allow_nan=True), st.sampled_from([0.0, -0.0, 1.0])),
                       min_size=1, max_size=40),
       wide=st.booleans())
def test_greedy_is_numpy_argmax_on_both_paths(logits, wide):
    p = SamplingParams(0.0)
    arr = np.array(logits, np.float64 if wide else np.float32)
    want = int(np.argmax(arr))  # the first NaN, else the first of the largest
    assert sample(arr, p, 0) == want
    assert sample(array.array("d" if wide else "f", arr.tobytes()), p, 0) == want
    assert sample(arr.tolist(), p, 0) == want


def test_greedy_ties_and_nan():
    p = SamplingParams(0.0)
    for form in (list, lambda v: np.array(v, np.float32), lambda v: array.array("f", v)):
        assert sample(form([1.0, 3.0, 3.0, 2.0]), p, 0) == 1
        assert sample(form([1.0, math.nan, 3.0, math.nan]), p, 0) == 1
        assert sample(form([-INF, -INF]), p, 0) == 0


def test_exact_ties_are_broken_by_index_on_both_paths():
    # equal logits have exactly equal weights on both paths (exp(0) = 1): no rounding involved
    for form in (lambda v: np.array(v, np.float32), lambda v: array.array("f", v)):
        four = form([2.0, 2.0, 2.0, 2.0])
        picks = [sample(four, SamplingParams(1.0, top_p=0.5, seed=9), pos) for pos in range(400)]
        assert set(picks) == {0, 1}  # mass 0.5 is reached by the first two (ties: lower index first)
        picks = [sample(form([1.0, 3.0, 3.0, 3.0, 0.0]), SamplingParams(1.0, top_k=2, seed=9), pos)
                 for pos in range(400)]
        assert set(picks) == {1, 2}  # exactly k kept, the lower indices among equals
        picks = [sample(form([-INF, INF, 0.0, INF]), SamplingParams(0.7, seed=9), pos) for pos in range(400)]
        assert set(picks) == {1, 3}  # +inf logits share the mass
        with pytest.raises(wt.SamplingError, match="NaN"):
            sample(form([0.0, math.nan]), SamplingParams(1.0, seed=1), 0)


def test_both_paths_agree_on_gpt2_sized_logits():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(50257) * 2.5).astype(np.float32)
    row = array.array("f", logits.tobytes())
    for params in (SamplingParams(0.8, 40, 0.9, 11), SamplingParams(0.8, None, 0.9, 11),
                   SamplingParams(1.0, None, None, 11), SamplingParams(1.3, 200, None, 11)):
        a = [sample(logits, params, pos) for pos in range(100, 107)]
        assert a == [sample(row, params, pos) for pos in range(100, 107)], params
        assert len(set(a)) > 3  # a real spread of tokens, not one


def test_samples_follow_the_distribution():
    logits = [2.0, 1.0, 0.5, 0.0, -1.0, -INF, 1.5]
    t, n = 0.9, 8000
    w = [math.exp(v / t - 2.0 / t) for v in logits]
    probs = [x / math.fsum(w) for x in w]
    for form in (list, lambda v: np.array(v, np.float32)):
        counts = np.bincount([sample(form(logits), SamplingParams(t, seed=4), pos) for pos in range(n)],
                             minlength=len(logits))
        for c, q in zip(counts, probs, strict=True):
            assert abs(c / n - q) <= 5 * math.sqrt(q * (1 - q) / n) + 1e-12, (counts, probs)
    # top_p = 0.8 keeps the tokens 0, 6, 1 (their mass reaches 0.8), renormalised
    kept = [0, 6, 1]
    mass = math.fsum(probs[i] for i in kept)
    counts = np.bincount([sample(logits, SamplingParams(t, top_p=0.8, seed=4), pos) for pos in range(n)],
                         minlength=len(logits))
    assert set(np.flatnonzero(counts)) == set(kept)
    for i in kept:
        q = probs[i] / mass
        assert abs(counts[i] / n - q) <= 5 * math.sqrt(q * (1 - q) / n)


def test_a_tiny_temperature_is_greedy_not_a_draw_among_overflows():
    """x / t overflows to +inf for every positive logit at t = 5e-324 (a denormal) or 1e-300: the
    sampler divides x - max instead, so the weights go to one-hot on the maximum, as t -> 0 should
    (exact ties share it), on both paths and at every position."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(500) * 3).astype(np.float32)
    best = int(np.argmax(logits))
    for t in (5e-324, 1e-300, 1e-30):
        for form in (lambda v: v, lambda v: array.array("f", v.tobytes())):
            picks = {sample(form(logits), SamplingParams(t, seed=s), pos) for s in range(3) for pos in range(40)}
            assert picks == {best}, (t, picks)
    tied = np.array([1.0, 7.0, 2.0, 7.0, 6.999], np.float32)
    picks = {sample(tied, SamplingParams(5e-324, seed=2), pos) for pos in range(200)}
    assert picks == {1, 3}


def test_seed_none_in_a_direct_call_is_fresh_randomness():
    logits = [0.0] * 1000
    picks = {sample(logits, SamplingParams(1.0), 5) for _ in range(10)}
    assert len(picks) > 5


def test_bad_logits_are_refused():
    p = SamplingParams(1.0, seed=0)
    with pytest.raises(wt.SamplingError, match="empty"):
        sample([], p, 0)
    with pytest.raises(wt.SamplingError, match="1-D"):
        sample(np.zeros((2, 3), np.float32), p, 0)


def test_importable_and_working_without_numpy():
    code = f"""
import sys
class NoNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ImportError("no numpy here (as in the page)")
sys.meta_path.insert(0, NoNumpy())
sys.path.insert(0, {str(SRC)!r})
import array
from webtensor.sampling import SamplingParams, sample
import webtensor.models.loader, webtensor.web.app
logits = array.array("f", [0.5, 2.0, -1.0, 2.0, 0.0])
print(sample(logits, SamplingParams(0.0), 0), sample(logits, SamplingParams(0.8, 3, 0.9, 7), 3),
      "numpy" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    greedy, drawn, loaded = r.stdout.split()
    assert greedy == "1" and loaded == "False"
    assert int(drawn) == sample(np.array([0.5, 2.0, -1.0, 2.0, 0.0], np.float32), SamplingParams(0.8, 3, 0.9, 7), 3)

