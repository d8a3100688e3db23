"""Greedy decoding of several prompts together (`GPT2.generate_batch`, `generation.generate_batch`:
one forward over all rows a step, a captured graph) gives each prompt's own greedy tokens."""

from __future__ import annotations

import pytest

import webtensor as wt
from webtensor.models.gpt2 import GPT2

PROMPTS = ["It was a fine morning", "She said that", "The house at Longbourn was", "Mr. Darcy"]


@pytest.mark.parametrize("kind", ["cpu", "wgpu"])
def test_batch_equals_each_alone(kind, gpu):
    m = GPT2.from_pretrained(None, device=wt.Device.cpu() if kind == "cpu" else gpu)
    ids = [m.encode(p) for p in PROMPTS]
    want = [m.generate(p, 30, stop_at_eos=False) for p in ids]
    assert len({tuple(w) for w in want}) == len(want)  # different continuations: a real check
    assert m.generate_batch(ids, 30, stop_at_eos=False) == want
    assert m.generate_batch(ids[:1], 1, stop_at_eos=False) == [want[0][:1]]


def test_batch_checks_its_prompts(cpu):
    m = GPT2.from_pretrained(None, device=cpu)
    with pytest.raises(wt.SamplingError):
        m.generate_batch([[1, 2], [10**9]], 4)
    with pytest.raises(wt.ContextLengthError):
        m.generate_batch([[1] * m.config.n_positions], 4)


def test_no_prompts_no_continuations(cpu):
    """`generate_batch([])`: an empty result (nothing launched), as `[generate(p) for p in []]`; its max_new_tokens
    still checked."""
    m = GPT2.from_pretrained(None, device=cpu)
    assert m.generate_batch([], 4) == [] and m.generate_batch((), 1) == []
    with pytest.raises(wt.SamplingError, match="max_new_tokens must be an integer >= 1"):
        m.generate_batch([], 0)
