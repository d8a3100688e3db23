"""`webtensor serve` on the CPU device with the shipped model (the default, batched engine), through
the official `openai` client and raw HTTP: completions and chat (streamed and not), continuous
batching that changes nothing a request gets (32 concurrent streams get what each gets alone from a
server with the reference engine), and OpenAI error bodies for every bad input."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, Server, assert_openai_error, get, post  # noqa: E402

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(api_server):
    return api_server


@pytest.fixture(scope="module")
def reference_server():
    s = Server.cli("--device", "cpu", "--max-batch", "4", "--engine", "reference")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completion_streamed_equals_unstreamed(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    whole = client.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason in ("length", "stop") and choice.text
    assert whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens <= 12
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompt_and_seeded_sampling(client):
    ids = [10, 20, 30, 40]
    kw = dict(model=MODEL, prompt=ids, max_tokens=10, temperature=1.0, top_p=0.9, seed=123)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.usage.prompt_tokens == len(ids)
    others = {client.completions.create(**{**kw, "seed": s}).choices[0].text for s in (1, 2, 3)}
    assert others != {a.choices[0].text}


def test_stop_sequence_cuts_the_text(client):
    kw = dict(model=MODEL, prompt="The", max_tokens=30, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    stop = full[5:8]
    assert len(stop) == 3
    cut = client.completions.create(**kw, stop=[stop])
    assert cut.choices[0].text == full[: full.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stop=stop, stream=True))
    assert streamed == cut.choices[0].text


def test_chat_streamed_and_not(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert "\nUser:" not in msg.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    status, health, _ = get(server.url + "/health")
    assert status == 200 and health["status"] == "ok" and health["max_batch"] == 32
    assert health["engine"] == "batched"
    status, text, hdrs = get(server.url + "/metrics")
    assert status == 200 and hdrs["content-type"].startswith("text/plain")
    for name in ("webtensor:http_requests_total", "webtensor:prompt_tokens_total",
                 "webtensor:generation_tokens_total", "webtensor:num_requests_waiting",
                 "webtensor:num_requests_running", "webtensor:step_rows_bucket",
                 "webtensor:iteration_tokens_total_bucket", "webtensor:request_success_total",
                 "webtensor:e2e_request_latency_seconds_bucket", "webtensor:request_queue_time_seconds_bucket",
                 "webtensor:time_to_first_token_seconds_bucket", "webtensor:inter_token_latency_seconds_bucket"):
        assert name in text, name
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines() if not line.startswith("#")}
    generated = values["webtensor:generation_tokens_total"]
    assert generated > 0
    assert values["webtensor:request_generation_tokens_sum"] <= generated  # (those of finished requests)
    assert sum(v for k, v in values.items() if k.startswith("webtensor:request_success_total")) >= 1


def test_32_concurrent_streams_get_what_they_get_alone(server, reference_server):
    """Different prompts (some longer than a prefill chunk), lengths and sampling, all at once on the
    batched engine; each alone on the reference engine."""
    assert reference_server.health()["engine"] == "reference"
    batched = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reference = openai.AsyncOpenAI(base_url=reference_server.url + "/v1", api_key="unused", max_retries=0)

    def job(i: int) -> dict:
        prompt = " ".join(["word"] * (1 + (i * 7) % 90 if i % 4 == 0 else 1 + i % 9)) + f" {i}:"
        kw = dict(model=MODEL, prompt=prompt, max_tokens=3 + i % 9, ignore_eos=i % 3 == 0)
        sampling = dict(temperature=0) if i % 2 == 0 else dict(temperature=0.9, top_k=40, seed=1000 + i)
        return {**kw, **sampling}

    async def run(kw: dict, aclient: openai.AsyncOpenAI = batched) -> tuple[str, str | None]:
        extra = {k: kw.pop(k) for k in ("top_k", "ignore_eos") if k in kw}
        stream = await aclient.completions.create(**kw, stream=True, extra_body=extra)
        text, finish = "", None
        async for c in stream:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
        return text, finish

    async def main() -> tuple[list, list]:
        alone = [await run(job(i), reference) for i in range(32)]
        together = await asyncio.gather(*(run(job(i)) for i in range(32)))
        return alone, list(together)

    alone, together = asyncio.run(main())
    assert together == alone
    assert len({t for t, _ in alone}) > 16  # they really differ


BAD = [
    (b'{"model": "webtensor-shipped", "prompt": ', None),
    (b"[1, 2", None),
    ({"model": MODEL, "prompt": 5}, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0.5}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": 2.5}, "temperature"),
    ({"model": MODEL, "prompt": "x", "temperature": -0.1}, "temperature"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": -0.1}, "top_p"),
    ({"model": MODEL, "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": MODEL, "prompt": "x", "top_k": -2}, "top_k"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": "word " * 400}, "prompt"),
    ({"model": MODEL, "prompt": "hello", "max_tokens": 255}, "max_tokens"),
    ({"model": MODEL, "prompt": [1, 99999]}, "prompt"),
    ({"model": MODEL, "prompt": ["a"] * 129}, "prompt"),
    ({"model": MODEL, "prompt": ["a", "word " * 400]}, "prompt.1"),
    ({"model": MODEL, "prompt": [[1], [2, 99999]]}, "prompt.1"),
    ({"model": MODEL, "prompt": "x", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "x", "n": 129}, "n"),
    ({"model": MODEL, "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"model": MODEL, "prompt": "x", "logprobs": -1}, "logprobs"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"5000": 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias.5"),
    ({"model": MODEL, "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": MODEL, "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": MODEL, "prompt": "x", "min_p": 1.5}, "min_p"),
    ({"model": MODEL, "prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"model": MODEL, "prompt": "x", "stop_token_ids": [99999]}, "stop_token_ids"),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": MODEL, "prompt": "x", "stop": ""}, "stop"),
    ({"model": MODEL, "prompt": "x", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "x"}, "model"),
    ({"model": MODEL, "prompt": "x", "skip_special_tokens": False}, "skip_special_tokens"),
    ({"model": MODEL, "prompt": "x", "no_stop_trim": True}, "no_stop_trim"),
    ({"model": MODEL, "prompt": "x", "return_hidden_states": True}, "return_hidden_states"),
    ({"model": MODEL, "prompt": "x", "no_stop_trim": 0}, "no_stop_trim"),
]

BAD_CHAT = [
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    *(({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], key: value}, key)
      for key, value in (("continue_final_message", True), ("include_reasoning", False),
                         ("separate_reasoning", False), ("stream_reasoning", False), ("skip_special_tokens", False))),
]


def test_the_fields_vllm_router_adds_are_accepted(server):
    """vLLM's router (docs in the README, "Beyond one device") re-serialises each request it forwards with these
    flags at these values: the request is served as without them; the other values are refused (BAD, BAD_CHAT)."""
    both = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
    body = {"model": MODEL, "prompt": "It was a fine", "max_tokens": 6, "temperature": 0}
    plain, routed = (post(server.url + "/v1/completions", b)[1] for b in (body, {**body, **both, "echo": False}))
    assert routed["choices"][0]["text"] == plain["choices"][0]["text"], routed
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
    extra = {**both, "logprobs": False, "continue_final_message": False, "separate_reasoning": True,
             "stream_reasoning": True, "include_reasoning": True}
    plain, routed = (post(server.url + "/v1/chat/completions", b)[1] for b in (chat, {**chat, **extra}))
    assert routed["choices"][0]["message"] == plain["choices"][0]["message"], routed


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_completion_request_is_400(server, body, param):
    status, resp, _ = post(server.url + "/v1/completions", body)
    assert status == 400, resp
    err = assert_openai_error(resp, "invalid_request_error")
    assert err["param"] == param


@pytest.mark.parametrize(("body", "param"), BAD_CHAT)
def test_bad_chat_request_is_400(server, body, param):
    status, resp, _ = post(server.url + "/v1/chat/completions", body)
    assert status == 400, resp
    assert assert_openai_error(resp, "invalid_request_error")["param"] == param


def test_unknown_model_and_route_are_404(server, client):
    status, resp, _ = post(server.url + "/v1/completions", {"model": "gpt-9", "prompt": "x"})
    assert status == 404 and assert_openai_error(resp, "not_found_error")["param"] == "model"
    status, resp, _ = get(server.url + "/v1/nothing")
    assert status == 404 and assert_openai_error(resp, "not_found_error")
    with pytest.raises(openai.BadRequestError) as e:  # the client surfaces the body
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"


def test_token_events_from_the_template_are_the_chunks_dump():
    """The per-token SSE event made from a template once per stream (app._framer) is byte for byte
    what dumping the chunk gives, for completions and chat."""
    from webtensor.serve import app as A

    def completion(text):
        return {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": 'm"x',
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}

    def chat_chunk(text):
        return {"id": "c-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
                "choices": [{"index": 3, "delta": {"content": text}, "logprobs": None, "finish_reason": None}],
                "usage": None}

    for chunk in (completion, chat_chunk):
        frame = A._framer(chunk)
        for text in ["", "a", ' "quoted"\n\\', "é😀\u2028\x00", "\ue000", A._MARK]:
            assert frame(text) == A._data(chunk(text))
