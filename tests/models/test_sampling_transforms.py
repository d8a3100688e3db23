"""The sampler's moved logits and min-p (`webtensor.sampling`, step 0 and step 6 of its definition): the numpy
and pure-Python paths against a reference written out here and against each other, the penalties against HF's
and OpenAI's formulas, min_tokens, the seeds of n choices, and `generate` with them."""

from __future__ import annotations

import array
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.sampling import SamplingParams, SequenceState, choice_seed, sample, uniform

INF = math.inf


def _reference_moved(logits: list[float], p: SamplingParams, prompt: list[int], generated: list[int],
                     eos: list[int]) -> list[float]:
    """Step 0 of the module's definition, spelled out token by token."""
    x = [float(v) for v in logits]
    if len(generated) < p.min_tokens:
        for i in set(eos) | set(p.stop_token_ids):
            x[i] = -INF
    for i, b in p.logit_bias:
        x[i] = x[i] + b
    if p.repetition_penalty != 1.0:
        for i in set(prompt) | set(generated):
            x[i] = x[i] / p.repetition_penalty if x[i] > 0 else x[i] * p.repetition_penalty
    for i in set(generated):
        c = generated.count(i)
        x[i] = x[i] - (c * p.frequency_penalty + p.presence_penalty)
    return x


@st.composite
def moved_cases(draw):
    n = draw(st.integers(2, 60))
    ints = st.integers(0, n - 1)
    logits = draw(st.lists(st.floats(-20, 20, width=32), min_size=n, max_size=n))
    if draw(st.booleans()):
        logits = [float(round(v)) for v in logits]  # ties and zeros
    prompt = draw(st.lists(ints, max_size=20))
    generated = draw(st.lists(ints, max_size=20))
    eos = draw(st.lists(ints, min_size=1, max_size=2))
    params = SamplingParams(
        draw(st.sampled_from([0.0, 0.7, 1.0, 1.5])), draw(st.sampled_from([None, 3, 10])),
        draw(st.sampled_from([None, 0.5, 0.9])), draw(st.integers(0, 2**64 - 1)),
        min_p=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])),
        presence_penalty=draw(st.sampled_from([0.0, 0.5, -1.0, 2.0])),
        frequency_penalty=draw(st.sampled_from([0.0, 0.3, -0.5, 2.0])),
        repetition_penalty=draw(st.sampled_from([1.0, 1.2, 0.8, 2.0])),
        logit_bias=draw(st.dictionaries(ints, st.floats(-100, 100), max_size=4)),
        min_tokens=draw(st.integers(0, 3)),
        stop_token_ids=draw(st.lists(ints, max_size=2)))
    return logits, params, prompt, generated, eos, draw(st.integers(0, 10_000))


def _state(prompt: list[int], generated: list[int], eos: list[int]) -> SequenceState:
    s = SequenceState(prompt, eos)
    for t in generated:
        s.add(t)
    return s


@settings(max_examples=300, deadline=None)
@given(case=moved_cases())
def test_both_paths_move_the_logits_as_defined_and_pick_the_same_token(case):
    logits, p, prompt, generated, eos, position = case
    want = _reference_moved(logits, p, prompt, generated, eos)
    state = _state(prompt, generated, eos)
    if all(v == -INF for v in want) and not p.greedy:
        for form in (np.array(logits, np.float32), array.array("f", logits)):
            with pytest.raises(wt.SamplingError):
                sample(form, p, position, state)
        return
    got_np = sample(np.array(logits, np.float32), p, position, state)
    got_py = sample(array.array("f", logits), p, position, state)
    assert got_np == got_py
    # the moved logits themselves, sampled with no step 0: the same token (the draw is the position's)
    plain = SamplingParams(p.temperature, p.top_k, p.top_p, p.seed, min_p=p.min_p)
    assert sample(np.array(want, np.float64), plain, position) == got_np
    if p.greedy:
        assert got_np == int(np.argmax(want))
    else:  # every kept token has weight >= min_p times the top token's, at the temperature
        kept = np.array(want, np.float64)
        assert math.exp((kept[got_np] - kept.max()) / p.temperature) >= p.min_p * (1 - 1e-12)


