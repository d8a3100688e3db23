"""Serving from a paged KV pool (docs/design-kv.md): under block pressure sequences are preempted and recomputed, and
every one gives the tokens (log-probabilities to float32's rounding) of an uninterrupted run, greedy, seeded, with
penalties and with a grammar, on the CPU device and lavapipe; requests arriving together with one long system prompt
compute its blocks once; over HTTP, a request the pool can never hold gets a 400 naming max_tokens or the prompt, and
the others all finish, counted in /metrics and /health."""

from __future__ import annotations

import asyncio
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import webtensor as wt
from webtensor.serve.engine import ModelEngine, Sampling
from webtensor.serve.scheduler import Generation, Scheduler

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, Server, get, post  # noqa: E402


def _serve(engine: ModelEngine, jobs: list[dict], prefill_budget: int = 256, together: bool = True) -> tuple:
    """`jobs` (prompt, max_tokens, sampling[, grammar]) submitted at once (or one after another): each one's
    (tokens, log-probabilities, error), and the scheduler."""
    async def go() -> tuple:
        sched = Scheduler(engine, max_queue=64, prefill_chunk=64, prefill_budget=prefill_budget)
        sched.start()

        async def one(job: dict) -> tuple:
            g = Generation(job["prompt"], job["n"], job["sampling"], ignore_eos=True, grammar=job.get("grammar"))
            sched.submit(g)
            err = None
            async for ev in g.stream():
                err = err or ev.error
            return list(g.generated[:g.streamed]), [lp.logprob for lp in g.reported], err
        try:
            if together:
                out = await asyncio.gather(*(one(j) for j in jobs))
            else:
                out = [await one(j) for j in jobs]
            await asyncio.sleep(0.05)  # (the last releases)
        finally:
            await sched.stop()
        return out, sched
    return asyncio.run(go())


def same_runs(got: list, want: list) -> bool:
    """Each job's same tokens, its log-probabilities within float32's rounding (an absolute floor: they are O(1)): a
    recomputed sequence's prompt and generated tokens are read as prompt chunks, whose matrix products sum a row
    differently from the decode steps that first computed them (docs/design-kv.md, "Batch invariance"), and no
    error."""
    return len(got) == len(want) and all(
        g[0] == w[0] and len(g[1]) == len(w[1]) and bool(np.allclose(g[1], w[1], rtol=1e-5, atol=1e-5))
        and g[2] is None and w[2] is None for g, w in zip(got, want, strict=True))


def _jobs(rng: np.random.Generator, n: int, grammar: str | None) -> list[dict]:
    kinds = [Sampling(), Sampling(temperature=0.9, seed=11), Sampling(temperature=1.1, top_k=40, seed=5, logprobs=2),
             Sampling(presence_penalty=0.8, repetition_penalty=1.3), Sampling(temperature=0.7, seed=3)]
    jobs = [dict(prompt=[int(i) for i in rng.integers(1, 4000, int(rng.integers(5, 40)))], n=int(rng.integers(30, 60)),
                 sampling=kinds[i % len(kinds)]) for i in range(n)]
    if grammar is not None:
        jobs.append(dict(prompt=[int(i) for i in rng.integers(1, 4000, 9)], n=40, sampling=Sampling(constrained=True),
                         grammar=grammar))
    return jobs


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_preempted_sequences_give_an_uninterrupted_runs_tokens(dev_name, gpu):
    """Seven sequences of up to ~100 positions each through a pool of 8 blocks (128 positions): they are preempted
    and recomputed many times over; each one's tokens are those it gets alone in a pool that holds everyone (its
    log-probabilities to float32's rounding: `same_runs`), and the pool is whole again at the end."""
    from webtensor.serve import grammar as g

    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    model = wt.load_model(None, device=dev)
    jobs = _jobs(np.random.default_rng(3), 6, g.compile_format("json_object", None))
    roomy = ModelEngine(model, 8)
    try:
        want, _ = _serve(roomy, jobs, together=False)
    finally:
        roomy.close()
    tight = ModelEngine(model, 8, kv_blocks=8)
    try:
        got, sched = _serve(tight, jobs)
    finally:
        tight.close()
    assert same_runs(got, want)
    assert sched.metrics.preemptions._value.get() >= 3
    assert sched.kv is not None and sched.kv.used == 0 and sched.kv.free == 8


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_a_shared_system_prompt_is_computed_and_held_once(dev_name, gpu):
    """Eight requests arriving together whose prompts start with the same 100 tokens: the first computes its 6 full
    blocks, the others wait for them and share them (7 x 96 tokens found in the prefix cache); every answer is what
    it is without prefix caching."""
    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    model = wt.load_model(None, device=dev)
    rng = np.random.default_rng(5)
    system = [int(i) for i in rng.integers(1, 4000, 100)]
    jobs = [dict(prompt=system + [int(i) for i in rng.integers(1, 4000, 10)], n=4, sampling=Sampling())
            for _ in range(8)]
    cold = ModelEngine(model, 8, prefix_reuse=False)
    try:
        want, _ = _serve(cold, jobs)
    finally:
        cold.close()
    warm = ModelEngine(model, 8)
    try:
        got, sched = _serve(warm, jobs)
    finally:
        warm.close()
    assert same_runs(got, want)
    assert sched.metrics.prefix_hits._value.get() == 7 * 96
    assert sched.kv is not None and sched.kv.used == 0 and sched.kv.cached >= 6


