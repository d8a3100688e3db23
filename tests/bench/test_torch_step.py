"""The bench's torch anchors (`webtensor.bench.torch_step`: GPT-2, and the Llama family at the end) against HF on the
same weights, on the CPU (eager): greedy tokens and every step's logits for 16 steps, tied and
untied LM heads, batches, and its refusals. The CUDA-graph path is checked against the eager one
where CUDA is present."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent.parent))
from gpt2_fixtures import make_checkpoint  # noqa: E402
from tolerance import assert_close  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.hf  # the parity tier (needs torch and transformers)

from webtensor.bench.model_bench import torch_step_span  # noqa: E402
from webtensor.bench.torch_step import TorchGPT2Step  # noqa: E402
from webtensor.errors import UsageError  # noqa: E402

CONFIGS = {
    "tied": dict(vocab_size=301, n_embd=72, n_layer=2, n_head=4),  # head dim 18, odd vocab
    "untied": dict(vocab_size=300, n_embd=64, n_layer=3, n_head=2, tie_word_embeddings=False),
    # HF's exact GELU, an MLP not 4 C wide, attention scaled by 1 / layer, another epsilon
    "variant": dict(vocab_size=280, n_embd=48, n_layer=2, n_head=3, n_inner=80, activation_function="gelu",
                    scale_attn_by_inverse_layer_idx=True, layer_norm_epsilon=1e-4),
}
STEPS = 16


@pytest.fixture(scope="module", params=list(CONFIGS))
def hf(request, tmp_path_factory):
    d = make_checkpoint(tmp_path_factory.mktemp(request.param), **CONFIGS[request.param])
    model = transformers.GPT2LMHeadModel.from_pretrained(str(d)).eval()
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    assert tied == CONFIGS[request.param].get("tie_word_embeddings", True)
    return model


def hf_greedy(hf, rows: list[list[int]], n: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """HF's greedy `generate`: the new tokens of each row and the logits (B, V) of each step."""
    x = torch.tensor(rows)
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
    return out.sequences[:, x.shape[1]:].tolist(), [s.float().numpy() for s in out.logits]


def ours(step: TorchGPT2Step, rows: list[list[int]], n: int) -> tuple[list[list[int]], list[np.ndarray]]:
    step.prefill(rows)
    logits = [step.logits.float().numpy().copy()]
    for _ in range(n - 1):
        step.step()
        logits.append(step.logits.float().numpy().copy())
    return step.tokens(len(rows[0])), logits


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_greedy_tokens_and_logits_match_hf(hf, data):
    V, n_ctx = hf.config.vocab_size, hf.config.n_positions
    T = data.draw(st.integers(1, 40), label="prompt length")
    ids = data.draw(st.lists(st.integers(0, V - 1), min_size=T, max_size=T), label="prompt")
    span = data.draw(st.sampled_from([T + STEPS, n_ctx]), label="span")
    want_tokens, want_logits = hf_greedy(hf, [ids], STEPS)
    got_tokens, got_logits = ours(TorchGPT2Step(hf, span=span), [ids], STEPS)
    assert got_tokens == want_tokens
    for g, w in zip(got_logits, want_logits, strict=True):
        assert_close(g, w)


def test_continuation_varies_and_generate_agrees(hf):
    ids = [5, 17, 3, 99, 42, 8, 250]
    want, _ = hf_greedy(hf, [ids], STEPS)
    assert len(set(want[0])) > 3  # a real test of the decode path, not one token repeated
    assert TorchGPT2Step(hf).generate(ids, STEPS) == want[0]


def test_batch_rows_match_hf(hf):
    rng = np.random.default_rng(3)
    rows = rng.integers(0, hf.config.vocab_size, (3, 9)).tolist()
    want_tokens, want_logits = hf_greedy(hf, rows, STEPS)
    got_tokens, got_logits = ours(TorchGPT2Step(hf, batch=3), rows, STEPS)
    assert got_tokens == want_tokens
    for g, w in zip(got_logits, want_logits, strict=True):
        assert_close(g, w)


def test_a_second_prefill_starts_afresh(hf):
    step = TorchGPT2Step(hf, span=64)
    a = step.generate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 20)
    b = [4, 4, 4]
    assert step.generate(b, STEPS) == hf_greedy(hf, [b], STEPS)[0][0]
    assert step.generate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 20) == a