@pytest.mark.hf
def test_repetition_penalty_is_hfs():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 300).astype(np.float32)
    logits[7] = 0.0
    prompt, generated = [1, 2, 3, 7, 250], [5, 5, 9]
    for r in (1.3, 0.7):
        p = SamplingParams(0.0, repetition_penalty=r)
        hf = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([prompt + generated]),
                                                 torch.tensor(logits[None].astype(np.float64)))[0].numpy()
        from webtensor.sampling import _moved_numpy, _moved_python

        state = _state(prompt, generated, [])
        assert np.array_equal(_moved_numpy(np, logits, p, state), hf)
        assert _moved_python(array.array("f", logits), p, state) == hf.tolist()


def test_presence_and_frequency_penalties_are_openais_formula():
    from webtensor.sampling import _moved_numpy

    logits = np.zeros(10, np.float32)
    p = SamplingParams(1.0, presence_penalty=0.5, frequency_penalty=0.25)
    state = _state([3, 4], [1, 1, 1, 2], [])  # prompt tokens are not penalised (OpenAI: generated only)
    x = _moved_numpy(np, logits, p, state)
    assert x[1] == -(3 * 0.25 + 0.5) and x[2] == -(0.25 + 0.5) and x[3] == x[4] == x[0] == 0.0


def test_min_p_keeps_tokens_within_a_factor_of_the_top_one():
    # probabilities 0.5, 0.25, 0.125, 0.125 at t = 1: min_p 0.3 keeps 0 and 1 (0.25 >= 0.3 * 0.5 = 0.15)
    logits = np.log(np.array([0.5, 0.25, 0.125, 0.125]))
    picks = {sample(logits, SamplingParams(1.0, seed=3, min_p=0.3), pos) for pos in range(300)}
    assert picks == {0, 1}
    assert {sample(logits, SamplingParams(1.0, seed=3, min_p=1.0), pos) for pos in range(50)} == {0}


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = np.array([5.0, 4.0, 3.0, 0.0])  # 0 is the EOS and the most likely, 1 a stop id
    p = SamplingParams(0.0, min_tokens=2, stop_token_ids=[1])
    state = SequenceState([], [0])
    assert sample(logits, p, 0, state) == 2
    state.add(2)
    assert sample(logits, p, 1, state) == 2
    state.add(2)
    assert sample(logits, p, 2, state) == 0


def test_logit_bias_and_its_checks():
    logits = np.array([1.0, 2.0, 3.0])
    assert sample(logits, SamplingParams(0.0, logit_bias={0: 5.0}), 0) == 0
    assert sample(logits, SamplingParams(0.0, logit_bias={2: -100}), 0) == 1
    for bad in ({0: 101}, {-1: 1}, {0: math.nan}, {"a": 1}, [1, 2]):
        with pytest.raises(wt.SamplingError):
            SamplingParams(0.0, logit_bias=bad)
    with pytest.raises(wt.SamplingError, match="out of range"):
        sample(logits, SamplingParams(0.0, logit_bias={3: 1.0}), 0)
    for kw in (dict(presence_penalty=2.1), dict(frequency_penalty=-3), dict(repetition_penalty=0),
               dict(min_p=1.5), dict(min_tokens=-1), dict(stop_token_ids=[-2])):
        with pytest.raises(wt.SamplingError):
            SamplingParams(1.0, **kw)


def test_choice_seeds_are_distinct_streams_and_choice_0_is_the_seed():
    assert choice_seed(42, 0) == 42
    streams = [[uniform(choice_seed(42, i), pos) for pos in range(50)] for i in range(4)]
    assert len({tuple(s) for s in streams}) == 4
    assert [uniform(43, pos) for pos in range(50)] not in streams[1:]  # not the next seed's stream


def test_generate_with_penalties_equals_its_definition_step_by_step():
    """`generate` keeps the sequence's state: its tokens are those of sampling each position's logits (the full
    forward's) with the counts of the tokens before."""
    m = wt.load_model(None, device=wt.Device.cpu())
    ids = m.encode("Once upon a time")
    kw = dict(presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={11: 2.0},
              min_tokens=3)
    for temperature, seed in ((0.0, None), (0.9, 7)):
        got = m.generate(ids, 12, temperature=temperature, seed=seed, **kw)
        p = SamplingParams(temperature, seed=seed, **kw)
        state, want = SequenceState(ids, m.eos_ids), []
        for _ in range(12):
            ctx = ids + want
            tok = sample(m.logits(ctx)[-1], p, len(ctx), state)
            state.add(tok)
            want.append(tok)
            if tok in m.eos_ids:
                break
        assert got == want
    assert m.generate(ids, 12, presence_penalty=2.0) != m.generate(ids, 12)  # (greedy repeats itself here)