@pytest.fixture(scope="module")
def tight_server():
    # the shipped model in float32 on the CPU: 5,120 bytes a position, 81,920 a block of 16: 640 KiB = 8 blocks
    s = Server.cli("--device", "cpu", "--max-batch", "6", "--kv-memory", "640KiB")
    yield s
    s.stop()


def _complete(url: str, prompt: str, n: int, **kw: object) -> tuple[int, dict]:
    status, body, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": n,
                                                     "temperature": 0, **kw})
    return status, body


def test_a_request_the_pool_can_never_hold_is_refused(tight_server):
    url = tight_server.url
    status, body = _complete(url, "It was", 200)  # (the context, 256 positions, would take it)
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "more than this server's pool holds (128 positions: --kv-memory)" in body["error"]["message"]
    status, body = _complete(url, "and " * 140, 4)
    assert status == 400 and body["error"]["param"] == "prompt" and "needs more KV cache" in body["error"]["message"]
    status, body, _ = post(url + "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                                                                                         "content": "Hello"}]})
    assert status == 200 and body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= 129
    health = tight_server.health()
    assert health["kv"]["blocks"] == 8 and health["kv"]["block_size"] == 16 and health["kv"]["dtype"] == "float32"


def test_under_block_pressure_every_request_finishes(tight_server):
    """Six streams needing ~70 positions each from a pool of 128: all finish with the text each gets alone, some
    of them preempted and recomputed on the way (/metrics)."""
    url = tight_server.url
    prompts = [f"Chapter {i}. It was a fine morning" + " and" * i for i in range(6)]
    alone = [_complete(url, p, 60, ignore_eos=True)[1]["choices"][0]["text"] for p in prompts]
    before = _metric(url, "webtensor:num_preemptions_total")
    with ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda p: _complete(url, p, 60, ignore_eos=True), prompts))
    assert [s for s, _ in results] == [200] * 6
    assert [b["choices"][0]["text"] for _, b in results] == alone
    assert _metric(url, "webtensor:num_preemptions_total") > before
    assert _metric(url, 'webtensor:kv_blocks{state="used"}') == 0
    health = tight_server.health()
    assert health["kv"]["used"] == 0 and health["kv"]["preemptions"] >= 1


def _metric(url: str, name: str) -> float:
    text = get(url + "/metrics")[1]
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_kv_memory_and_dtype_arguments(tmp_path):
    """--kv-memory: bytes or a share; a bad value is one line and exit status 2 before anything loads."""
    import subprocess

    from serve_helpers import ROOT

    env = {"PYTHONPATH": str(ROOT / "src")}
    for bad, msg in (("12 parsecs", "--kv-memory must be bytes"), ("0", "--kv-memory must be bytes"),
                     ("-1GiB", "--kv-memory must be bytes")):
        p = subprocess.run([sys.executable, "-m", "webtensor.cli", "serve", "--kv-memory", bad], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = subprocess.run([sys.executable, "-m", "webtensor.cli", "serve", "--device", "cpu", "--kv-memory", "1KiB",
                        "--port", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "hold no block of the KV cache" in p.stderr, p.stderr
    from webtensor.runtime.cache import parse_kv_memory

    assert parse_kv_memory("8GiB") == 8 * 2**30 and parse_kv_memory("512 MiB") == 512 * 2**20
    assert parse_kv_memory("4GB") == 4 * 10**9 and parse_kv_memory("0.5") == 0.5 and parse_kv_memory(1e9) == 10**9
    assert json.dumps(parse_kv_memory("1e6")) == "1000000"
