"""lm-evaluation-harness's `local-completions` model against the shared server (a real process on 127.0.0.1):
a tiny local multiple-choice task (log-likelihoods: `echo` + `logprobs` requests, the prompt as token ids from
the server's own /tokenize, found through /tokenizer_info) and a generation task (`until` stops), held against
HF transformers on the same checkpoint: each continuation's log-likelihood (1e-4) and greedy flag, computed as
lm-eval defines them, and each greedy generation cut at the task's stops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "lmeval" / "tiny.jsonl"
SHIPPED = Path(__file__).resolve().parents[2] / "src" / "webtensor" / "models" / "shipped"

pytestmark = pytest.mark.hf  # (held against transformers; lm-eval is in the hf extra)

TASKS = {
    "webtensor_tiny_mc": """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "webtensor_tiny_gen": """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{choices[0]}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""",
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmeval")
    for name, body in TASKS.items():
        (d / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                        f"    test: {DATA}\ntest_split: test\n{body}")
    return d


def _samples(result: dict, task: str) -> list:
    return [s["resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def _hf_loglikelihood(hf, tok, context: str, continuation: str) -> tuple[float, bool]:
    """lm-eval's definition: the continuation's tokens (those of context + continuation after the context's),
    the sum of their log-probabilities, and whether each is the argmax."""
    import torch

    ctx, whole = tok.encode(context).ids, tok.encode(context + continuation).ids
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([whole])).logits[0].double(), -1)
    cont = whole[len(ctx):]
    rows = lp[len(ctx) - 1:len(whole) - 1]
    return float(sum(rows[i, t] for i, t in enumerate(cont))), all(int(rows[i].argmax()) == t
                                                                   for i, t in enumerate(cont))


def _hf_greedy(hf, tok, context: str, n: int, stops: list[str]) -> str:
    import torch

    ids = tok.encode(context).ids
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    text = tok.decode(ids[len(tok.encode(context).ids):])
    for s in stops:
        text = text.split(s)[0]
    return text


def test_lm_eval_local_completions_against_transformers(api_server, tasks, monkeypatch):
    import json

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval = pytest.importorskip("lm_eval")
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tasks), include_defaults=False)
    ours = lm_eval.simple_evaluate(
        model="local-completions", tasks=list(TASKS), task_manager=tm, log_samples=True,
        model_args=f"base_url={api_server.url}/v1/completions,model={MODEL},max_length=256")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(SHIPPED)).eval()
    tok = tokenizers.Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))
    docs = [json.loads(line) for line in DATA.read_text().splitlines()]
    got = _samples(ours, "webtensor_tiny_mc")
    assert len(got) == len(docs) == 5
    correct = 0
    for doc, resps in zip(docs, got, strict=True):
        want = [_hf_loglikelihood(hf, tok, doc["question"], " " + c) for c in doc["choices"]]  # (target_delimiter)
        for [(ll, greedy)], (ll_hf, greedy_hf) in zip(resps, want, strict=True):
            assert ll == pytest.approx(ll_hf, abs=1e-4) and ll < 0 and greedy == greedy_hf
        correct += max(range(3), key=lambda i: want[i][0]) == doc["answer"]
    assert ours["results"]["webtensor_tiny_mc"]["acc,none"] == correct / len(docs)
    gens = [r[0][0] for r in _samples(ours, "webtensor_tiny_gen")]
    assert gens == [_hf_greedy(hf, tok, d["question"], 8, ["\n", "."]) for d in docs] and any(gens)
