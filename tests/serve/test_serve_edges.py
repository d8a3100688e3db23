"""The server's rough edges, each against a real server process (the shipped model, CPU device): a request body
that trickles in gets a 408 at --body-timeout while another connection streams on; completions log-probabilities
keyed losslessly (a part of a character as `bytes:\\xNN`, a special token by its text: no two tokens share a
key) with text offsets that follow the text; chat usage's cached prompt tokens; min_tokens over max_tokens
refused; and /openapi.json checked against the server's real answers: every route's answers have statuses the
document lists and bodies its schemas admit, and a request it calls invalid is refused."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, Server, get, post, request  # noqa: E402


@pytest.fixture(scope="module")
def url(api_server):
    return api_server.url


@pytest.fixture(scope="module")
def strict_server():
    """A server with a short body deadline and an API key (its 408 and 401 answers)."""
    s = Server.cli("--device", "cpu", "--max-batch", "4", "--body-timeout", "1.5", "--idle-timeout", "30",
                   "--api-key", "KEY", "--max-body", "4096")
    yield s
    s.stop()


KEY = {"Authorization": "Bearer KEY"}


def test_a_trickling_body_gets_408_and_others_go_on(strict_server):
    """One byte every 0.2 s is within the idle timeout (30 s) but not the body deadline (1.5 s): 408 after about
    1.5 s, the connection closed; a stream on another connection meanwhile finishes whole."""
    host, port = "127.0.0.1", strict_server.port
    body = json.dumps({"model": MODEL, "prompt": "x" * 40, "max_tokens": 2}).encode()
    out: dict = {}

    def streamer() -> None:
        out["stream"] = post(strict_server.url + "/v1/completions", {
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}, KEY)

    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    t0 = time.monotonic()
    other = threading.Thread(target=streamer)
    other.start()
    sock.settimeout(0.2)
    got = b""
    for b in body:
        try:
            sock.sendall(bytes([b]))
        except OSError:
            break
        try:
            got += sock.recv(4096)
        except TimeoutError:
            continue
        if b"\r\n\r\n" in got:
            break
    waited = time.monotonic() - t0
    sock.settimeout(5)
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except OSError:
        pass
    sock.close()
    other.join(60)
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert 1.4 <= waited <= 6, waited
    err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "request_timeout" and "--body-timeout" in err["message"]
    status, whole, _ = out["stream"]
    assert status == 200 and whole["usage"]["completion_tokens"] == 24


def test_logprob_keys_are_lossless_and_offsets_follow_the_text(url):
    """A prompt whose characters are split over tokens: each token's key is its text, or `bytes:` and its bytes
    where they are no whole character, so the k most likely are k distinct keys; a token's offset is where its
    text starts in the choice's text; the end-of-text token (id 0, special) keyed by its text."""
    text = "Fiancée — naïve 日本語 ✓ café"
    status, body, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": text, "echo": True, "logprobs": 5,
                                                     "max_tokens": 6, "temperature": 0})
    assert status == 200, body
    choice = body["choices"][0]
    lp, full = choice["logprobs"], choice["text"]
    ids = post(url + "/tokenize", {"prompt": full})[1]["tokens"]
    assert len(lp["tokens"]) >= len(ids) - 2
    partial = [t for t in lp["tokens"] if t.startswith("bytes:")]
    assert partial and all(len(t) == 6 + 4 * ((len(t) - 6) // 4) and t[6:8] == "\\x" for t in partial)
    for top in lp["top_logprobs"][len(ids) - 6:]:  # (the generated tokens': 5 keys or 6, all distinct ids)
        if top is not None:
            assert len(top) >= 5
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    for key, off in zip(lp["tokens"], offsets, strict=True):
        if not key.startswith("bytes:"):
            assert full.startswith(key, off), (key, off, full)
    assert offsets[-1] + len(lp["tokens"][-1]) <= len(full) or lp["tokens"][-1].startswith("bytes:")
    eos = post(url + "/v1/completions", {"model": MODEL, "prompt": [0, 464, 3797], "echo": True, "logprobs": 1,
                                         "max_tokens": 0})[1]["choices"][0]["logprobs"]
    assert eos["tokens"][0] == "<|endoftext|>" and eos["text_offset"][:2] == [0, 0]


def test_chat_usage_reports_cached_tokens(url):
    body = {"model": MODEL, "messages": [{"role": "system", "content": "You are a careful narrator. " * 8},
                                         {"role": "user", "content": "Begin."}], "max_tokens": 4, "temperature": 0}
    post(url + "/v1/chat/completions", body)
    again = post(url + "/v1/chat/completions", body)[1]["usage"]
    assert 0 < again["prompt_tokens_details"]["cached_tokens"] < again["prompt_tokens"]
    status, chunks, _ = request("POST", url + "/v1/chat/completions", json.dumps(
        {**body, "stream": True, "stream_options": {"include_usage": True}}).encode())
    usage = json.loads([line for line in chunks.split("\n") if line.startswith("data: {")][-1][6:])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_min_tokens_over_max_tokens_is_refused(url, path):
    head = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    status, body, _ = post(url + path, {"model": MODEL, **head, "max_tokens": 3, "min_tokens": 4})
    assert status == 400 and body["error"]["param"] == "min_tokens", body
    assert post(url + path, {"model": MODEL, **head, "max_tokens": 3, "min_tokens": 3})[0] == 200


# -- /openapi.json against the server's answers -----------------------------------------------------------------
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
# (method, path, body, headers, status): each route's answers, each documented status where a request makes it
CASES = [
    ("post", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3}, KEY, 200),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": -1}, KEY, 400),
    ("post", "/v1/completions", {"model": "gpt-9", "prompt": "Hi"}, KEY, 404),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "Hi"}, {}, 401),
    ("post", "/v1/completions", {"model": MODEL, "prompt": "Hi" * 3000}, KEY, 413),
    ("post", "/v1/chat/completions", CHAT, KEY, 200),
    ("post", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}}}],
        "tool_choice": "required", "max_tokens": 20}, KEY, 200),
    ("post", "/v1/chat/completions", {**CHAT, "messages": []}, KEY, 400),
    ("post", "/v1/chat/completions", {**CHAT, "model": "x"}, KEY, 404),
    ("post", "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 3}, KEY, 200),
    ("post", "/v1/responses", {"model": MODEL, "input": []}, KEY, 400),
    ("post", "/tokenize", {"prompt": "Hi"}, KEY, 200),
    ("post", "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}, KEY, 200),
    ("post", "/tokenize", {}, KEY, 400),
    ("post", "/tokenize", {"prompt": "Hi", "messages": []}, KEY, 400),
    ("post", "/tokenize", {"prompt": "Hi", "model": "x"}, KEY, 404),
    ("post", "/detokenize", {"tokens": [464, 3797]}, KEY, 200),
    ("post", "/detokenize", {"tokens": [-1]}, KEY, 400),
    ("get", "/v1/models", None, KEY, 200),
    ("get", "/v1/models", None, {}, 401),
    ("get", "/v1/models/{model_id}", None, KEY, 200),
    ("get", "/v1/models/{model_id}", None, KEY, 404),
    ("get", "/tokenizer_info", None, KEY, 200),
    ("get", "/health", None, {}, 200),
    ("get", "/metrics", None, {}, 200),
]


def test_openapi_describes_the_answers(strict_server):
    """Each case's answer: a status the document lists for the operation, a content type it lists for that
    status, and (JSON) a body its schema admits; the request bodies the server refused with 400 are ones the
    document's request schema refuses too where JSON Schema can tell (/tokenize's prompt-or-messages), and the
    ones it answered are ones the document admits. 408 is tested above (the body deadline)."""
    s = strict_server
    status, doc, _ = get(s.url + "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    text = json.dumps(doc)
    assert '"422"' not in text and '"ge"' not in text and '"le"' not in text
    registry = Registry().with_resource("urn:doc", Resource({"components": doc["components"]}, DRAFT202012))

    def validator(schema: dict) -> jsonschema.Draft202012Validator:
        schema = json.loads(json.dumps(schema).replace('"#/components/', '"urn:doc#/components/'))
        return jsonschema.Draft202012Validator(schema, registry=registry)

    seen = set()
    for method, path, body, headers, want in CASES:
        url = s.url + path.replace("{model_id}", MODEL if want != 404 else "nope")
        raw = None if body is None else json.dumps(body).encode()
        got, answer, hdrs = request(method.upper(), url, raw, headers)
        assert got == want, (path, body, answer)
        op = doc["paths"][path][method]
        assert str(got) in op["responses"], (path, got, list(op["responses"]))
        content = op["responses"][str(got)]["content"]
        ctype = hdrs.get("content-type", hdrs.get("Content-Type", "")).split(";")[0]
        assert ctype in content, (path, ctype, list(content))
        if ctype == "application/json":
            validator(content[ctype]["schema"]).validate(answer)
        if body is not None and "requestBody" in op:
            ok = validator(op["requestBody"]["content"]["application/json"]["schema"]).is_valid(body)
            if got == 200:
                assert ok, (path, body)
            elif path == "/tokenize" and got == 400:
                assert not ok, (path, body)
        seen.add((path, method, got))
    for path, ops in doc["paths"].items():  # every documented route was asked
        for method in ops:
            assert any(p == path and m == method for p, m, _ in seen), (path, method)
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    temperature = doc["components"]["schemas"]["ChatRequest"]["properties"]["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0.0, 2.0)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
        assert {"400", "404", "408", "413", "429"} <= set(doc["paths"][path]["post"]["responses"])
