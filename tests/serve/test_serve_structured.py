"""Structured output (`response_format` json_object / json_schema, serve/grammar.py over llguidance): with
random models (Llama-family weights transformers wrote, and the shipped GPT-2) every output that ends parses as
JSON and validates against its schema (jsonschema), greedy and sampled, streamed and not, beside unconstrained
rows in one step; a schema llguidance cannot compile is a 400; the SmolLM2 instruct GGUF answers in the schema."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import jsonschema
import pytest

import webtensor as wt
from webtensor.serve import grammar
from webtensor.serve.engine import ModelEngine, Sampling
from webtensor.serve.scheduler import Generation, Scheduler

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from llama_fixtures import make_llama  # noqa: E402
from serve_helpers import MODEL, post  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "kind"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
                         "kind": {"enum": ["cat", "dog", "fish"]},
                         "vip": {"type": "boolean"}}}
NESTED = {"type": "object", "additionalProperties": False, "required": ["items"],
          "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
              "type": "object", "additionalProperties": False, "required": ["id", "ok"],
              "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"},
                             "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 6}]}}}}}}
SCHEMAS = [PERSON, NESTED]


def _run(engine: ModelEngine, jobs: list[tuple[list[int], Sampling, int, str | None]]) -> list[tuple[str, str]]:
    """The jobs (prompt, sampling, max_tokens, grammar) together: each one's (text, finish reason)."""
    async def go() -> list[tuple[str, str]]:
        sched = Scheduler(engine, max_queue=16, prefill_chunk=64)
        sched.start()
        try:
            gens = [Generation(p, n, s, grammar=g) for p, s, n, g in jobs]
            sched.submit_all(gens)

            async def one(g: Generation) -> tuple[str, str]:
                parts, finish = [], None
                async for ev in g.stream():
                    assert ev.error is None, ev.error.message
                    parts.append(ev.text)
                    finish = ev.finish
                return "".join(parts), finish
            return list(await asyncio.gather(*(one(g) for g in gens)))
        finally:
            await sched.stop()
    return asyncio.run(go())


@pytest.mark.hf  # (transformers writes the random checkpoints)
@pytest.mark.parametrize(("variant", "dev_name"), [("llama-gqa", "cpu"), ("llama-gqa", "wgpu"), ("qwen3", "cpu")])
def test_random_models_always_give_valid_json(tmp_path, variant, dev_name, gpu):
    """Greedy rows take the device's argmax of the masked logits (`ops.token_mask` in the step graph), sampled
    ones sample the masked logits read back; on the CPU device and on WebGPU (lavapipe)."""
    d = make_llama(tmp_path / variant, variant, seed=3)
    model = wt.load_model(d, device=wt.Device.cpu() if dev_name == "cpu" else gpu)
    engine = ModelEngine(model, 8)
    try:
        jobs, schemas = [], []
        for k, schema in enumerate(SCHEMAS):
            g = grammar.compile_format("json_schema", schema)
            for temperature, seed in ((0.0, 0), (1.0, k), (1.3, 10 + k)):
                jobs.append(([5 + k, 77, 300], Sampling(temperature, seed=seed, constrained=True), 120, g))
                schemas.append(schema)
        jobs.append(([9, 8, 7], Sampling(0.8, seed=1), 20, None))  # an unconstrained row beside them
        out = _run(engine, jobs)
    finally:
        engine.close()
    for (text, finish), schema in zip(out, schemas, strict=False):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
    assert out[-1][1] == "length"


@pytest.mark.hf
def test_json_object_that_ends_is_an_object(tmp_path):
    d = make_llama(tmp_path / "m", "llama-gqa", seed=5)
    model = wt.load_model(d, device=wt.Device.cpu())
    engine = ModelEngine(model, 4)
    g = grammar.compile_format("json_object", None)
    try:
        out = _run(engine, [([1, 2, 3], Sampling(1.0, seed=s, constrained=True), 150, g) for s in range(4)])
    finally:
        engine.close()
    ended = [text for text, finish in out if finish == "stop"]
    assert all(text.startswith("{") for text, _ in out)
    for text in ended:
        assert isinstance(json.loads(text), dict)


