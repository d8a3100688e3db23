"""Serving a model whose every layer slides (the conformance suite's Mistral example, window 32, context 512:
tests/window_fixtures.py) from a pool smaller than one context (docs/design-kv.md, "Sliding windows"): the
scheduler gives back each sequence's blocks behind the window as it moves on, so

- a request whose prompt alone is longer than the pool, generating 300 tokens, is admitted and served with the
  tokens and log-probabilities of a pool that keeps every block (bit for bit: the same steps), greedy (steps
  followed on the device) and seeded, while the pool's high-water mark stays within one sequence's bound
  (`Scheduler.held_most`), on the CPU device and lavapipe;
- several such requests together are preempted and resumed and each gets its uninterrupted run's tokens;
- requests arriving together with one long system prompt compute its blocks once (later chunks' blocks, taken as
  the first request reaches them, are waited for as pending ones are);
- a prefix found in the cache (blocks a finished request gave back as it went, cached) is shared and given back in
  turn, and a request whose prefix's first blocks were evicted finds nothing past them: both get a cold run's tokens;
- over HTTP (the engine in its own process), such a request is accepted (a 400 only where a window does not fit the
  pool) and /health reports the window, what a sequence holds at most and the pool's high-water mark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from serve_helpers import Server, post  # noqa: E402
from test_serve_kv import _serve, same_runs  # noqa: E402
from window_fixtures import N_CTX, WINDOW, example_raw, load, prompt, write_checkpoint  # noqa: E402

import webtensor as wt  # noqa: E402
from webtensor.runtime.blocks import block_keys, window_blocks  # noqa: E402
from webtensor.serve.app import kv_positions  # noqa: E402
from webtensor.serve.engine import ModelEngine, Sampling  # noqa: E402

CHUNK = 64  # the scheduler's prompt chunk in these tests (`_serve`)


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("kvwin-serve") / "mistral",
                            example_raw(sliding_window=WINDOW, max_position_embeddings=N_CTX))


def _engine(model: object, max_batch: int, kv_blocks: int | None = None, keep_all: bool = False,
            **kw: object) -> ModelEngine:
    """An engine of prompt chunks of CHUNK over `kv_blocks` blocks; `keep_all`: its scheduler keeps every block of
    a sequence (nothing given back behind the window: as before), in a pool of max_batch whole contexts."""
    if keep_all:
        kv_blocks = max_batch * N_CTX // 16
    e = ModelEngine(model, max_batch, kv_blocks=kv_blocks, prefill_chunk=CHUNK, **kw)  # type: ignore[arg-type]
    if keep_all:
        e.kv_window = None
    return e


def _run(engine: ModelEngine, jobs: list[dict], together: bool = True) -> tuple:
    try:
        return _serve(engine, jobs, together=together)
    finally:
        engine.close()


@pytest.mark.parametrize("dev_name", ["cpu", "wgpu"])
def test_a_pool_smaller_than_a_context_serves_a_long_generation(mistral_dir, dev_name, gpu):
    dev = wt.Device.cpu() if dev_name == "cpu" else gpu
    m = load(mistral_dir, dev)
    jobs = [dict(prompt=prompt(200, seed=1), n=300, sampling=Sampling()),
            dict(prompt=prompt(90, seed=2), n=300, sampling=Sampling(temperature=0.8, seed=4, logprobs=1))]
    want, _ = _run(_engine(m, 2, keep_all=True), jobs, together=False)
    tight = _engine(m, 2, 9)  # 144 positions: less than either request's 500 / 390
    assert kv_positions(tight) is None  # (its window's blocks fit: any length is served)
    got, sched = _run(tight, jobs, together=False)
    assert got == want and all(len(g[0]) == 300 for g in got)  # (bit for bit: the same steps)
    bound = window_blocks(WINDOW, CHUNK, 16)
    assert sched.held_most(N_CTX) == bound == 7 and sched.kv is not None and sched.kv.peak <= bound
    assert sched.kv.used == 0 and sched.metrics.preemptions._value.get() == 0


def test_windowed_sequences_are_preempted_and_resumed(mistral_dir):
    """Eight requests of 10-token prompts, 150 new tokens each, together in 16 blocks: admitted at once (a block
    each), they outgrow the pool as they decode (each then holds its window's 2-3 blocks), so some are preempted and
    resumed (their tokens so far read again as a prompt, chunks past the window); each gets the tokens it gets alone
    with every block kept (log-probabilities to float32's rounding)."""
    m = load(mistral_dir, wt.Device.cpu())
    kinds = [Sampling(), Sampling(temperature=0.9, seed=11, logprobs=1), Sampling(presence_penalty=0.5),
             Sampling(temperature=0.7, seed=3)]
    jobs = [dict(prompt=prompt(10, seed=10 + i), n=150, sampling=kinds[i % 4]) for i in range(8)]
    want, _ = _run(_engine(m, 8, keep_all=True), jobs, together=False)
    got, sched = _run(_engine(m, 8, 16), jobs)
    assert same_runs(got, want)
    assert sched.metrics.preemptions._value.get() >= 1 and sched.kv is not None and sched.kv.used == 0


def test_a_shared_system_prompt_is_computed_once(mistral_dir):
    """Eight requests arriving together whose prompts start with the same 300 tokens: a windowed sequence takes its
    prompt's blocks chunk by chunk, and the others wait for the blocks the first has still to compute (promised at
    its admission) as for pending ones, then share them: 7 x 288 tokens found in the prefix cache, as with every
    block kept; the answers are a cold run's."""
    m = load(mistral_dir, wt.Device.cpu())
    system = prompt(300, seed=5)
    jobs = [dict(prompt=system + prompt(10, seed=20 + i), n=4, sampling=Sampling()) for i in range(8)]
    want, _ = _run(_engine(m, 8, keep_all=True, prefix_reuse=False), jobs)
    got, sched = _run(_engine(m, 8, 256), jobs)
    assert same_runs(got, want)
    assert sched.metrics.prefix_hits._value.get() == 7 * 288 and not sched._promised
    assert sched.kv is not None and sched.kv.used == 0


@pytest.mark.parametrize("blocks", [64, 10])
def test_a_prefix_given_back_as_it_went(mistral_dir, blocks):
    """A request generates 200 tokens past its 100-token prompt (giving back its blocks behind the window as it
    goes: cached under their keys), then a second continues the first's text. With room (64 blocks) the whole chain
    is still cached: the second shares it (prefix cache hits), takes only the blocks its window reads and gives them
    back in turn; in 10 blocks the first blocks were evicted while the first request ran, so the lookup finds no
    chain (never one with a hole). Either way the second gets a cold run's tokens and the pool ends empty."""
    m = load(mistral_dir, wt.Device.cpu())
    first = dict(prompt=prompt(100, seed=5), n=200, sampling=Sampling())
    a = _run(_engine(m, 1, keep_all=True, prefix_reuse=False), [first])[0][0][0]
    second = dict(prompt=first["prompt"] + a[:150] + prompt(10, seed=6), n=40, sampling=Sampling())
    want, _ = _run(_engine(m, 1, keep_all=True, prefix_reuse=False), [second])
    got, sched = _run(_engine(m, 1, blocks), [first, second], together=False)
    assert got[0][0] == a and same_runs(got[1:], want)
    assert sched.kv is not None and sched.kv.used == 0
    hits = sched.metrics.prefix_hits._value.get()
    if blocks == 64:  # (the blocks wholly inside the first request's context: 250 tokens, 15 blocks)
        assert hits == 15 * 16
        keys = block_keys(second["prompt"][:-1], 16)  # (and the second's own blocks after them)
        assert len(sched.kv.lookup(keys).blocks) == len(keys)
    else:
        assert hits == 0


def test_over_http_a_window_that_fits_the_pool_serves_any_length(mistral_dir):
    """`webtensor serve` (the engine in its own process) with a pool of 9 blocks: a 300-token completion after a
    prompt longer than the pool is served; /health says the window, what a sequence holds at most (7 blocks) and the
    high-water mark; with prompt chunks of 256 the window's blocks (19) do not fit: the pool's size is the limit
    again (a 400 naming max_tokens)."""
    s = Server.cli("--model", str(mistral_dir), "--device", "cpu", "--max-batch", "2", "--kv-memory", "144KiB",
                   "--ctx-size", str(N_CTX), "--prefill-chunk", str(CHUNK))
    try:
        text = " ".join(f"w{i}" for i in range(60))  # (about 190 tokens)
        status, body, _ = post(s.url + "/v1/completions", {"model": "mistral", "prompt": text, "max_tokens": 250,
                                                           "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] > 144 and body["usage"]["completion_tokens"] == 250
        kv = s.health()["kv"]
        assert kv["blocks"] == 9 and kv["window"] == WINDOW and kv["sequence_blocks"] == 7
        assert 3 <= kv["peak"] <= 7 and kv["used"] == 0
    finally:
        s.stop()
    s = Server.cli("--model", str(mistral_dir), "--device", "cpu", "--max-batch", "2", "--kv-memory", "144KiB",
                   "--ctx-size", str(N_CTX), "--prefill-chunk", "256")
    try:
        status, body, _ = post(s.url + "/v1/completions", {"model": "mistral", "prompt": "w1 w2", "max_tokens": 250,
                                                           "temperature": 0, "ignore_eos": True})
        assert status == 400 and body["error"]["param"] == "max_tokens" and "144 positions" in body["error"]["message"]
        assert s.health()["kv"]["sequence_blocks"] == 19
    finally:
        s.stop()
