"""What the H200 sweep scripts share (tools/h200/*.py): a median timer, a prefill timer, and the
main of a sweep (device, result dict, JSON under $OUT, `--tiny` forcing GPU kernels on lavapipe), a decode timer."""

import json
import os
import statistics
import time

import webtensor as wt


def log(*a):
    print(*a, flush=True)


def median_time(fn, n=3):
    """Median seconds of fn() over n calls after one warm-up call (which compiles the kernels)."""
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prefill_s(m, T):
    """Seconds of a T-token prefill and its first token (`next(generate_ids(ids, 1))`)."""
    ids = [i % m.vocab_size for i in range(T)]
    return median_time(lambda: next(m.generate_ids(ids, 1, stop_at_eos=False)))


def decode_tok_s(m, n=128):
    """Greedy decode tokens/s of n tokens after an 8-token prompt (median of 3 after a warm-up run)."""
    ids = list(range(8))

    def run():
        g = m.generate_ids(ids, n + 1, stop_at_eos=False)
        next(g)
        t0 = time.perf_counter()
        for _ in g:
            pass
        return time.perf_counter() - t0

    run()
    return n / statistics.median(run() for _ in range(3))


def run_sweep(name, tiny, steps):
    """Run steps(dev, res) in order on the WebGPU device, then write res to $OUT/<name>.json (the
    current directory without $OUT), also when a step fails."""
    dev = wt.Device.wgpu()
    if tiny:
        dev.kernel_policy = dev.kernel_policy.replace(gpu_style=True)  # the GPU kernels on lavapipe
    res = {"adapter": dev.describe(), "tiny": tiny,
           "timing": "gpu-timestamps" if "timestamp-query" in dev.ctx.api.features else "wall-clock"}
    t0 = time.perf_counter()
    try:
        for step in steps:
            step(dev, res)
            log(step.__name__, "done in", round(time.perf_counter() - t0), "s")
    finally:
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(os.path.join(os.environ.get("OUT", "."), f"{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
    log("done in", res["wall_s"], "s")