def test_server_json_schema_streamed_and_not(api_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "A person, as JSON"}], "max_tokens": 100,
            "response_format": fmt, "seed": 4, "temperature": 0.9, "n": 2, "logprobs": True}
    status, out, _ = post(api_server.url + "/v1/chat/completions", body)
    assert status == 200, out
    for choice in out["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
        assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])
    from test_serve_sampling import stream

    parts = stream(api_server.url + "/v1/chat/completions", body)
    texts = {}
    for c in parts:
        for ch in c["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["delta"].get("content", "")
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in out["choices"]]
    status, obj, _ = post(api_server.url + "/v1/chat/completions", {
        **body, "n": 1, "logprobs": None, "temperature": 0, "max_tokens": 8,
        "response_format": {"type": "json_object"}})
    assert status == 200 and obj["choices"][0]["message"]["content"].startswith("{")


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
    {"type": "xml"},
])
def test_a_schema_that_cannot_compile_is_400(api_server, fmt):
    status, out, _ = post(api_server.url + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": fmt})
    assert status == 400, out
    assert out["error"]["param"].startswith("response_format"), out


def test_smollm2_instruct_answers_in_the_schema(gpu):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF) on WebGPU (lavapipe here: faster than the CPU reference's
    dequantizing products), greedy under a schema: it names Paris, in the schema's JSON."""
    from smollm2 import smollm2_gguf

    model = wt.load_model(smollm2_gguf(), device=gpu, n_ctx=256)
    engine = ModelEngine(model, 2)
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
              "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string",
                                                                                     "maxLength": 30}}}
    prompt = model.apply_chat_template([{"role": "user", "content": "What is the capital of France? JSON."}],
                                       tokenize=True)
    try:
        (text, finish), = _run(engine, [(prompt, Sampling(constrained=True), 40,
                                         grammar.compile_format("json_schema", schema))])
    finally:
        engine.close()
    assert finish == "stop"
    answer = json.loads(text)
    jsonschema.validate(answer, schema)
    assert "paris" in answer["city"].lower()


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_masked_rows_take_the_argmax_of_the_allowed_tokens_on_the_device(dev_name, gpu):
    """The runner applies each choosing row's mask before the argmax (graph and eager steps, prompt chunks
    and decode rows together); only the tokens come back (4 bytes a row on WebGPU), no logits."""
    import numpy as np

    from webtensor.runtime.runner import RunRow

    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    model = wt.load_model(None, device=dev)
    V = model.vocab_size
    rng = np.random.default_rng(0)
    prompts = [[int(i) for i in rng.integers(1, V, n)] for n in (7, 70)]
    allowed = [rng.random(V) < 0.01 for _ in prompts]
    masks = [np.packbits(a, bitorder="little").tobytes().ljust(4 * ((V + 31) // 32), b"\0") for a in allowed]
    want = [int(np.flatnonzero(a)[np.argmax(model.logits(p)[-1][a])]) for p, a in zip(prompts, allowed, strict=True)]
    for use_graph in (True, False):
        runner = model.runner(2, use_graph=use_graph)
        before = dev.stats()["bytes_read"] if dev_name == "wgpu" else 0
        got = runner.collect(runner.launch([RunRow(0, tuple(prompts[0]), 0, mask=masks[0]),
                                            RunRow(1, tuple(prompts[1][:64]), 0, pick=False)]))
        got2 = runner.collect(runner.launch([RunRow(1, tuple(prompts[1][64:]), 64, mask=masks[1])]))
        assert [got.tokens[0][0], got2.tokens[0][0]] == want
        if dev_name == "wgpu":
            assert dev.stats()["bytes_read"] - before < 4 * V  # (token ids only)
        runner.close()
