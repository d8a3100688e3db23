"""H200: attention_flash2 (register-blocked flash-attention-2 prefill) against the older kernels
(`source .gl/env.sh && python3 tools/h200/flash.py`; $OUT/flash.json, a line per case on stderr).

1. GPU time (timestamps, each dispatch in its own pass, median of REPS) of one causal attention
   call, q / k / v column slices of a fused (T, 3, H, D) qkv (what GPT-2's prefill passes), T = S
   in 32, 64, 128, 512, 1,023 at H = 12 and 1,023 at H = 25 (xl), D = 64, float32 (the dtype
   GPT-2's attention runs in, float16 models included) and float16; variants:
   flash2 (attention_flash2, subgroup row max where the adapter allows), flash2-nosg (row max
   through workgroup memory), flash2-noqs (q from global memory even where the staged Q tile
   fits the adapter's workgroup memory), prefill (attention_prefill, the 4-threads-a-query kernel, forced at
   every T), old (the planner without attention_flash2: attention_prefill from 256 queries, below
   it the one-workgroup-a-(query, head) kernels). Each case also records flash2's norm-wise
   relative error against a float64 numpy reference (the subgroup variant is not run by the tests
   on lavapipe, whose subgroup size varies).
2. Whole prefill, tok/s (`next(generate_ids(ids, 1))`, median of 3 after a warm-up, two rounds with
   the variants interleaved) of random GPT-2 124M float16 at 128 and 1,023 tokens, old vs new
   (PREFILL_FLASH2 off / on), and the GPU time per kernel kind of each 1,023-token prompt pass.

`--tiny`: tiny shapes and model, GPU kernels forced on a CPU adapter, to check the script on
lavapipe (`CI=true PYTHONPATH=src python tools/h200/flash.py --tiny`); without $OUT the JSON goes
to the current directory.
"""

import json
import os
import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np

import webtensor as wt
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu.profiler import profile_prefill, time_commands
from webtensor.models.gpt2 import GPT2, GPT2Config

TINY = "--tiny" in sys.argv
REPS = 3 if TINY else 10
D = 64
CASES = [(64, 2), (100, 2)] if TINY else [(32, 12), (64, 12), (128, 12), (512, 12), (1023, 12), (1023, 25)]
VARIANTS = {
    "flash2": {"PREFILL_FLASH2": True, "FLASH2_MIN_QUERIES": 1},
    "flash2-nosg": {"PREFILL_FLASH2": True, "FLASH2_MIN_QUERIES": 1, "FLASH2_SUBGROUPS": False},
    "flash2-noqs": {"PREFILL_FLASH2": True, "FLASH2_MIN_QUERIES": 1, "FLASH2_STAGE_Q": False},
    "prefill": {"PREFILL_FLASH2": False, "PREFILL_MIN_QUERIES": 1},
    "old": {"PREFILL_FLASH2": False},
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


@contextmanager
def switches(values):
    saved = {n: getattr(gops, n) for n in values}
    try:
        for n, x in values.items():
            setattr(gops, n, x)
        yield
    finally:
        for n, x in saved.items():
            setattr(gops, n, x)


def attention_ref(q, k, v):
    """Causal attention in float64: q (T, H, D), k, v (S, H, D) -> (T, H, D)."""
    T, S = q.shape[0], k.shape[0]
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[2])
    s[:, np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T)] = -np.inf
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", e / e.sum(-1, keepdims=True), v.astype(np.float64))


def time_attention(dev, q, k, v):
    """(GPU µs of one causal attention call, median of REPS; the kernels it ran; its output)."""
    ctx = dev.ctx
    out = wt.attention(q, k, v, causal=True).numpy()  # compiles and warms up
    with ctx.lock, dev.dispatch_scope():
        wt.attention(q, k, v, causal=True)
        cmds, names = ctx.take_pending()  # timed below instead of submitted by the scope
    kernels = ",".join(sorted({n.split("-")[0] for n in names}))
    if "timestamp-query" not in ctx.api.features:
        t0 = time.perf_counter()
        for _ in range(REPS):
            wt.attention(q, k, v, causal=True).numpy()
        return (time.perf_counter() - t0) * 1e6 / REPS, kernels, out
    per = time_commands(ctx, cmds * REPS)
    n = len(cmds)
    return statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(REPS)), kernels, out