def test_refusals(hf):
    n_ctx = hf.config.n_positions
    step = TorchGPT2Step(hf, span=12)
    step.prefill([1] * 10)
    step.step()
    step.step()  # the step at position 11 is the span's last
    with pytest.raises(UsageError, match="past the span of 12"):
        step.step()
    with pytest.raises(UsageError, match="does not fit the context"):
        step.prefill([1] * n_ctx)
    with pytest.raises(UsageError, match="row"):
        TorchGPT2Step(hf, batch=2).prefill([[1, 2], [3]])
    with pytest.raises(UsageError, match="span 0"):
        TorchGPT2Step(hf, span=0)
    with pytest.raises(UsageError, match="only on CUDA"):
        TorchGPT2Step(copy.deepcopy(hf).half())


def test_span_covers_the_bench_decode():
    assert torch_step_span(1024, 128) == 192 and torch_step_span(1024, 56) == 64
    assert torch_step_span(96, 200) == 96


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_graph_replays_the_eager_step(hf, dtype):
    model = transformers.GPT2LMHeadModel(hf.config).eval()
    model.load_state_dict(hf.state_dict())
    model = model.to("cuda", dtype)
    ids = [5, 17, 3, 99, 42, 8, 250]
    graphed, eager = TorchGPT2Step(model, span=64), TorchGPT2Step(model, span=64, graph=False)
    assert graphed.graph is not None and eager.graph is None
    g_tok, g_log = ours(graphed, [ids], STEPS)
    e_tok, e_log = ours(eager, [ids], STEPS)
    assert g_tok == e_tok
    for g, e in zip(g_log, e_log, strict=True):  # the same kernels, but cuBLAS may choose others in a capture
        assert_close(g, e, rtol=(1e-5 if dtype == torch.float32 else 2e-3))
    if dtype == torch.float32:  # and HF's own greedy tokens
        assert g_tok == [hf_greedy(hf, [ids], STEPS)[0][0]]


# ---- the Llama family's step (`torch_step_llama.TorchLlamaStep`), through `torch_step_for` ----

@pytest.fixture(scope="module", params=["llama-gqa", "llama-mqa-tied", "llama-mha-bias", "llama3-rope", "qwen2",
                                        "qwen3-hd128"])
def hf_llama(request, tmp_path_factory):
    from llama_fixtures import make_llama

    d = make_llama(tmp_path_factory.mktemp(request.param), request.param)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():  # matrices of std 0.3 instead of 0.02: greedy continuations that vary
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(15.0)
    return model


def test_llama_step_matches_hf(hf_llama):
    """Greedy tokens identical to HF's and every step's logits within 1e-5, for one sequence and a batch of three
    (GQA / MQA / MHA, biases, llama3 rope, Qwen3's QK-norm, tied and untied heads)."""
    from webtensor.bench.torch_step import torch_step_for
    from webtensor.bench.torch_step_llama import TorchLlamaStep

    rng = np.random.default_rng(5)
    for rows, span in (([[5, 17, 3, 99, 42, 8, 250]], 64), (rng.integers(0, 4096, (3, 9)).tolist(), None)):
        step = torch_step_for(hf_llama, span=span, batch=len(rows), n_ctx=96)
        assert isinstance(step, TorchLlamaStep)
        want_tokens, want_logits = hf_greedy(hf_llama, rows, STEPS)
        got_tokens, got_logits = ours(step, rows, STEPS)
        assert got_tokens == want_tokens
        assert len({t for r in want_tokens for t in r}) > 3  # (the decode path is exercised, not one token repeated)
        for g, w in zip(got_logits, want_logits, strict=True):
            assert_close(g, w)


def test_llama_step_refusals(hf_llama):
    from webtensor.bench.torch_step import torch_step_for

    with pytest.raises(UsageError, match="n_ctx 1000 must be in 2..128"):
        torch_step_for(hf_llama, n_ctx=1000)
    step = torch_step_for(hf_llama, span=10, n_ctx=32)
    step.prefill([1] * 9)
    step.step()  # the step at position 9 is the span's last
    with pytest.raises(UsageError, match="past the span of 10"):
        step.step()
    with pytest.raises(UsageError, match="only on CUDA"):
        torch_step_for(copy.deepcopy(hf_llama).half())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_llama_cuda_graph_replays_the_eager_step(hf_llama):
    from webtensor.bench.torch_step import torch_step_for

    model = copy.deepcopy(hf_llama).to("cuda")
    ids = [5, 17, 3, 99, 42, 8, 250]
    graphed, eager = torch_step_for(model, span=64, n_ctx=96), torch_step_for(model, span=64, graph=False, n_ctx=96)
    assert graphed.graph is not None and eager.graph is None
    g_tok, g_log = ours(graphed, [ids], STEPS)
    e_tok, e_log = ours(eager, [ids], STEPS)
    assert g_tok == e_tok == hf_greedy(hf_llama, [ids], STEPS)[0]
    for g, e in zip(g_log, e_log, strict=True):
        assert_close(g, e)
