"""Prefix caching: a prompt whose first full KV blocks (16 tokens each) hold what an earlier sequence computed shares
those blocks and reads on from there, and gives the tokens of a cold run and its log-probabilities to float32's
rounding (the CPU device and WebGPU on lavapipe, float32, the batched engine: greedy rows followed on the device, and
sampled rows with log-probabilities: a prompt's chunks are matrix products, whose sums for a row depend on the chunk's
rows, and a reused prefix's keys and values were computed in other chunks, or by decode steps, than a cold run's);
a conversation's next turn finds its earlier turns; /metrics counts the tokens looked up and reused."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

import webtensor as wt
from webtensor.runtime.cache import BLOCK_SIZE
from webtensor.serve.engine import ModelEngine, Sampling
from webtensor.serve.scheduler import Generation, Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, Server, get, post  # noqa: E402


def _run(engine: ModelEngine, jobs: list[tuple[list[int], Sampling, int]]) -> tuple[list, Scheduler]:
    """Each job (prompt, sampling, max_tokens) in turn: (its tokens, its log-probabilities)."""
    async def go() -> list:
        sched = Scheduler(engine, max_queue=8, prefill_chunk=64, prefill_budget=256)
        sched.start()
        out = []
        try:
            for prompt, sampling, n in jobs:
                g = Generation(prompt, n, sampling, ignore_eos=True)
                sched.submit(g)
                async for ev in g.stream():
                    assert ev.error is None, ev.error
                out.append((list(g.generated), [lp.logprob for lp in g.reported], g.reused))
                await asyncio.sleep(0.01)  # (its slot released)
        finally:
            await sched.stop()
        return out, sched
    return asyncio.run(go())


def same_run(got: tuple, want: tuple) -> bool:
    """The same tokens, and log-probabilities within float32's rounding (an absolute floor: they are O(1))."""
    return got[0] == want[0] and len(got[1]) == len(want[1]) and \
        bool(np.allclose(got[1], want[1], rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_reused_prefix_gives_the_cold_runs_tokens(dev_name, gpu):
    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    model = wt.load_model(None, device=dev)
    rng = np.random.default_rng(7)
    shared = [int(i) for i in rng.integers(1, 4000, 100)]  # (100: not a chunk boundary)
    a = shared + [int(i) for i in rng.integers(1, 4000, 30)]
    b = shared + [int(i) for i in rng.integers(1, 4000, 41)]
    greedy, sampled = Sampling(), Sampling(temperature=0.9, seed=3, logprobs=2)
    cold = ModelEngine(model, 2, prefix_reuse=False)
    try:
        (want_b, want_b2), _ = _run(cold, [(b, greedy, 12), (b, sampled, 12)])
    finally:
        cold.close()
    turn2 = b + want_b2[0][:-1] + [int(i) for i in rng.integers(1, 4000, 9)]  # a conversation's next turn
    (want_t2,), _ = _run(cold := ModelEngine(model, 2, prefix_reuse=False), [(turn2, greedy, 8)])
    cold.close()
    warm = ModelEngine(model, 2)
    try:
        out, sched = _run(warm, [(a, greedy, 5), (b, greedy, 12), (b, sampled, 12), (turn2, greedy, 8)])
    finally:
        warm.close()
    _, got_b, got_b2, got_t2 = out

    def blocks(n: int) -> int:  # the tokens of the whole blocks among n
        return n // BLOCK_SIZE * BLOCK_SIZE
    assert got_b[2] == blocks(100) and same_run(got_b[:2], want_b[:2])  # a's prompt shared 100 tokens with b's
    # b's own blocks: all but its last token; then b's prompt and answer but the last one
    assert got_b2[2] == blocks(len(b) - 1) and same_run(got_b2[:2], want_b2[:2])
    assert got_t2[2] == blocks(len(b) + 11) and same_run(got_t2[:2], want_t2[:2])
    hits = sched.metrics.prefix_hits._value.get()
    assert hits == blocks(100) + blocks(len(b) - 1) + blocks(len(b) + 11)
    assert sched.metrics.prefix_queries._value.get() == len(a) + 2 * len(b) + len(turn2)


def _metric(url: str, name: str) -> float:
    text = get(url + "/metrics")[1]
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_server_counts_reused_tokens_and_can_turn_it_off(api_server):
    """Over HTTP (the engine in its own process): a second request sharing a system prompt reuses it (the
    same text as without reuse), counted in vLLM's names; `--no-prefix-reuse` computes every prompt whole."""
    system = "You are a careful assistant. " * 20
    off = Server.cli("--device", "cpu", "--max-batch", "2", "--no-prefix-reuse")
    want: list[str] = []
    try:
        for url in (api_server.url, off.url):
            hits0 = _metric(url, "webtensor:prefix_cache_hits_total")
            texts = []
            for q in ("What is the time?", "Where is the sea?"):
                status, body, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": system + q,
                                                                 "max_tokens": 8, "temperature": 0})
                assert status == 200
                texts.append(body["choices"][0]["text"])
            gained = _metric(url, "webtensor:prefix_cache_hits_total") - hits0
            if url == off.url:
                assert gained == 0 and texts == want
            else:
                assert gained >= 100
                want[:] = texts
    finally:
        off.stop()