def kernel_times(dev, res):
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float16"):
        if dtype == "float16" and not dev.ctx.has_f16:
            continue
        for T, H in CASES:
            qkv = rng.standard_normal((T, 3, H, D)).astype(dtype)
            g = wt.tensor(qkv, device=dev)
            want = attention_ref(qkv[:, 0], qkv[:, 1], qkv[:, 2])
            for name, sw in VARIANTS.items():
                with switches(sw):
                    us, kernels, out = time_attention(dev, g[:, 0], g[:, 1], g[:, 2])
                err = float(np.linalg.norm(out.astype(np.float64) - want) / np.linalg.norm(want))
                flop = 4 * H * D * T * (T + 1) / 2  # causal: QK^T and PV over the visible half
                key = f"attention/{dtype}/T={T}/H={H}/{name}"
                res[key] = {"us": round(us, 1), "tflops": round(flop / us / 1e6, 3), "kernel": kernels,
                            "rel_err": float(f"{err:.3g}")}
                log(key, res[key])
            del g
        dev.ctx.empty_cache()


def prefill_s(m, T):
    ids = [(7 * i) % m.config.vocab_size for i in range(T)]

    def run():
        t0 = time.perf_counter()
        next(m.generate_ids(ids, 1, stop_at_eos=False))
        return time.perf_counter() - t0

    run()  # warm-up: compiles this variant's kernels
    return statistics.median(run() for _ in range(3))


def model_prefill(dev, res):
    cfg = GPT2Config(n_embd=128, n_layer=2, n_head=2, n_positions=128, vocab_size=512) if TINY else GPT2Config()
    Ts = (64, 100) if TINY else (128, 1023)
    m = GPT2.random(cfg, device=dev, dtype="float16" if dev.ctx.has_f16 else "float32")
    for rnd in range(2):
        for name, on in (("old", False), ("new", True)):
            with switches({"PREFILL_FLASH2": on}):
                for T in Ts:
                    key = f"prefill/124m/{name}/T={T}"
                    res.setdefault(key, []).append(round(T / prefill_s(m, T), 1))
                    log(key, "round", rnd, res[key][-1], "tok/s")
    if "timestamp-query" in dev.ctx.api.features:
        for name, on in (("old", False), ("new", True)):
            with switches({"PREFILL_FLASH2": on}):
                p = profile_prefill(m, max(Ts))
            key = f"profile/124m/{name}/T={max(Ts)}"
            res[key] = {"total_us": round(p["total_us"]), "kernels": [(k, round(us)) for k, us in p["kernels"]]}
            log(key, res[key]["total_us"], "us", res[key]["kernels"][:6])


def main():
    if TINY:
        gops.GPU_STYLE_ON_SOFTWARE = True  # the GPU kernels on lavapipe
    dev = wt.Device.wgpu()
    res = {"adapter": dev.describe(), "tiny": TINY, "subgroup_size": dev.ctx.subgroup_size,
           "flash2_subgroups": gops.flash2_subgroups(dev.ctx),
           "flash2_stage_q_f32_d64": gops.flash2_stage_q(dev.ctx, D, wt.float32),
           "workgroup_storage": dev.ctx.api.limits.get("max-compute-workgroup-storage-size"),
           "timing": "gpu-timestamps" if "timestamp-query" in dev.ctx.api.features else "wall-clock"}
    t0 = time.perf_counter()
    try:
        kernel_times(dev, res)
        log("kernels done in", round(time.perf_counter() - t0), "s")
        model_prefill(dev, res)
    finally:
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(os.path.join(os.environ.get("OUT", "."), "flash.json"), "w") as f:
            json.dump(res, f, indent=1)
    log("done in", res["wall_s"], "s")


if __name__ == "__main__":
    main()
