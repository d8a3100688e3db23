"""Replicas behind vLLM's router (`vllm-router`, the deployment the README's "Beyond one device" documents): two
`webtensor serve` processes on the CPU device with the real SmolLM2 file, the router in front with its
`cache_aware` policy, retries and circuit breaker. Requests are spread across the replicas; requests that share a
long prefix go to one replica (where its prefix cache then finds them); a replica killed with requests in flight
loses none: the router sends them again to the other, and every answer is the one a replica gives alone (greedy
tokens are the same on every replica)."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from conftest import IN_CI  # noqa: E402
from serve_helpers import Server, free_port, get, post, wait_for  # noqa: E402
from smollm2 import FILE, smollm2_gguf  # noqa: E402

pytestmark = pytest.mark.slow

# Retries reach the other replica at once: a worker's circuit opens at its first failure (connection refused or
# reset), health checks every second take it out of the rotation; a request is tried up to 8 times, 0.1-2 s apart.
ROUTER_FLAGS = ["--policy", "cache_aware", "--cb-failure-threshold", "1", "--health-check-interval-secs", "1",
                "--health-failure-threshold", "1", "--retry-max-retries", "8", "--retry-initial-backoff-ms", "100",
                "--retry-max-backoff-ms", "2000", "--log-level", "warning"]
PROMPTS = ["The garden behind the old house", "Mathematics is the study of", "In the morning the baker",
           "A ship sailed into the harbour", "The library was quiet except for", "Rain fell on the mountain road"]


@pytest.fixture(scope="module")
def deployment():
    if importlib.util.find_spec("vllm_router") is None:
        why = "vllm-router is not installed (bash setup.sh --test installs it)"
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    model = str(smollm2_gguf())
    replicas = [Server.cli("--model", model, "--device", "cpu", "--max-batch", "2", "--keep-alive", "75",
                           own_group=True) for _ in range(2)]
    port, metrics_port = free_port(), free_port()
    router = Server(["-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--worker-urls",
                     *[r.url for r in replicas], *ROUTER_FLAGS], port)
    try:
        router.wait_ready(120)
        router.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
        yield router, replicas
    finally:
        router.stop()
        for r in replicas:
            r.stop()


def completion(url: str, prompt: str, max_tokens: int) -> tuple[int, Any]:
    status, body, _ = post(url + "/v1/completions", {"model": FILE, "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0, "ignore_eos": True})
    return status, body


def served(replica: Server) -> int:
    """Completions a replica answered 200, from its own /metrics."""
    text = get(replica.url + "/metrics")[1]
    return int(sum(float(v) for v in re.findall(
        r'webtensor:http_requests_total\{route="/v1/completions",status="200"\} (\S+)', text)))


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def send_staggered(url: str, prompts: list[str], max_tokens: int, gap: float = 0.3) -> tuple[list[Any], Any]:
    """The prompts sent `gap` seconds apart, all in flight together (as clients arrive); (results, join)."""
    results: list[Any] = [None] * len(prompts)

    def one(i: int) -> None:
        results[i] = completion(url, prompts[i], max_tokens)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
        time.sleep(gap)

    def join() -> list[Any]:
        for t in threads:
            t.join(300)
        return results
    return results, join


def test_requests_spread_across_replicas(deployment):
    router, replicas = deployment
    before = [served(r) for r in replicas]
    _, join = send_staggered(router.url, PROMPTS[:4], 32, gap=0.15)
    results = join()
    assert all(status == 200 for status, _ in results), results
    got = [served(r) - b for r, b in zip(replicas, before, strict=True)]
    assert sum(got) == 4 and min(got) >= 1, got
    alone = [completion(replicas[0].url, p, 32) for p in PROMPTS[:4]]
    assert [b["choices"][0]["text"] for _, b in results] == [b["choices"][0]["text"] for _, b in alone]


def test_shared_prefix_goes_to_one_replica(deployment):
    router, replicas = deployment
    system = ("You are a careful assistant. Answer in one short sentence, in plain English, without lists, and "
              "say so when you do not know. ")
    before = [served(r) for r in replicas]
    hits = [metric(get(r.url + "/metrics")[1], "webtensor:prefix_cache_hits_total") for r in replicas]
    _, join = send_staggered(router.url, [system + q for q in ("Why is the sky blue?", "What is a prime number?",
                                                               "Who wrote Hamlet?", "What is rain?")], 8)
    assert all(status == 200 for status, _ in join())
    got = [served(r) - b for r, b in zip(replicas, before, strict=True)]
    assert sorted(got) == [0, 4], got
    home = replicas[got.index(4)]
    assert metric(get(home.url + "/metrics")[1], "webtensor:prefix_cache_hits_total") > hits[got.index(4)]


def test_killed_replica_loses_no_request(deployment):
    router, replicas = deployment
    results, join = send_staggered(router.url, PROMPTS, 48, gap=0.2)

    def busy() -> Server | None:  # a replica with requests in flight
        for r in replicas:
            h = get(r.url + "/health")[1]
            if h["active"] + h["queued"] >= 2:
                return r
        return None
    assert wait_for(lambda: busy() is not None, 60, 0.05), [get(r.url + "/health")[1] for r in replicas]
    victim = busy()
    assert victim is not None
    victim.kill_group()
    survivor = next(r for r in replicas if r is not victim)
    results = join()
    assert all(r is not None and r[0] == 200 for r in results), results
    text = get(router.metrics_url)[1]
    assert metric(text, "vllm_router_retries_total") >= 1, text
    alone = [completion(survivor.url, p, 48) for p in PROMPTS]
    assert [b["choices"][0]["text"] for _, b in results] == [b["choices"][0]["text"] for _, b in alone]
    status, body = completion(router.url, "After the storm", 4)  # and the router goes on with one replica
    assert status == 200, body
