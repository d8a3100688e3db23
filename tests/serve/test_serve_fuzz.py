"""A property-based fuzz of the request schema against a real server (hypothesis): request bodies
whose every field is either plausible or junk of any JSON type (NaN, Infinity, lone surrogates,
huge integers, nested lists and objects, unknown fields), and bodies that are not JSON at all; chat's
with tools (plausible, odd or junk schemas, tool_choice of every kind, histories of calls and results).
Whatever comes in, the answer is never a 5xx: a 200 that validates against OpenAI's schemas (a
stream: chunks that validate, then [DONE], never an error event), or an OpenAI error body with a
4xx."""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from openai_schema import check  # noqa: E402
from serve_helpers import MODEL, assert_openai_error  # noqa: E402

TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)  # (surrogates included)
GOOD_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                   st.floats(allow_nan=True, allow_infinity=True), TEXT)
JUNK = st.recursive(SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=6)

# plausible values: mostly in range, now and then just past an edge
FLOATS = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 2.0, 5e-324, -0.0, 2.0000001, -1e-9]))
IDS = st.lists(st.integers(0, 4095) | st.sampled_from([-1, 4096]), max_size=6)
SAMPLING = {
    "temperature": FLOATS, "top_p": FLOATS, "top_k": st.integers(-2, 2**66), "seed": st.integers(-1, 2**64),
    "stop": st.one_of(GOOD_TEXT, st.lists(GOOD_TEXT, max_size=5)), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans(),
                                                         "include_obfuscation": st.booleans()}),
    "n": st.sampled_from([1, 2]), "presence_penalty": st.sampled_from([0, 0.5]), "logit_bias": st.just({}),
    "user": GOOD_TEXT, "ignore_eos": st.booleans(),
}
MAX_TOKENS = st.integers(-1, 6)  # (always set: the default runs up to 250 tokens)
PROMPT = st.one_of(GOOD_TEXT, IDS, st.lists(GOOD_TEXT, min_size=1, max_size=3), st.lists(IDS, min_size=1, max_size=3),
                   st.none())
COMPLETION_FIELDS = {**SAMPLING, "echo": st.booleans(), "logprobs": st.sampled_from([None, 0]),
                     "best_of": st.sampled_from([1, 2]), "suffix": GOOD_TEXT}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
     "content": st.one_of(GOOD_TEXT, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": GOOD_TEXT}),
                                              min_size=1, max_size=2))},
    optional={"name": GOOD_TEXT})
# tools: plausible, odd (a schema of another type, one llguidance cannot compile, a custom tool, a bad name) or junk
SCHEMA = st.one_of(st.none(), JUNK, st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]},
    {"type": "object"}, {"type": "string"}, {"type": "object", "properties": {"a": {"type": "strin"}}},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 2}, "b": {"type": "boolean"}}}]))
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "custom"]),
     "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "bad name"])},
                                       optional={"parameters": SCHEMA, "description": GOOD_TEXT,
                                                 "strict": st.booleans()})})
TOOL_CHOICE = st.one_of(st.sampled_from(["none", "auto", "required"]), st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "h"])})}))
CALL = st.fixed_dictionaries({"id": st.sampled_from(["c1", "abcdefghi"]), "type": st.just("function"),
                              "function": st.fixed_dictionaries({"name": st.just("f"),
                                                                 "arguments": st.sampled_from(['{"a": 1}', "{", ""])})})
TOOL_MESSAGES = st.one_of(
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | GOOD_TEXT,
                           "tool_calls": st.lists(CALL, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": GOOD_TEXT},
                          optional={"tool_call_id": st.sampled_from(["c1", "abcdefghi"])}))
CHAT_FIELDS = {**SAMPLING, "max_completion_tokens": MAX_TOKENS, "logprobs": st.booleans(),
               "top_logprobs": st.sampled_from([None, 0, 2]),
               "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
               "tools": st.lists(TOOL, max_size=3), "tool_choice": TOOL_CHOICE,
               "parallel_tool_calls": st.booleans(), "store": st.booleans(),
               "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "messages", "x"]),
                                                       st.booleans(), max_size=2),
               "metadata": st.dictionaries(GOOD_TEXT, GOOD_TEXT, max_size=2), "modalities": st.just(["text"])}


@st.composite
def bodies(draw: st.DrawFn, required: dict[str, st.SearchStrategy], fields: dict[str, st.SearchStrategy]) -> dict:
    """A plausible request (the required fields, some optional ones), then 0 to 3 of its fields
    (or an unknown one) replaced by junk of any JSON type, or dropped."""
    body = {k: draw(v) for k, v in required.items()}
    for k in draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True)):
        body[k] = draw(fields[k])
    for k in draw(st.lists(st.sampled_from(sorted({*body, *fields, "frobnicate"})), max_size=3, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            body.pop(k, None)
        else:
            body[k] = draw(JUNK)
    return body


COMPLETION = bodies({"model": st.just(MODEL), "prompt": PROMPT, "max_tokens": MAX_TOKENS}, COMPLETION_FIELDS)
CHAT = bodies({"model": st.just(MODEL), "messages": st.lists(MESSAGE | TOOL_MESSAGES, min_size=1, max_size=3),
               "max_tokens": MAX_TOKENS}, CHAT_FIELDS)


def _send(url: str, path: str, body: Any) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # (NaN, Infinity, \ud800 as JSON sends)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", path, raw, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def _check_answer(status: int, raw: bytes, streamed: bool, schema: str, chunk_schema: str) -> None:
    event(f"status {status}{' streamed' if streamed and status == 200 else ''}")  # (--hypothesis-show-statistics)
    assert status < 500, raw
    if status != 200:
        err = json.loads(raw)
        check("ErrorResponse", err)
        assert_openai_error(err, err["error"]["type"])
        return
    if not streamed:
        check(schema, json.loads(raw))
        return
    data = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert data[-1] == b"[DONE]", raw
    for d in data[:-1]:
        obj = json.loads(d)
        assert "error" not in obj, obj
        check(chunk_schema, obj)


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])


@FUZZ
@given(body=st.one_of(COMPLETION, COMPLETION, JUNK, st.binary(max_size=40)))
def test_completions_never_5xx(api_server, body):
    status, raw = _send(api_server.url, "/v1/completions", body)
    streamed = isinstance(body, dict) and body.get("stream") is True
    _check_answer(status, raw, streamed, "CreateCompletionResponse", "CreateCompletionResponse.streamed")


@FUZZ
@given(body=st.one_of(CHAT, CHAT, JUNK))
def test_chat_never_5xx(api_server, body):
    status, raw = _send(api_server.url, "/v1/chat/completions", body)
    streamed = isinstance(body, dict) and body.get("stream") is True
    _check_answer(status, raw, streamed, "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/tokenize", "/detokenize"]),
       body=st.one_of(bodies({}, {"prompt": GOOD_TEXT, "tokens": IDS, "messages": st.lists(MESSAGE, max_size=2),
                                  "model": st.just(MODEL), "return_token_strs": st.booleans()}), JUNK))
def test_tokenize_never_5xx(api_server, path, body):
    status, raw = _send(api_server.url, path, body)
    event(f"status {status}")
    assert status < 500, raw
    if status != 200:
        check("ErrorResponse", json.loads(raw))
