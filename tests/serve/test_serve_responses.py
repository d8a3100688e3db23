"""The Responses API (POST /v1/responses) against a real server process on 127.0.0.1 (the shipped model on the
CPU device): the official `openai` client, whole and streamed; every answer and every stream event validated
against OpenAI's published schemas (Response and the events, tests/serve/openai_schema.py, strict); the prompt
and greedy text equal to /v1/chat/completions' for the same messages; max_output_tokens -> incomplete;
text.format json_schema through chat's structured output; bad fields refused by name (400) while a stream runs
beside them unaffected; an error mid-stream as an `error` event and response.failed."""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from openai_schema import check  # noqa: E402
from serve_helpers import MODEL, assert_openai_error, get, post  # noqa: E402

openai = pytest.importorskip("openai")

EVENTS = {"response.created": "ResponseCreatedEvent", "response.in_progress": "ResponseInProgressEvent",
          "response.output_item.added": "ResponseOutputItemAddedEvent",
          "response.content_part.added": "ResponseContentPartAddedEvent",
          "response.output_text.delta": "ResponseTextDeltaEvent", "response.output_text.done": "ResponseTextDoneEvent",
          "response.content_part.done": "ResponseContentPartDoneEvent",
          "response.output_item.done": "ResponseOutputItemDoneEvent", "response.completed": "ResponseCompletedEvent",
          "response.incomplete": "ResponseIncompleteEvent", "response.failed": "ResponseFailedEvent",
          "error": "ResponseErrorEvent"}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 120}}}
HEAD = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
TAIL = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
BASE = {"model": MODEL, "input": "Hello there", "instructions": "Be brief.", "max_output_tokens": 12,
        "temperature": 0}


