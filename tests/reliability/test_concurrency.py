"""Two threads generating with one model on one device get the results they would get alone
(docs/threading.md describes the model: one lock per device serialises its queue; each generation
has its own KV cache)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from reliability_helpers import tiny_checkpoint, watchdog

import webtensor as wt
from webtensor.models.gpt2 import GPT2

JOBS = [  # (prompt, generate kwargs): greedy and seeded sampling, prompts of different lengths
    ([5, 17, 42, 99, 3], dict(max_new_tokens=14)),
    ([7, 300, 12], dict(max_new_tokens=14, temperature=0.9, top_k=40, seed=11)),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], dict(max_new_tokens=10, temperature=1.2, top_p=0.9, seed=5)),
    ([250], dict(max_new_tokens=14)),
]


@pytest.fixture(scope="module", params=["cpu", "wgpu"])
def model(request, gpu):
    dev = wt.Device.cpu() if request.param == "cpu" else gpu
    return GPT2.from_pretrained(tiny_checkpoint(), device=dev)


def _run_threads(fns, timeout=120):
    """Run each fn in its own thread, started together; return their results, re-raising any error."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)
    errors: list = []

    def worker(i):
        try:
            barrier.wait()
            results[i] = fns[i]()
        except BaseException as e:  # noqa: B036 - reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(fns))]
    with watchdog(timeout):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results


def test_two_threads_generate_like_one(model):
    want = [model.generate(p, **kw) for p, kw in JOBS]
    for a, b in [(0, 1), (2, 3), (1, 2), (0, 0)]:  # mixed sampling modes, and the same job twice at once
        def job(i):
            return lambda: [model.generate(JOBS[i][0], **JOBS[i][1]) for _ in range(3)]

        got_a, got_b = _run_threads([job(a), job(b)])
        assert got_a == [want[a]] * 3, (a, got_a, want[a])
        assert got_b == [want[b]] * 3, (b, got_b, want[b])
    if model.device.kind == "wgpu":
        assert model.device.stats()["pending"] == 0


def test_interleaved_generators_are_independent(model):
    """Two generations advanced alternately on one thread: each has its own cache and sampler."""
    want = [model.generate(p, **kw) for p, kw in JOBS[:2]]
    gens = [model.generate_ids(p, **kw) for p, kw in JOBS[:2]]
    got: list[list[int]] = [[], []]
    done = [False, False]
    while not all(done):
        for i, g in enumerate(gens):
            if not done[i]:
                try:
                    got[i].append(next(g))
                except StopIteration:
                    done[i] = True
    assert got == want


def test_threads_mixing_ops_and_scopes(gpu):
    """Op chains in dispatch scopes, with readbacks inside, from two threads at once, against the CPU."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 64)).astype(np.float32) for _ in range(2)]
    w = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    g, b = np.ones(64, np.float32), np.zeros(64, np.float32)

    def chain(x, dev):
        t = wt.tensor
        y = wt.layer_norm(t(x, device=dev) @ t(w, device=dev), t(g, device=dev), t(b, device=dev))
        return wt.softmax(wt.gelu(y) * 3.0).numpy()

    want = [chain(x, wt.Device.cpu()) for x in xs]

    def job(i):
        def run():
            outs = []
            for _ in range(25):
                with gpu.dispatch_scope():
                    outs.append(chain(xs[i], gpu))
            return outs
        return run

    for outs, ref in zip(_run_threads([job(0), job(1)]), want, strict=True):
        for o in outs:
            np.testing.assert_allclose(o, ref, rtol=1e-4, atol=1e-6)
    assert gpu.stats()["pending"] == 0
