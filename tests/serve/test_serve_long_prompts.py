"""A long prompt arriving among running streams, through a real server (the CPU device, and lavapipe): it is read
in chunks of `--prefill-chunk` tokens, one replayed prompt-chunk graph each, at most `--prefill-budget` prompt tokens
a step beside the decoding streams, which keep getting tokens every step meanwhile; every request's tokens are
what it gets alone (`generate` with the same chunk size: bit for bit, float32); /health reports the chunk and
budget, which default to the device's policy."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from serve_helpers import MODEL, Server, post

import webtensor as wt
from webtensor.runtime.generate import generate

CHUNK = 16
LONG = 200


class Stream(threading.Thread):
    """A streamed greedy completion of token ids: its text and the arrival time of each event."""

    def __init__(self, url: str, prompt: list[int], max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.times: list[float] = []
        self.text = ""
        self.sent = 0.0

    def run(self) -> None:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = json.dumps({"model": MODEL, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True})
        self.sent = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        for line in resp:
            if line.startswith(b"data: {"):
                self.times.append(time.perf_counter())
                self.text += json.loads(line[6:])["choices"][0]["text"]
        conn.close()


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_a_long_prompt_among_streams(request, dev_name):
    model = wt.load_model(None, device=request.getfixturevalue("gpu") if dev_name == "wgpu" else "cpu")
    server = Server.cli("--device", "lavapipe" if dev_name == "wgpu" else "cpu", "--max-batch", "6",
                        "--prefill-chunk", str(CHUNK), "--prefill-budget", str(CHUNK))
    try:
        health = server.health()
        assert health["prefill_chunk"] == CHUNK and health["prefill_budget"] == CHUNK
        prompts = [[(37 * i + 11 * j) % 4000 for j in range(5 + 3 * i)] for i in range(4)]
        streams = [Stream(server.url, p, 230) for p in prompts]  # (decoding all the while the long one is read)
        for s in streams:
            s.start()
        assert all(_wait(lambda s=s: len(s.times) >= 8, 120) for s in streams)
        long_prompt = [(13 * j + 5) % 4000 for j in range(LONG)]
        long = Stream(server.url, long_prompt, 6)
        long.start()
        long.join(240)
        first = long.times[0]
        for s in streams:  # every stream got tokens while the long prompt was read (one a step: ~LONG / CHUNK)
            during = [t for t in s.times if long.sent < t < first]
            assert len(during) >= 3, (len(during), len(s.times))
        for s in streams:
            s.join(240)
        for p, s in zip([*prompts, long_prompt], [*streams, long], strict=True):
            r = model.runner(1, bucketed=False, prefill_chunk=CHUNK)
            want = list(generate(r, p, s.max_tokens, True, lambda row, pos: 0))
            assert s.text == model.decode(want), (len(p), s.text, model.decode(want))
    finally:
        server.stop()


def test_policy_defaults_reach_the_server():
    """Without the options, the chunk and budget are the device policy's (the CPU device's here)."""
    from webtensor.runtime.runner import CPU_PREFILL

    server = Server.cli("--device", "cpu", "--max-batch", "2")
    try:
        health = server.health()
        assert (health["prefill_chunk"], health["prefill_budget"]) == CPU_PREFILL
        status, body, _ = post(server.url + "/v1/completions", {"model": MODEL, "prompt": list(range(250)),
                                                                "max_tokens": 2, "temperature": 0})
        assert status == 200 and body["usage"]["prompt_tokens"] == 250
    finally:
        server.stop()


def _wait(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()
