"""H200: the matmul engine with and without split-K, in one run
(`source .gl/env.sh && python3 tools/h200/mm_fix.py`; $OUT/mm_fix.json, a line per case; < 60 s).

1. GPU time (timestamps, as matmul_bench) of the engine at M = 1, 128, 1023 (the GEMV off, so M = 1
   runs the engine too) and (K, N) = (768, 768), (768, 3072), (3072, 768), (768, 2304), weights
   k-major, float32 x float32 and float32 x float16 (GPT-2 in float16), split-K off and on (the
   default: split-K where ops.engine_split cuts K). (The run of 2026-12-03 also had the
   module-scope register form, since removed: x1.00 against the function-scope form.)
2. Whole prefill tok/s of random GPT-2 124M in float16 at 128 and 1,023 tokens
   (`next(generate_ids(ids, 1))`, median of 3 after a warm-up), without vs with split-K.

`--tiny` (or MM_FIX_TINY=1): tiny shapes and model, GPU kernels forced on a CPU adapter, to check
the script on lavapipe (`CI=true PYTHONPATH=src python tools/h200/mm_fix.py --tiny`); without $OUT
the JSON goes to the current directory.
"""

import os
import sys

import numpy as np

import webtensor as wt
from webtensor.bench import matmul_bench as mb
from webtensor.models.gpt2 import GPT2
from webtensor.models.gpt2.config import GPT2Config
from webtensor.models.loader import random_arrays

sys.path.insert(0, os.path.dirname(__file__))
from harness import log, prefill_s, run_sweep  # noqa: E402

TINY = "--tiny" in sys.argv or os.environ.get("MM_FIX_TINY") == "1"
MS = (1, 9, 37) if TINY else (1, 128, 1023)
SHAPES = [(64, 64), (64, 256), (256, 64)] if TINY else [(768, 768), (768, 3072), (3072, 768), (768, 2304)]
VARIANTS = {"new": {"ENGINE_SPLIT_K": False}, "new+split": {"ENGINE_SPLIT_K": True}}
REPS = 2 if TINY else 5


def kernel_times(dev, res):
    rng = np.random.default_rng(0)
    for K, N in SHAPES:
        w32 = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        w = {d: wt.tensor(w32.astype(d), device=dev).T for d in ("float32", "float16")}  # k-major (K, N) views
        for M in MS:
            a = wt.tensor(rng.standard_normal((M, K)).astype(np.float32), device=dev)
            for bd in ("float32", "float16"):
                for name, switches in VARIANTS.items():
                    with mb._switches({**mb._SWITCHES["engine"], **switches}):
                        us, kernels = mb._time_case(dev, a, w[bd], REPS)
                    key = f"kernel/M={M}/K={K}/N={N}/f32x{bd[5:]}/{name}"
                    res[key] = {"us": round(us, 2), "gflops": round(2 * M * N * K / us / 1e3, 1), "kernel": kernels}
                    log(key, res[key])
        del w
        dev.ctx.empty_cache()


def model_prefill(dev, res):
    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=500) if TINY else GPT2Config()
    m = GPT2.from_arrays(cfg, random_arrays("gpt2", cfg), dev, "float16", name="random-124m")
    for T in (16, 100) if TINY else (128, 1023):
        for name, switches in VARIANTS.items():
            with mb._switches(switches):
                tps = T / prefill_s(m, T)
            key = f"prefill/124m/float16/T={T}/{name}"
            res[key] = round(tps, 1)
            log(key, round(tps), "tok/s")


def summary(res):
    log("== kernels: us without split-K | with (x without)")
    for k, v in res.items():
        if k.startswith("kernel/") and k.endswith("/new"):
            base = k.removesuffix("/new")
            new, split = v["us"], res[f"{base}/new+split"]["us"]
            log(f"{base:>36} {new:9.1f} | {split:9.1f} (x{split / new:.2f})")


def main():
    def summarize(dev, res):
        summary(res)
    run_sweep("mm_fix", TINY, [kernel_times, model_prefill, summarize])


if __name__ == "__main__":
    main()
