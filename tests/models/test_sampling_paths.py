"""One seed, the same sampled tokens on every native path: `GPT2.generate` on the CPU device and on
WebGPU (lavapipe here; the replayed decode graph and op by op), the server's engine (whole and
chunked prefill), and the model as the page loads it (pure-Python readers, natively on wgpu). The page itself,
in Chromium, is checked against the same tokens in tests/web/test_browser.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.models.gpt2 import GPT2  # noqa: E402
from webtensor.sampling import SamplingParams, sample  # noqa: E402

KW = dict(temperature=0.8, top_k=40, top_p=0.9)
SEED, N_NEW = 2024, 14
PROMPT = "Once upon a time there was"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    # init 0.1: logits spread enough that top-k 40 / top-p 0.9 keep several tokens
    return make_checkpoint(tmp_path_factory.mktemp("paths"), vocab_size=400, n_embd=64, n_layer=2, n_head=4,
                           n_positions=64, init=0.1)


@pytest.fixture(scope="module")
def cpu_model(ckpt):
    return GPT2.from_pretrained(ckpt, device=wt.Device.cpu())


@pytest.fixture(scope="module")
def want(cpu_model):
    """The CPU model's tokens for SEED, and a check of what they mean: the token at position p is
    `sample(logits at p - 1, params, p)`, from the model's full forward over prompt + tokens."""
    ids = cpu_model.encode(PROMPT)
    toks = cpu_model.generate(ids, N_NEW, seed=SEED, stop_at_eos=False, **KW)
    logits = cpu_model.logits(ids + toks[:-1])  # (len(ids) + N_NEW - 1, V)
    params = SamplingParams(seed=SEED, **KW)
    n = len(ids)
    assert toks == [sample(logits[n - 1 + i], params, n + i) for i in range(N_NEW)]
    # the parameters matter here: not greedy, another seed differs, several tokens are candidates
    assert toks != cpu_model.generate(ids, N_NEW, temperature=0, stop_at_eos=False)
    assert toks != cpu_model.generate(ids, N_NEW, seed=SEED + 1, stop_at_eos=False, **KW)
    assert len({sample(logits[n - 1], params, p) for p in range(200)}) > 2
    return ids, toks


def test_wgpu_model_same_tokens(ckpt, gpu, want):
    ids, toks = want
    model = GPT2.from_pretrained(ckpt, device=gpu)
    assert model.generate(ids, N_NEW, seed=SEED, stop_at_eos=False, **KW) == toks  # the decode graph
    model.use_graph = False
    assert model.generate(ids, N_NEW, seed=SEED, stop_at_eos=False, **KW) == toks  # op by op


def _engine_tokens(model: GPT2, ids: list[int], chunk: int) -> list[int]:
    """Drive the server's engine as its scheduler does: the prompt in chunks, then one token a step."""
    from webtensor.serve.engine import ModelEngine, Row, Sampling

    engine = ModelEngine(model, max_batch=2, engine="reference")
    s = Sampling(seed=SEED, **KW)
    out: list[int] = []
    for start in range(0, len(ids), chunk):
        part = tuple(ids[start:start + chunk])
        (tok,) = engine.step([Row(1, part, start, s, sample=start + len(part) == len(ids))])
    out.append(tok)
    while len(out) < N_NEW:
        (tok,) = engine.step([Row(1, (out[-1],), len(ids) + len(out) - 1, s)])
        out.append(tok)
    engine.release(1)
    return out


def test_serve_engine_same_tokens(cpu_model, gpu, ckpt, want):
    ids, toks = want
    assert _engine_tokens(cpu_model, ids, chunk=len(ids)) == toks
    assert _engine_tokens(cpu_model, ids, chunk=2) == toks  # however the prefill is cut
    assert _engine_tokens(GPT2.from_pretrained(ckpt, device=gpu), ids, chunk=3) == toks


def _page(ckpt, gpu):
    """The model as the page loads it: the one loader through its pure-Python readers."""
    return wt.load_model(ckpt, gpu, "float32", reader="pure")


def test_page_driver_same_tokens(ckpt, gpu, want):
    ids, toks = want
    model = _page(ckpt, gpu)
    assert model.generate(ids, N_NEW, seed=SEED, stop_at_eos=False, **KW) == toks


def test_truncated_prompt_positions_count_from_the_kept_tokens(cpu_model, gpu, ckpt):
    ids = (cpu_model.encode(PROMPT) * 12)[:60]  # 60 + 10 > 64 positions: the first 6 tokens are dropped
    a = cpu_model.generate(ids, 10, seed=SEED, stop_at_eos=False, truncate_prompt=True, **KW)
    assert a == cpu_model.generate(ids[6:], 10, seed=SEED, stop_at_eos=False, **KW)
    page = _page(ckpt, gpu)
    assert page.generate(ids, 10, seed=SEED, stop_at_eos=False, truncate_prompt=True, **KW) == a
    with pytest.raises(wt.ContextLengthError, match="exceeds the model's context of 64 positions"):
        page.generate(ids, 10, seed=SEED, **KW)


def test_page_driver_checks_as_the_api(ckpt, gpu, cpu_model):
    """The page's model refuses what GPT2.generate refuses, with the same message."""
    page = _page(ckpt, gpu)
    bad = [dict(max_new_tokens=0), dict(temperature=-0.5), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
           dict(seed=-1), dict(temperature=float("nan")), dict(ids=[]), dict(ids=[5, 400]),
           dict(ids=[1.5]), dict(max_new_tokens=70)]
    for case in bad:
        kw = {"ids": [5, 6, 7], "max_new_tokens": 4, **case}
        with pytest.raises(wt.WebtensorError) as api:
            cpu_model.generate(kw.pop("ids"), **kw)
        kw = {"ids": [5, 6, 7], "max_new_tokens": 4, **case}
        with pytest.raises(type(api.value)) as got:
            page.generate(kw.pop("ids"), **kw)
        assert str(got.value) == str(api.value), case

