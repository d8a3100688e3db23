"""Generation behaviour: sampling parameters and seeds, EOS, streaming whole UTF-8 characters,
context limits, the shipped model and the `webtensor generate` CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402
from webtensor.sampling import SamplingParams, sample  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("gen"), vocab_size=400, n_embd=64, n_layer=2, n_head=4)


@pytest.fixture(params=["cpu", "wgpu"])
def model(request, ckpt, gpu):
    return GPT2.from_pretrained(ckpt, device=wt.Device.cpu() if request.param == "cpu" else gpu)


def test_same_seed_same_output_and_seeds_differ(model):
    ids = model.encode("Once upon a time")
    kw = dict(max_new_tokens=24, temperature=1.0, top_k=50, top_p=0.95, stop_at_eos=False)
    a = model.generate(ids, seed=7, **kw)
    assert a == model.generate(ids, seed=7, **kw)
    others = [model.generate(ids, seed=s, **kw) for s in (8, 9, 10)]
    assert any(o != a for o in others)


def test_top_k_one_is_greedy(model):
    ids = model.encode("The quick brown fox")
    greedy = model.generate(ids, max_new_tokens=16, temperature=0.0, stop_at_eos=False)
    assert model.generate(ids, max_new_tokens=16, temperature=0.7, top_k=1, seed=3, stop_at_eos=False) == greedy


def test_sampler_respects_top_k_and_top_p():
    logits = np.array([5.0, 4.0, 3.0, 0.0, -1.0], np.float32)
    picks = {sample(logits, SamplingParams(1.0, top_k=2, seed=0), pos) for pos in range(300)}
    assert picks == {0, 1}
    # probabilities ~ [0.66, 0.24, 0.09, ...]: top_p 0.8 keeps the first two
    picks = {sample(logits, SamplingParams(1.0, top_p=0.8, seed=0), pos) for pos in range(300)}
    assert picks == {0, 1}
    assert {sample(logits, SamplingParams(1.0, seed=0), pos) for pos in range(5000)} == set(range(5))


def test_stops_at_eos(model):
    import dataclasses

    ids = model.encode("Once upon a time")
    free = model.generate(ids, max_new_tokens=40, temperature=0.0, stop_at_eos=False)
    eos = free[9]  # pretend the 10th generated token is EOS: generation must stop right after it
    model.config = dataclasses.replace(model.config, eos_token_id=eos)
    got = model.generate(ids, max_new_tokens=40, temperature=0.0)
    assert got == free[: free.index(eos) + 1] and got[-1] == eos and len(got) <= 10


def test_stream_yields_whole_characters(model):
    tok = model.tokenizer
    text = "naïve café — 你好 😀👍🏽"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 2  # multi-byte characters span several byte tokens
    pieces = list(tok.stream_decode(ids))
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
    out = list(model.stream("Hello", max_new_tokens=10, temperature=0.9, seed=1))
    assert all(isinstance(p, str) for p in out)


def test_context_limit_refused_before_any_work(model):
    ids = [1] * 90
    dev = model.device
    before = dev.stats()["dispatches"]
    with pytest.raises(wt.ContextLengthError, match="exceeds the model's context of 96"):
        model.generate(ids, max_new_tokens=10)
    assert dev.stats()["dispatches"] == before
    out = model.generate(ids, max_new_tokens=10, truncate_prompt=True, stop_at_eos=False)
    assert len(out) == 10


def test_shipped_model_generates_english(gpu):
    m = GPT2.from_pretrained(None, device=gpu)
    text = "".join(m.stream("It was a fine morning, and", max_new_tokens=40, temperature=0.8, top_k=40, seed=0))
    words = text.lower().split()
    assert len(words) >= 15
    common = {"the", "and", "a", "to", "of", "was", "he", "she", "it", "in", "her", "his", "i", "that", "not"}
    assert len(common & set(words)) >= 3, text


def test_cli_generate_streams_and_reports_device(ckpt):
    cmd = [sys.executable, "-m", "webtensor.cli", "generate", "--model", str(ckpt), "--device", "cpu", "-n", "8",
           "--temperature", "0", "Once upon a time"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time") and len(r.stdout) > len("Once upon a time")
    assert "CPU (reference)" in r.stderr and "gen" in r.stderr
    r2 = subprocess.run(cmd[:-1], input="From stdin", capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0 and r2.stdout.startswith("From stdin")
    bad = subprocess.run([sys.executable, "-m", "webtensor.cli", "generate", "--model", "/nonexistent/dir", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
