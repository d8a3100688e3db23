"""The real SmolLM2-135M-Instruct Q4_1 GGUF (llama.cpp's converter's layout: Q/K rows permuted, Q4_1 matrices, a
tied Q8_0 embedding, ChatML in its metadata) against transformers reading the same file: 32 greedy tokens
identical on the CPU device and lavapipe, the logits close; a chat through `webtensor serve` equal to transformers'
chat template plus greedy decoding."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from smollm2 import smollm2_gguf  # noqa: E402
from tolerance import assert_close  # noqa: E402

import webtensor as wt  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def hf():
    f = smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(f.parent), gguf_file=f.name,
                                                              dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(f.parent), gguf_file=f.name)
    return model, tok


def hf_greedy(model, ids: list[int], n: int, stop_at_eos: bool = True) -> list[int]:
    """transformers' greedy tokens: the argmax of its forward, step by step over its own KV cache (so that it goes
    on past <|im_end|> where asked, as `generate(stop_at_eos=False)` does)."""
    out: list[int] = []
    with torch.no_grad():
        step = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            out.append(int(step.logits[0, -1].argmax()))
            if stop_at_eos and out[-1] == 2:
                break
            past = {"cache": step["cache"]} if "cache" in step else {"past_key_values": step["past_key_values"]}
            step = model(torch.tensor([[out[-1]]]), use_cache=True, **past)  # (transformers 5.x renamed it)
    return out


@pytest.fixture(scope="module")
def prompt(hf) -> list[int]:
    m = wt.load_model(smollm2_gguf(), "cpu")
    ids = m.apply_chat_template(QUESTION, tokenize=True)
    assert ids == hf[1].apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)
    return ids


@pytest.fixture(scope="module")
def want(hf, prompt) -> tuple[object, list[int]]:
    """transformers' logits over the prompt and its 32 greedy tokens (on past <|im_end|>: the next turns)."""
    with torch.no_grad():
        logits = hf[0](torch.tensor([prompt])).logits[0].numpy()
    return logits, hf_greedy(hf[0], prompt, 32, stop_at_eos=False)


@pytest.mark.parametrize("device", ["cpu", pytest.param("lavapipe", marks=pytest.mark.wgpu)])
def test_32_greedy_tokens_equal_transformers(want, prompt, device):
    m = wt.load_model(smollm2_gguf(), device)
    assert (m.spec.architecture, m.spec.n_layer, m.spec.n_head, m.spec.n_kv_head) == ("llama", 30, 9, 3)
    assert_close(m.logits(prompt), want[0], rtol=2e-3)  # Q4_1 blocks kept as stored; transformers dequantizes them
    got = m.generate(prompt, 32, stop_at_eos=False)
    assert got == want[1]
    assert m.decode(got).startswith("The capital of France is Paris.")


def test_chat_through_serve_equals_transformers(hf, prompt, tmp_path):
    """`webtensor serve -m FILE.gguf`: /v1/chat/completions renders the file's ChatML template, decodes greedily,
    stops at <|im_end|> and shows no special token."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "serve"))
    from serve_helpers import Server

    server = Server.cli("--model", str(smollm2_gguf()), "--device", "cpu", "--max-batch", "2")
    try:
        name = server.health()["model"]
        body = json.dumps({"model": name, "messages": QUESTION, "temperature": 0, "max_tokens": 40}).encode()
        req = urllib.request.Request(f"{server.url}/v1/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())
    finally:
        server.stop()
    want_ids = hf_greedy(hf[0], prompt, 40)
    want_ids = want_ids[:want_ids.index(2)] if 2 in want_ids else want_ids  # up to <|im_end|>
    choice = out["choices"][0]
    assert choice["message"]["content"] == hf[1].decode(want_ids, skip_special_tokens=True)
    assert choice["finish_reason"] == ("stop" if len(want_ids) < 40 else "length")
    assert "<|im_end|>" not in choice["message"]["content"]
    assert out["usage"]["prompt_tokens"] == len(prompt)