@pytest.fixture(scope="module")
def url(api_server):
    return api_server.url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def sse_events(url: str, body: dict) -> list[dict]:
    """A streamed request's events (each `event: TYPE` + `data: {...}`, the type the same in both), parsed;
    validated against its event schema, numbered 0, 1, ... and with no [DONE]."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    raw = resp.read().decode()
    conn.close()
    return _parse(raw)


def _parse(raw: str) -> list[dict]:
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        ev = json.loads(lines[1][6:])
        assert ev["type"] == lines[0][7:]
        check(EVENTS[ev["type"]], ev)
        out.append(ev)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def _text(resp: dict) -> str:
    [item] = resp["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == []
    return part["text"]


def _same_but_ids_and_times(a: dict, b: dict) -> None:
    """The same Response but for its ids, times and the prompt tokens found cached (a repeat finds its prefix)."""
    def strip(r: dict) -> dict:
        r = {k: v for k, v in r.items() if k not in ("id", "created_at", "completed_at")}
        r["output"] = [{k: v for k, v in o.items() if k != "id"} for o in r["output"]]
        cached = r["usage"]["input_tokens_details"].pop("cached_tokens")
        assert 0 <= cached < r["usage"]["input_tokens"]
        return r
    assert strip(a) == strip(b)


# -- the answer's shape, whole and streamed ------------------------------------------------------------------
@pytest.mark.parametrize("max_out", [12, None])
def test_response_validates_whole_and_streamed(url, max_out):
    body = {**BASE, "max_output_tokens": max_out, "metadata": {"run": "a"}, "text": {"format": {"type": "text"}}}
    if max_out is None:  # (to the end: a stop where the plain template's next turn begins, EOS or the context)
        body["max_output_tokens"] = None
    status, whole, _ = post(url + "/v1/responses", body)
    assert status == 200, whole
    check("Response", whole)
    assert whole["id"].startswith("resp_") and whole["object"] == "response"
    assert whole["model"] == MODEL and whole["instructions"] == "Be brief." and whole["metadata"] == {"run": "a"}
    assert whole["error"] is None and whole["output"][0]["id"].startswith("msg_")
    u = whole["usage"]
    assert u["output_tokens"] > 0 and u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    if max_out is not None:
        assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
        assert whole["completed_at"] is None and u["output_tokens"] == max_out
        assert whole["output"][0]["status"] == "incomplete"

    events = sse_events(url, {**body, "stream": True})
    types = [e["type"] for e in events]
    end = f"response.{whole['status']}"
    assert types[:4] == HEAD and types[-4:] == [*TAIL, end]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    deltas = "".join(e["delta"] for e in events[4:-4])
    assert deltas == _text(whole) == events[-4]["text"] == events[-3]["part"]["text"]
    assert len({e["item_id"] for e in events if "item_id" in e}) == 1
    final = events[-1]["response"]
    assert final["output"][0] == events[-2]["item"]
    _same_but_ids_and_times(final, whole)


def test_openai_client_create_and_stream(url):
    c = client(url)
    whole = c.responses.create(model=MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=12,
                               temperature=0)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text and whole.usage.output_tokens == 12
    got, types, final = "", [], None
    for ev in c.responses.create(model=MODEL, input="Hello there", instructions="Be brief.", max_output_tokens=12,
                                 temperature=0, stream=True):
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            got += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert got == whole.output_text and final.output_text == whole.output_text
    assert types[:4] == HEAD and types[-1] == "response.incomplete"
    assert final.usage == whole.usage
    # the client's helper, which assembles the events (its final response: a completed one's alone)
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    done = c.responses.create(model=MODEL, input="A person, as JSON", max_output_tokens=60, temperature=0, text=fmt)
    assert done.status == "completed"
    with c.responses.stream(model=MODEL, input="A person, as JSON", max_output_tokens=60, temperature=0,
                            text=fmt) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        assert text == s.get_final_response().output_text == done.output_text


# -- the same prompt and text as chat -------------------------------------------------------------------------
CONVERSATIONS = [
    ({"input": "Tell me about cats"}, [{"role": "user", "content": "Tell me about cats"}]),
    ({"instructions": "You are terse.", "input": "Name a colour"},
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour"}]),
    ({"input": [{"role": "developer", "content": "Answer in French."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Good "},
                                                                {"type": "input_text", "text": "morning"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}]},
                {"role": "user", "content": "And goodbye?"}]},
     [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Good morning"},
      {"role": "assistant", "content": "Bonjour"}, {"role": "user", "content": "And goodbye?"}]),
]


@pytest.mark.parametrize("which", range(len(CONVERSATIONS)))
def test_greedy_text_and_prompt_equal_chat(url, which):
    req, messages = CONVERSATIONS[which]
    status, chat, _ = post(url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 16,
                                                          "temperature": 0})
    assert status == 200, chat
    status, resp, _ = post(url + "/v1/responses", {"model": MODEL, **req, "max_output_tokens": 16, "top_p": 0})
    assert status == 200, resp
    assert _text(resp) == chat["choices"][0]["message"]["content"] and _text(resp)
    assert resp["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert resp["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]
    assert resp["status"] == ("incomplete" if chat["choices"][0]["finish_reason"] == "length" else "completed")
    status, tok, _ = post(url + "/tokenize", {"model": MODEL, "messages": messages})
    assert tok["count"] == resp["usage"]["input_tokens"]


def test_seeded_sampling_repeats_and_equals_chat(url):
    body = {"model": MODEL, "input": "Once upon a time", "max_output_tokens": 10, "temperature": 0.9, "seed": 7}
    a, b = (post(url + "/v1/responses", body)[1] for _ in range(2))
    chat = post(url + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content":
                                                                             "Once upon a time"}],
                                               "max_tokens": 10, "temperature": 0.9, "seed": 7})[1]
    assert _text(a) == _text(b) == chat["choices"][0]["message"]["content"]


def test_text_format_json_schema_ends_completed(url):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    status, resp, _ = post(url + "/v1/responses", {**BASE, "input": "A person, as JSON", "max_output_tokens": 60,
                                                   "text": {"format": fmt}})
    assert status == 200, resp
    check("Response", resp)
    assert resp["status"] == "completed" and resp["incomplete_details"] is None and resp["completed_at"]
    jsonschema.validate(json.loads(_text(resp)), PERSON)
    assert resp["text"]["format"] == fmt
    events = sse_events(url, {**BASE, "input": "A person, as JSON", "max_output_tokens": 60, "stream": True,
                              "text": {"format": fmt}})
    assert events[-1]["type"] == "response.completed" and _text(events[-1]["response"]) == _text(resp)
    status, obj, _ = post(url + "/v1/responses", {**BASE, "text": {"format": {"type": "json_object"}}})
    assert status == 200 and _text(obj).startswith("{")


# -- refusals ---------------------------------------------------------------------------------------------------
BAD = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "name": "f g"}]}, "tools.0.name"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [{"type": "function", "name": "f"}]},
     "tool_choice"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": -1}, "max_output_tokens"),
    ({"max_output_tokens": 10**9}, "max_output_tokens"),
    ({"seed": -1}, "seed"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"input": []}, "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0.arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
    ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input.0.content"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "strin"}}}}, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"metadata": {"k": 1}}, "metadata.k"),
]


@pytest.mark.parametrize("patch,param", BAD, ids=[p for _, p in BAD])
def test_bad_fields_are_400_naming_the_field(url, patch, param):
    status, body, _ = post(url + "/v1/responses", {**BASE, **patch})
    assert status == 400, body
    err = assert_openai_error(body, "invalid_request_error")
    assert err["param"] == param and err["message"].startswith(param), err


def test_openai_client_gets_bad_request_and_not_found(url):
    c = client(url)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id" and "stores no responses" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="gpt-9", input="x")


def test_bad_requests_beside_a_live_stream_leave_it_whole(url):
    aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    kw = dict(model=MODEL, input="Tell me a long story", max_output_tokens=200, temperature=0)

    async def run(opened: asyncio.Event | None = None, gate: asyncio.Event | None = None) -> tuple[str, str]:
        text, status = "", ""
        async for ev in await aclient.responses.create(stream=True, **kw):
            if ev.type == "response.output_text.delta":
                text += ev.delta
                if gate is not None and opened is not None and not opened.is_set():
                    opened.set()  # the stream is live: hold it open until the bad requests are answered
                    await gate.wait()
            if ev.type in ("response.completed", "response.incomplete"):
                status = ev.response.status
        return text, status

    def bad() -> list[tuple[int, str]]:
        out = []
        for patch, _ in BAD:
            status, body, _ = post(url + "/v1/responses", {**BASE, **patch})
            out.append((status, body["error"]["param"]))
        return out

    async def main() -> tuple[tuple, tuple, list]:
        alone = await run()
        opened, gate = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(run(opened, gate))
        await opened.wait()
        refused = await asyncio.to_thread(bad)  # answered while the stream is open, its end not yet read
        gate.set()
        return alone, await task, refused

    alone, together, refused = asyncio.run(main())
    assert refused == [(400, p) for _, p in BAD]
    assert together == alone and alone[1] == "incomplete" and len(alone[0]) > 100
    status, health, _ = get(url + "/health")
    assert status == 200 and health["active"] == 0


# -- an error mid-stream ---------------------------------------------------------------------------------------
def test_an_error_mid_stream_is_an_error_event_then_response_failed():
    """The stream's own code (responses.stream) fed a sequence whose engine step fails after one piece of text:
    an `error` event with the error's code and message, then response.failed, each valid; nothing after."""
    from webtensor.serve.engine import Sampling
    from webtensor.serve.protocol import APIError, ResponsesRequest
    from webtensor.serve.responses import Reply, stream
    from webtensor.serve.scheduler import Event, Generation

    class Sched:
        cancelled: list = []

        def cancel(self, seq: Generation) -> None:
            self.cancelled.append(seq)

    async def go() -> tuple[str, Sched, Generation]:
        seq = Generation([1, 2, 3], 8, Sampling())
        seq.events.put_nowait(Event("Hello", tokens=1))
        seq.events.put_nowait(Event(error=APIError(500, "the device was lost", code="gpu_error")))
        sched = Sched()
        body = ResponsesRequest.model_validate({"model": MODEL, "input": "x"})
        resp = stream(sched, Reply(body, MODEL, seq))  # type: ignore[arg-type]
        raw = "".join([c if isinstance(c, str) else c.decode() async for c in resp.body_iterator])
        return raw, sched, seq

    raw, sched, seq = asyncio.run(go())
    events = _parse(raw)
    assert [e["type"] for e in events] == [*HEAD, "response.output_text.delta", "error", "response.failed"]
    err = events[-2]
    assert err["code"] == "gpu_error" and err["message"] == "the device was lost" and err["param"] is None
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error",
                                                               "message": "the device was lost"}
    assert sched.cancelled == [seq]  # the slot freed
