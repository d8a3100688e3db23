"""The server's log-probabilities (completions `logprobs` / `echo`, chat `logprobs` / `top_logprobs`, streamed
and not) against HF transformers on the same checkpoint, `n` choices and their seeds, and the sampling
parameters (penalties, logit_bias, min_p, stop_token_ids) giving the tokens `LanguageModel.generate` gives.
All on the session's shared server (the shipped model on the CPU device, the batched engine)."""

from __future__ import annotations

import codecs
import json
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import webtensor as wt

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, post  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "webtensor" / "models" / "shipped"


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2LMHeadModel.from_pretrained(str(SHIPPED)).eval()


@pytest.fixture(scope="module")
def model():
    return wt.load_model(None, device=wt.Device.cpu())


def hf_logprobs(hf, ids: list[int]) -> np.ndarray:
    """log_softmax of HF's float32 logits at every position of `ids`: (len(ids), V)."""
    import torch

    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1).numpy()


def stream(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def _prompt(rng: np.random.Generator, n: int) -> list[int]:
    return [int(i) for i in rng.integers(1, 4000, n)]


@pytest.mark.hf
def _offsets(model, ids: list[int]) -> list[int]:
    """Each token's text_offset: the characters decoded from the bytes before it (a character whose bytes are not
    all there yet not counted), as the text itself is decoded."""
    decoder, out, n = codecs.getincrementaldecoder("utf-8")(errors="replace"), [], 0
    for i in ids:
        out.append(n)
        n += len(decoder.decode(model.tokenizer.token_bytes(i)))
    return out


def test_echo_logprobs_are_hfs(api_server, hf, model):
    """lm-evaluation-harness's request (echo, logprobs 1, max_tokens 1, greedy), and max_tokens 0: the prompt's
    tokens' log-probabilities (the first None) and the generated one's, equal to HF's within 1e-4, the top
    ones HF's largest; the prompt read in several chunks (70 > 64 tokens)."""
    ids = _prompt(np.random.default_rng(1), 70)
    ref = hf_logprobs(hf, ids)
    for max_tokens in (1, 0):
        status, body, _ = post(api_server.url + "/v1/completions", {
            "model": MODEL, "prompt": ids, "echo": True, "logprobs": 3, "max_tokens": max_tokens, "temperature": 0})
        assert status == 200, body
        lp = body["choices"][0]["logprobs"]
        n = len(ids) + max_tokens
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        got = np.array(lp["token_logprobs"][1:len(ids)])
        want = ref[np.arange(len(ids) - 1), ids[1:]]
        assert np.abs(got - want).max() <= 1e-4
        for i in range(1, len(ids)):
            top = lp["top_logprobs"][i]
            best = np.sort(ref[i - 1])[::-1][:3]
            assert np.abs(np.sort(list(top.values()))[::-1][:3] - best).max() <= 1e-4
        offsets = lp["text_offset"]
        assert offsets[0] == 0  # (each token's offset: the characters of the text before it)
        assert offsets == _offsets(model, ids + [0] * max_tokens)
        assert body["usage"]["completion_tokens"] == max_tokens
        if max_tokens:  # the generated (greedy) token: the most likely, and its log-probability HF's
            assert lp["token_logprobs"][-1] == pytest.approx(ref[-1].max(), abs=1e-4)
            assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())


def test_completion_logprobs_streamed_equal_whole(api_server):
    body = {"model": MODEL, "prompt": "It was a dark", "max_tokens": 12, "logprobs": 2, "temperature": 0.8,
            "seed": 11, "echo": True}
    status, whole, _ = post(api_server.url + "/v1/completions", body)
    assert status == 200
    parts = stream(api_server.url + "/v1/completions", body)
    text = "".join(c["choices"][0]["text"] for c in parts if c["choices"])
    assert text == whole["choices"][0]["text"] and text.startswith("It was a dark")
    joined: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in parts:
        for k in joined:
            joined[k] += c["choices"][0]["logprobs"][k]
    assert joined == whole["choices"][0]["logprobs"]


