"""Connections and browsers, against a real server with every limit set low: connections that send
nothing (or half a request head, or half a body) are closed or answered 408 after --idle-timeout;
idle keep-alive connections are closed after --keep-alive and reused before; CORS preflights are
answered without the API key, and the key's 401 carries the CORS headers; --max-body; the key also
guards /tokenize and /detokenize."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, Server, assert_openai_error, get, post, request  # noqa: E402

KEY = "sk-conn"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def server():
    s = Server.cli("--device", "cpu", "--max-batch", "2", "--api-key", KEY, "--cors-origins", f"{ORIGIN},http://b.test",
                   "--idle-timeout", "1", "--keep-alive", "1", "--max-body", "65536")
    yield s
    s.stop()


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes `sock` (reads until EOF; anything it sent is ignored)."""
    t0 = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_a_connection_that_sends_nothing_is_closed(server):
    with _connect(server) as s:
        assert 0.5 < _closed_after(s) < 4


def test_half_a_request_head_is_closed(server):
    with _connect(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
        time.sleep(0.5)
        s.sendall(b"X-Slow: 1\r\n")  # trickling bytes does not extend the deadline
        assert _closed_after(s) < 4


def test_a_stalled_body_is_408(server):
    with _connect(server) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"model\":")
        t0 = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 408") and 0.5 < time.monotonic() - t0 < 4, data
        err = json.loads(data.split(b"\r\n\r\n", 1)[1])
        assert assert_openai_error(err, "invalid_request_error")["code"] == "request_timeout"


def test_keep_alive_reuses_then_closes(server):
    host, port = "127.0.0.1", server.port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["status"] == "ok"
    first = conn.sock
    conn.request("GET", "/health")  # at once: the same connection
    r = conn.getresponse()
    r.read()
    assert conn.sock is first
    assert _closed_after(conn.sock) < 3  # then idle: closed after --keep-alive (1 s)
    conn.close()


def test_cors_preflight_needs_no_key_and_errors_carry_cors(server):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    status, _, hdrs = request("OPTIONS", server.url + "/v1/chat/completions", headers=pre)
    assert status == 200 and hdrs["access-control-allow-origin"] == ORIGIN
    assert "POST" in hdrs["access-control-allow-methods"]
    assert "authorization" in hdrs["access-control-allow-headers"].lower()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, err, hdrs = post(server.url + "/v1/chat/completions", body, {"Origin": ORIGIN})
    assert status == 401 and hdrs["access-control-allow-origin"] == ORIGIN  # the page can read why
    assert_openai_error(err, "authentication_error")
    status, ok, hdrs = post(server.url + "/v1/chat/completions", body, {"Origin": ORIGIN, **AUTH})
    assert status == 200 and hdrs["access-control-allow-origin"] == ORIGIN and ok["choices"]
    status, _, hdrs = post(server.url + "/v1/chat/completions", body, {"Origin": "http://evil.example", **AUTH})
    assert status == 200 and "access-control-allow-origin" not in hdrs  # served, but not readable by that page
    status, _, hdrs = request("OPTIONS", server.url + "/v1/completions", headers={**pre, "Origin": "http://evil.example"})
    assert status == 400 and "access-control-allow-origin" not in hdrs


def test_max_body_and_the_key_on_tokenize(server):
    near = {"model": MODEL, "prompt": "a" * 60000}  # under 64 KiB: read, then refused for its length
    status, err, _ = post(server.url + "/v1/completions", near, AUTH)
    assert status == 400 and assert_openai_error(err, "invalid_request_error")["code"] == "context_length_exceeded"
    over = {"model": MODEL, "prompt": "a" * 70000}
    status, err, _ = post(server.url + "/v1/completions", over, AUTH)
    assert status == 413 and assert_openai_error(err, "invalid_request_error")["code"] == "request_too_large"
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert post(server.url + path, body)[0] == 401
        assert post(server.url + path, body, AUTH)[0] == 200
    assert get(server.url + "/health")[0] == 200 and get(server.url + "/openapi.json")[0] == 200  # open
