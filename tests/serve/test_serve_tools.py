"""Tool calling and reasoning through real server processes, with the clients agents use: random checkpoints of
each format's family (Qwen2.5 and Qwen3 hermes, Qwen3.5 XML, Llama 3.1 JSON, Mistral Nemo and Small 3.2) with their real
templates (tool_models.py), and the real SmolLM2 file (a template that knows no tools).

`tool_choice` "required" or a named function makes every answer a valid call even from random weights (its
arguments valid by the tool's schema: jsonschema), streamed as OpenAI streams calls; "auto" and "none" answer in
text; a history of calls and results goes back through the template; the official `openai` client (sync, async,
its stream helper), LangChain's `bind_tools` agent loop, instructor's TOOLS mode and litellm get valid calls;
the Responses API's function tools, function_call items and function_call_output inputs; reasoning
(`<think>`) as reasoning_content and a reasoning item; bad tools are 400s naming the field. Every response and
chunk validates against OpenAI's published schemas (reasoning_content: vLLM's extension, allowed by name)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import openai_schema  # noqa: E402
from serve_helpers import Server, assert_openai_error, post  # noqa: E402
from tool_models import make_family  # noqa: E402

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.hf  # (transformers writes the random checkpoints)

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 16},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
MODE = {"type": "object", "additionalProperties": False, "required": ["mode"],
        "properties": {"mode": {"enum": ["on", "off", "auto"]}, "force": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "set_mode", "description": "Switch the mode",
                                           "parameters": MODE}}]
SCHEMAS = {"get_weather": WEATHER, "set_mode": MODE}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
FAMILIES = ["qwen2.5", "llama3.1", "mistral-nemo", "mistral-small-3.2", "qwen3.5"]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def _check(name: str, obj: dict) -> None:
    """OpenAI's schema, with vLLM's reasoning_content allowed in a chat message and a delta."""
    openai_schema.check(name, _without_reasoning(obj))


def _without_reasoning(obj: dict) -> dict:
    obj = json.loads(json.dumps(obj))
    for c in obj.get("choices", []):
        for key in ("message", "delta"):
            if key in c and "reasoning_content" in c[key]:
                assert isinstance(c[key].pop("reasoning_content"), str)
    return obj


class Servers:
    """One server a family, started when first asked for (random checkpoints of 2 layers: seconds each)."""

    def __init__(self, root: Path):
        self.root, self.running = root, {}

    def __call__(self, family: str) -> Server:
        if family not in self.running:
            path = make_family(self.root / family, family, seed=1) if family != "smollm2" else _smollm2()
            self.running[family] = Server.cli("--model", str(path), "--device", "cpu", "--max-batch", "8",
                                              *(("--ctx-size", "1024") if family == "smollm2" else ()))
        return self.running[family]

    def stop(self) -> None:
        for s in self.running.values():
            s.stop()


def _smollm2() -> Path:
    from smollm2 import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("families"))
    yield s
    s.stop()


def _name(server: Server) -> str:
    return server.health()["model"]


def _client(server: Server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _sse(url: str, path: str, body: dict) -> list[dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    data = [line[6:].strip() for line in resp.read().split(b"\n") if line.startswith(b"data: ")]
    conn.close()
    if path == "/v1/responses":
        return [json.loads(d) for d in data]
    assert data[-1] == b"[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _assert_valid_calls(calls: list, names: set[str]) -> None:
    assert calls
    for c in calls:
        fn = c["function"] if isinstance(c, dict) else c.function.model_dump()
        assert fn["name"] in names
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])


def _joined_stream_calls(chunks: list[dict]) -> tuple[list[dict], str | None]:
    """The calls a chat stream carried (by index: the first piece's id and name, the arguments joined) and its
    finish reason; each piece as OpenAI sends them."""
    calls: dict[int, dict] = {}
    finish = None
    for c in chunks:
        if not c["choices"]:
            continue
        choice = c["choices"][0]
        for piece in choice["delta"].get("tool_calls") or []:
            i = piece["index"]
            if i not in calls:
                assert set(piece) == {"index", "id", "type", "function"} and piece["type"] == "function"
                assert piece["function"]["name"] and isinstance(piece["function"]["arguments"], str)
                calls[i] = {"id": piece["id"], "type": "function", "function": dict(piece["function"])}
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
                calls[i]["function"]["arguments"] += piece["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in sorted(calls)], finish


# -- forced calls -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_forced_calls_are_valid_whole_and_streamed(servers, family):
    """"required" and a named function, parallel_tool_calls false: one call, valid by its tool's schema, with
    finish_reason "tool_calls"; the same seed streamed gives the same call (id and name first, the arguments in
    pieces); Mistral's ids are the 9 letters and digits its template takes back."""
    server = servers(family)
    name = _name(server)
    for choice, names in (("required", {"get_weather", "set_mode"}),
                          ({"type": "function", "function": {"name": "set_mode"}}, {"set_mode"})):
        for seed in (0, 1):
            body = {"model": name, "messages": ASK, "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False,
                    "max_tokens": 96, "temperature": 1.0, "seed": seed, **NO_THINK}
            status, whole, _ = post(server.url + "/v1/chat/completions", body)
            assert status == 200, whole
            _check("CreateChatCompletionResponse", whole)
            choice0 = whole["choices"][0]
            assert choice0["finish_reason"] == "tool_calls" and choice0["message"]["content"] is None
            calls = choice0["message"]["tool_calls"]
            assert len(calls) == 1
            _assert_valid_calls(calls, names)
            if family.startswith("mistral"):
                assert len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum()
            chunks = _sse(server.url, "/v1/chat/completions", {**body, "stream": True})
            for c in chunks:
                _check("CreateChatCompletionStreamResponse", c)
            streamed, finish = _joined_stream_calls(chunks)
            assert finish == "tool_calls"
            assert [c["function"] for c in streamed] == [c["function"] for c in calls]


@pytest.mark.parametrize("family", ["qwen2.5", "mistral-nemo"])
def test_parallel_calls_are_each_valid(servers, family):
    server = servers(family)
    counts = []
    for seed in range(4):
        status, r, _ = post(server.url + "/v1/chat/completions", {
            "model": _name(server), "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200,
            "temperature": 1.0, "seed": seed})
        assert status == 200, r
        calls = r["choices"][0]["message"]["tool_calls"]
        _assert_valid_calls(calls, set(SCHEMAS))
        assert len({c["id"] for c in calls}) == len(calls)
        if r["choices"][0]["finish_reason"] == "tool_calls":
            counts.append(len(calls))
    assert counts and max(counts) >= 1


def test_auto_and_none_answer_in_text(servers):
    """A random model answers in text: "auto" gives it as content (no call in it), "none" too, the same tokens;
    "none" never calls, even where the answer is a call's opening tag."""
    server = servers("qwen2.5")
    name = _name(server)
    body = {"model": name, "messages": ASK, "tools": TOOLS, "max_tokens": 12, "temperature": 0}
    auto = post(server.url + "/v1/chat/completions", body)[1]
    none = post(server.url + "/v1/chat/completions", {**body, "tool_choice": "none"})[1]
    for r in (auto, none):
        _check("CreateChatCompletionResponse", r)
        assert "tool_calls" not in r["choices"][0]["message"]
    assert auto["choices"][0]["message"]["content"] == none["choices"][0]["message"]["content"]
    tag = post(server.url + "/tokenize", {"prompt": "<tool_call>", "add_special_tokens": False})[1]["tokens"]
    assert len(tag) == 1
    forced = post(server.url + "/v1/chat/completions", {**body, "tool_choice": "none", "max_tokens": 3,
                                                        "logit_bias": {str(tag[0]): 100}})[1]
    assert forced["choices"][0]["message"]["content"] == "<tool_call>" * 3
    assert forced["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("family", [*FAMILIES, "qwen3"])
def test_a_tool_history_goes_back_through_the_template(servers, family):
    """The answer's calls and the tools' results sent back: the conversation renders (Mistral's template checks
    the ids) and its prompt is the one /tokenize gives for the same messages and tools."""
    server = servers(family)
    name = _name(server)
    first = post(server.url + "/v1/chat/completions", {
        "model": name, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
        "max_tokens": 96, "temperature": 0.8, "seed": 3, **NO_THINK})[1]
    msg = first["choices"][0]["message"]
    history = [*ASK, msg, *({"role": "tool", "tool_call_id": c["id"], "content": '{"temperature": 21}'}
                            for c in msg["tool_calls"])]
    if not family.startswith("mistral"):  # (Mistral's templates take no user turn right after a tool result)
        history += [{"role": "user", "content": "And in Lyon?"}]
    status, second, _ = post(server.url + "/v1/chat/completions", {
        "model": name, "messages": history, "tools": TOOLS, "max_tokens": 8, "temperature": 0, **NO_THINK})
    assert status == 200, second
    _check("CreateChatCompletionResponse", second)
    tok = post(server.url + "/tokenize", {"messages": history, "tools": TOOLS, **NO_THINK})[1]
    assert second["usage"]["prompt_tokens"] == tok["count"]


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]}, "tools.0.function.parameters"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0.tool_calls"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f"}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_tools_are_400_naming_the_field(servers, extra, param):
    server = servers("qwen2.5")
    status, body, _ = post(server.url + "/v1/chat/completions", {
        "model": _name(server), "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra})
    assert status == 400, body
    openai_schema.check("ErrorResponse", body)
    assert assert_openai_error(body, "invalid_request_error")["param"] == param


# -- clients ----------------------------------------------------------------------------------------------------
def test_openai_client_sync_async_and_stream_helper(servers):
    server = servers("qwen2.5")
    name, client = _name(server), _client(server)
    args = dict(model=name, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                max_tokens=96, temperature=1.0)
    whole = client.chat.completions.create(**args, seed=5)
    assert whole.choices[0].finish_reason == "tool_calls"
    _assert_valid_calls(whole.choices[0].message.tool_calls, set(SCHEMAS))
    with client.chat.completions.stream(**args, seed=5) as stream:  # (the client's own accumulation of pieces)
        final = stream.get_final_completion()
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def main() -> list:
        async def one(seed: int) -> list:
            r = await aclient.chat.completions.create(**args, seed=seed)
            return r.choices[0].message.tool_calls
        return list(await asyncio.gather(*(one(s) for s in range(6))))
    for calls in asyncio.run(main()):
        _assert_valid_calls(calls, set(SCHEMAS))


def test_langchain_bind_tools_agent_loop(servers):
    """LangChain's agent loop: the model bound to tools calls one (forced), the tool runs, its ToolMessage goes
    back; three turns, then an answer in text (tool_choice none)."""
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    ran = []

    class WeatherArgs(BaseModel):
        city: str = Field(max_length=16)
        days: int = Field(ge=1, le=7)

    @tool(args_schema=WeatherArgs)
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for some days."""
        ran.append((city, days))
        return f"sunny in {city} for {days} days"

    server = servers("qwen2.5")
    chat = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=_name(server), max_tokens=120,
                         temperature=0.9, seed=2, max_retries=0)
    agent = chat.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    messages = [HumanMessage("Weather in Paris?")]
    for _ in range(3):
        ai = agent.invoke(messages)
        assert len(ai.tool_calls) >= 1 and ai.response_metadata["finish_reason"] == "tool_calls"
        messages.append(ai)
        for call in ai.tool_calls:
            assert call["name"] == "get_weather" and set(call["args"]) <= {"city", "days"}
            messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = chat.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert isinstance(final.content, str) and not final.tool_calls
    assert len(ran) >= 3


def test_instructor_tools_mode(servers):
    """instructor's TOOLS mode (its default for OpenAI): the response model's schema as a forced tool; the answer
    parses into the pydantic model."""
    instructor = pytest.importorskip("instructor")
    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(max_length=16)
        days: int = Field(ge=1, le=7)
        sunny: bool

    server = servers("qwen2.5")
    client = instructor.from_openai(_client(server), mode=instructor.Mode.TOOLS)
    got = client.chat.completions.create(model=_name(server), response_model=Forecast, messages=ASK, max_tokens=96,
                                         temperature=1.0, seed=4, max_retries=0)
    assert isinstance(got, Forecast) and 1 <= got.days <= 7 and len(got.city) <= 16


def test_litellm_tool_calls(servers):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # (no network)
    litellm = pytest.importorskip("litellm")
    server = servers("llama3.1")
    args = dict(model=f"openai/{_name(server)}", api_base=server.url + "/v1", api_key="unused", messages=ASK,
                tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=96, temperature=1.0, seed=6)
    r = litellm.completion(**args)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = [c.model_dump() for c in r.choices[0].message.tool_calls]
    _assert_valid_calls(calls, set(SCHEMAS))
    chunks = list(litellm.completion(**args, stream=True))
    built = litellm.stream_chunk_builder(chunks)
    assert [c.function.model_dump() for c in built.choices[0].message.tool_calls] == [c["function"] for c in calls]


# -- the Responses API ------------------------------------------------------------------------------------------
RESPONSE_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER}]


@pytest.mark.parametrize("family", ["qwen2.5", "mistral-nemo"])
def test_responses_function_calls(servers, family):
    """Function tools: function_call output items, whole and streamed (function_call_arguments.delta pieces,
    .done, the item), each event valid by OpenAI's schemas; the call and its output sent back as input items
    render as chat's history does."""
    server = servers(family)
    name = _name(server)
    body = {"model": name, "input": "Weather in Paris?", "tools": RESPONSE_TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_output_tokens": 96, "temperature": 1.0, "seed": 2}
    status, resp, _ = post(server.url + "/v1/responses", body)
    assert status == 200, resp
    openai_schema.check("Response", resp)
    assert resp["status"] == "completed"
    [call] = [o for o in resp["output"] if o["type"] == "function_call"]
    assert call["name"] == "get_weather" and call["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    events = _sse(server.url, "/v1/responses", {**body, "stream": True})
    schema = {"response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
              "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
              "response.output_item.added": "ResponseOutputItemAddedEvent",
              "response.output_item.done": "ResponseOutputItemDoneEvent", "response.created": "ResponseCreatedEvent",
              "response.in_progress": "ResponseInProgressEvent", "response.completed": "ResponseCompletedEvent"}
    for e in events:
        openai_schema.check(schema[e["type"]], e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    pieces = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert pieces == done["arguments"] == call["arguments"] and done["name"] == "get_weather"
    final = events[-1]["response"]["output"]
    assert [(o["name"], o["arguments"]) for o in final] == [(call["name"], call["arguments"])]
    history = [{"role": "user", "content": "Weather in Paris?"}, call,
               {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]
    status, after, _ = post(server.url + "/v1/responses", {"model": name, "input": history, "tools": RESPONSE_TOOLS,
                                                          "max_output_tokens": 4, "temperature": 0})
    assert status == 200, after
    openai_schema.check("Response", after)
    chat = post(server.url + "/v1/chat/completions", {
        "model": name, "tools": [{"type": "function", "function": {k: v for k, v in RESPONSE_TOOLS[0].items()
                                                                   if k != "type"}}],
        "messages": [history[0], {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["call_id"], "type": "function", "function": {"name": call["name"],
                                                                     "arguments": call["arguments"]}}]},
                     {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}],
        "max_tokens": 4, "temperature": 0})[1]
    assert after["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert after["output"][-1]["content"][0]["text"] == chat["choices"][0]["message"]["content"]


# -- reasoning --------------------------------------------------------------------------------------------------
def _token(server: Server, text: str) -> int:
    [i] = post(server.url + "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]
    return i


def test_reasoning_when_the_template_opens_the_thinking(servers):
    """Qwen3.5's template ends the prompt inside <think>: the answer up to </think> is reasoning_content, the rest
    content (whole, streamed, and as the Responses API's reasoning item); enable_thinking false closes the block
    in the prompt and the answer is all content."""
    server = servers("qwen3.5")
    name = _name(server)
    close = _token(server, "</think>")
    body = {"model": name, "messages": ASK, "max_tokens": 4, "temperature": 0, "logit_bias": {str(close): 100}}
    r = post(server.url + "/v1/chat/completions", body)[1]
    _check("CreateChatCompletionResponse", r)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"] == "" and msg["content"] == "</think>" * 3
    chunks = _sse(server.url, "/v1/chat/completions", {**body, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    free = {"model": name, "messages": ASK, "max_tokens": 10, "temperature": 0}
    thought = post(server.url + "/v1/chat/completions", free)[1]["choices"][0]["message"]
    prompt = post(server.url + "/tokenize", {"messages": ASK})[1]["tokens"]
    raw = post(server.url + "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 10,
                                               "temperature": 0})[1]["choices"][0]["text"]
    reasoning, closed, content = raw.partition("</think>")  # (the split, as the module's docstring has it)
    assert thought["reasoning_content"] == reasoning
    assert thought["content"] == (content.lstrip() or None if closed else None)
    streamed = _sse(server.url, "/v1/chat/completions", {**free, "stream": True})
    assert "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in streamed if c["choices"]) == \
        reasoning
    resp = post(server.url + "/v1/responses", {"model": name, "input": ASK[0]["content"], "max_output_tokens": 10,
                                               "temperature": 0})[1]
    openai_schema.check("Response", resp)
    assert resp["output"][0]["type"] == "reasoning" and resp["output"][0]["content"][0]["text"] == reasoning
    events = _sse(server.url, "/v1/responses", {"model": name, "input": ASK[0]["content"], "max_output_tokens": 10,
                                               "temperature": 0, "stream": True})
    for e in events:
        if e["type"].startswith("response.reasoning_text"):
            openai_schema.check("ResponseReasoningText" + ("DeltaEvent" if e["type"].endswith("delta")
                                                           else "DoneEvent"), e)
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == reasoning
    off = post(server.url + "/v1/chat/completions", {**free, **NO_THINK})[1]
    assert "reasoning_content" not in off["choices"][0]["message"]
    assert off["usage"]["prompt_tokens"] > post(server.url + "/v1/chat/completions", free)[1]["usage"]["prompt_tokens"]


def test_reasoning_the_model_opens(servers):
    """Qwen3's template leaves the thinking to the model: an answer that opens <think> is reasoning until
    </think> (here never: all reasoning); one that does not is content."""
    server = servers("qwen3")
    name = _name(server)
    think = _token(server, "<think>")
    r = post(server.url + "/v1/chat/completions", {"model": name, "messages": ASK, "max_tokens": 3, "temperature": 0,
                                                   "logit_bias": {str(think): 100}})[1]
    assert r["choices"][0]["message"]["reasoning_content"] == "<think>" * 2
    assert r["choices"][0]["message"]["content"] is None
    plain = post(server.url + "/v1/chat/completions", {"model": name, "messages": ASK, "max_tokens": 6,
                                                       "temperature": 0, **NO_THINK})[1]
    assert "reasoning_content" not in plain["choices"][0]["message"]


# -- the real SmolLM2 -------------------------------------------------------------------------------------------
def test_smollm2_calls_the_tool(servers):
    """SmolLM2's template knows no tools: the server describes them in a system message and reads hermes calls;
    forced, the real model calls get_weather with valid arguments, and asked in text it answers in text."""
    server = servers("smollm2")
    name = _name(server)
    r = post(server.url + "/v1/chat/completions", {
        "model": name, "messages": ASK, "tools": TOOLS[:1], "tool_choice": "required", "parallel_tool_calls": False,
        "max_tokens": 40, "temperature": 0})[1]
    _check("CreateChatCompletionResponse", r)
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    [call] = r["choices"][0]["message"]["tool_calls"]
    _assert_valid_calls([call], {"get_weather"})
    assert "Paris" in json.loads(call["function"]["arguments"])["city"]
    text = post(server.url + "/v1/chat/completions", {
        "model": name, "messages": [{"role": "user", "content": "Say hello."}], "tools": TOOLS[:1],
        "tool_choice": "none", "max_tokens": 3, "temperature": 0})[1]
    assert text["choices"][0]["message"]["content"] and "tool_calls" not in text["choices"][0]["message"]


def test_bad_tool_requests_leave_a_live_stream_whole(servers):
    """The bad tool requests of BAD, sent while a forced-call stream runs: each is its 400, and the stream ends
    with the very chunks' text and calls it gives alone."""
    import threading

    server = servers("qwen2.5")
    body = {"model": _name(server), "messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 96, "temperature": 1.0, "seed": 9, "stream": True}
    alone = _joined_stream_calls(_sse(server.url, "/v1/chat/completions", body))
    got: dict = {}
    t = threading.Thread(target=lambda: got.setdefault("calls", _joined_stream_calls(
        _sse(server.url, "/v1/chat/completions", body))))
    t.start()
    for extra, param in BAD:
        status, err, _ = post(server.url + "/v1/chat/completions", {
            "model": _name(server), "messages": ASK, "tools": TOOLS, "max_tokens": 4, **extra})
        assert status == 400 and err["error"]["param"] == param
    t.join(120)
    assert [c["function"] for c in got["calls"][0]] == [c["function"] for c in alone[0]] and got["calls"][1] == alone[1]