def test_chat_logprobs_streamed_and_not(api_server, model):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8,
            "logprobs": True, "top_logprobs": 4, "seed": 5, "temperature": 1.0}
    status, whole, _ = post(api_server.url + "/v1/chat/completions", body)
    assert status == 200
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in content) == whole["choices"][0]["message"]["content"]
    for e in content:
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 4 and tops == sorted(tops, reverse=True) and e["logprob"] <= tops[0] + 1e-12
    parts = stream(api_server.url + "/v1/chat/completions", body)
    streamed = [e for c in parts if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    # the same entries; the values to float32's rounding (the second request reads on from the first's cached
    # prompt, computed in another chunk: tests/serve/test_serve_prefix.py)
    assert _shape(streamed) == _shape(content)
    assert np.allclose(_values(streamed), _values(content), rtol=1e-5, atol=1e-5)
    # no logprobs asked: null, as before
    status, plain, _ = post(api_server.url + "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["message"] == whole["choices"][0]["message"]  # (reporting changes no token)


def _shape(entries: list[dict]) -> list:
    """Chat log-probability entries without their values: tokens, bytes, the top tokens in order."""
    return [(e["token"], e["bytes"], [(t["token"], t["bytes"]) for t in e["top_logprobs"]]) for e in entries]


def _values(entries: list[dict]) -> list[float]:
    return [x for e in entries for x in [e["logprob"], *(t["logprob"] for t in e["top_logprobs"])]]


def test_n_choices_have_their_own_seeds(api_server):
    base = {"model": MODEL, "prompt": ["Once upon a time", "The"], "max_tokens": 10, "temperature": 1.0,
            "seed": 1234, "ignore_eos": True}
    status, one, _ = post(api_server.url + "/v1/completions", base)
    status, three, _ = post(api_server.url + "/v1/completions", {**base, "n": 3})
    assert status == 200
    texts = [c["text"] for c in sorted(three["choices"], key=lambda c: c["index"])]
    assert len(texts) == 6 and len(set(texts[:3])) == 3
    assert [texts[0], texts[3]] == [c["text"] for c in one["choices"]]  # choice 0 of n: the n = 1 request's
    u = three["usage"]
    assert u["prompt_tokens"] == one["usage"]["prompt_tokens"] and u["completion_tokens"] == 60
    parts = stream(api_server.url + "/v1/completions", {**base, "n": 3, "stream_options": {"include_usage": True}})
    got = {}
    for c in parts:
        for ch in c["choices"]:
            got[ch["index"]] = got.get(ch["index"], "") + ch["text"]
    assert [got[i] for i in range(6)] == texts and parts[-1]["usage"] == u
    status, chat, _ = post(api_server.url + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 6, "seed": 3})
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["choices"][0]["message"]["content"] != chat["choices"][1]["message"]["content"]


@pytest.mark.parametrize("kw", [
    dict(presence_penalty=1.5, frequency_penalty=0.7),
    dict(repetition_penalty=1.3, temperature=0.9, seed=21, min_p=0.05),
    dict(logit_bias={"13": 4.0, "11": -100}, temperature=0.7, seed=2, top_k=40, top_p=0.9),
    dict(min_tokens=5, frequency_penalty=-0.5, temperature=1.1, seed=8),
])
def test_sampling_parameters_give_generates_tokens(api_server, model, kw):
    prompt = "It is a truth universally acknowledged"
    status, body, _ = post(api_server.url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 24,
                                                                "temperature": 0.0, **kw})
    assert status == 200, body
    args = {k: v for k, v in kw.items() if k != "logit_bias"}
    if "logit_bias" in kw:
        args["logit_bias"] = {int(k): v for k, v in kw["logit_bias"].items()}
    want = model.generate(model.encode(prompt), 24, **{"temperature": 0.0, **args})
    assert body["choices"][0]["text"] == model.decode(want)
    assert body["usage"]["completion_tokens"] == len(want)


def test_logit_bias_forces_and_stop_token_ids_stop(api_server, model):
    prompt = "Once upon a time"
    status, body, _ = post(api_server.url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logit_bias": {"284": 100}})
    assert body["choices"][0]["text"] == model.decode([284] * 6)
    greedy = model.generate(model.encode(prompt), 8)
    status, body, _ = post(api_server.url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stop_token_ids": [greedy[3]]})
    assert body["choices"][0]["finish_reason"] == "stop"  # (the stop token is no special token: its text stays)
    assert body["choices"][0]["text"] == model.decode(greedy[:4]) and body["usage"]["completion_tokens"] == 4
