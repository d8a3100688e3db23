"""Faults and limits, against a real server whose engine is slowed down (so requests can be caught in
flight) and fails any step that feeds the FAULT ids: overload -> 429, a disconnect frees its slot,
an engine fault fails only its step, the API key, SIGTERM drains."""

from __future__ import annotations

import http.client
import json
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_server import FAULT  # noqa: E402
from serve_helpers import MODEL, Server, assert_openai_error, get, post, wait_for  # noqa: E402

openai = pytest.importorskip("openai")

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server():
    s = Server.faulty(delay=0.02, max_batch=2, max_queue=1, api_key=KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def open_stream(url: str, max_tokens: int, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    """A streamed completion, left open for the caller to read or drop."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
    return conn.getresponse()


def data_lines(resp: http.client.HTTPResponse):
    for line in resp:
        if line.startswith(b"data: "):
            yield line[6:].strip()


def test_api_key_required(server):
    status, body, hdrs = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "x"})
    assert status == 401 and assert_openai_error(body, "authentication_error")
    status, body, _ = get(server.url + "/v1/models", {"Authorization": "Bearer wrong"})
    assert status == 401 and assert_openai_error(body, "authentication_error")
    assert get(server.url + "/v1/models", AUTH)[0] == 200
    assert get(server.url + "/health")[0] == 200  # open for load balancers


def test_disconnect_frees_the_slot_within_a_step(server):
    resp = open_stream(server.url, 200, AUTH)  # 200 steps of >= 20 ms: 4 s if left alone
    lines = data_lines(resp)
    next(lines), next(lines)
    assert server.health()["active"] == 1
    t0 = time.monotonic()
    resp.close()
    assert wait_for(lambda: server.health()["active"] == 0, timeout=1.0)
    assert time.monotonic() - t0 < 1.0


def test_full_queue_is_429_with_retry_after(server):
    held = [open_stream(server.url, 200, AUTH) for _ in range(3)]  # 2 slots + 1 queued
    try:
        assert wait_for(lambda: server.health()["queued"] == 1, timeout=5)
        status, body, hdrs = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "x"}, AUTH)
        assert status == 429 and int(hdrs["retry-after"]) >= 1
        assert_openai_error(body, "rate_limit_error")
    finally:
        for r in held:
            r.close()
    assert wait_for(lambda: server.health()["active"] == 0 and server.health()["queued"] == 0, timeout=5)


def test_engine_fault_fails_its_step_and_serving_goes_on(client):
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=MODEL, prompt=list(FAULT), max_tokens=4)
    assert e.value.status_code == 500 and "injected fault" in e.value.body["message"]
    with pytest.raises(openai.APIError, match="injected fault"):  # streamed: an error event
        for _ in client.completions.create(model=MODEL, prompt=list(FAULT), max_tokens=4, stream=True):
            pass
    ok = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop") and ok.usage.completion_tokens >= 1


def test_sigterm_drains_running_streams_then_exits():
    s = Server.faulty(delay=0.03, max_batch=2, max_queue=4)
    try:
        resp = open_stream(s.url, 40)
        lines = data_lines(resp)
        next(lines)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):  # no new connections while draining
            get(s.url + "/health")
        rest = list(lines)
        assert rest[-1] == b"[DONE]"
        chunks = [json.loads(x) for x in rest[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len(chunks) + 1 == 40  # every token arrived: one chunk each, the first read before SIGTERM
        assert s.proc.wait(15) == 0
    finally:
        s.stop()


def test_streams_still_running_when_the_grace_ends_get_an_error_and_done():
    s = Server.faulty(delay=0.03, max_batch=2, max_queue=4, grace=1.0)
    try:
        resps = [open_stream(s.url, 200) for _ in range(2)]  # 200 steps of >= 30 ms: 6 s if left alone
        streams = [data_lines(r) for r in resps]
        for lines in streams:
            next(lines)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        for lines in streams:
            rest = list(lines)
            assert rest[-1] == b"[DONE]"
            *tokens, last = [json.loads(x) for x in rest[:-1]]
            assert all(c["choices"][0]["finish_reason"] is None for c in tokens) and len(tokens) < 150
            err = assert_openai_error(last, "service_unavailable")
            assert err["code"] == "shutdown" and "grace period" in err["message"]
        assert time.monotonic() - t0 < 4  # cut at the grace's end (1 s), not run to their end (6 s)
        assert s.proc.wait(15) == 0
    finally:
        s.stop()


def test_a_burst_is_admitted_up_to_max_batch_plus_max_queue():
    """20 requests at once on --max-batch 1 --max-queue 1: exactly 2 admitted (the one running,
    the one queued), 18 refused at once with 429; the 2 run whole."""
    import threading

    s = Server.faulty(delay=0.02, max_batch=1, max_queue=1)
    try:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 20, "temperature": 0, "ignore_eos": True}
        results: list = [None] * 20
        gate = threading.Barrier(20)

        def one(i: int) -> None:
            gate.wait()
            results[i] = post(s.url + "/v1/completions", body)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(r[0] for r in results)
        assert statuses == [200] * 2 + [429] * 18, statuses
        ok = [r[1] for r in results if r[0] == 200]
        assert all(o["usage"]["completion_tokens"] == 20 and o["choices"][0]["finish_reason"] == "length" for o in ok)
        assert ok[0]["choices"][0]["text"] == ok[1]["choices"][0]["text"]
        for r in results:
            if r[0] == 429:
                assert assert_openai_error(r[1], "rate_limit_error")["code"] == "queue_full"
    finally:
        s.stop()
