"""H200: the float16 variants of the matmul engine, in one run
(`source .gl/env.sh && python3 tools/h200/f16_engine.py`; $OUT/f16_engine.json, a line per case).

1. GPU time (timestamps, as matmul_bench) of each engine variant at GPT-2 124M's and xl's prefill
   products (M = 128, 1023; K x N of qkv, proj, fc, fc2, LM head; weights k-major): float32; float32
   activations x float16 weights (what GPT-2 in float16 runs: only the loads of B differ, u32 words
   or vec4<f16>); float16 x float16 with each (ENGINE_F16_WORDS, ENGINE_F16_MATH) of matmul_bench.F16,
   and the default one with its output written as halves (ENGINE_F16_OUT_WORDS off; the LM head's odd
   N always is) or as float32 (what writing halves costs).
2. Whole prefill, tok/s (`next(generate_ids(ids, 1))`, median of 3 after a warm-up, two rounds
   with the variants interleaved; random weights): 124M float32 and float16 at 128 and 1,023
   tokens, xl float16 and float32 at 1,023. GPT-2's products are float32 x float16, which only
   ENGINE_F16_WORDS changes (the float16 arithmetic switch applies to float16 x float16 alone),
   so the float16 models run words and vec.
   Plus the GPU time per kernel kind of each prompt pass (profiler.profile_prefill), and a summary
   of fp16 / fp32 ratios at the end.

`--tiny` (or F16_ENGINE_TINY=1): tiny shapes and model, GPU kernels forced on a CPU adapter, to
check the script on lavapipe (`CI=true PYTHONPATH=src python tools/h200/f16_engine.py --tiny`);
without $OUT the JSON goes to the current directory.
"""

import os
import sys

import numpy as np

import webtensor as wt
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu.profiler import profile_prefill
from webtensor.bench import matmul_bench as mb
from webtensor.models.gpt2 import GPT2
from webtensor.models.gpt2.config import GPT2Config
from webtensor.models.loader import random_arrays

sys.path.insert(0, os.path.dirname(__file__))
from harness import log, prefill_s, run_sweep  # noqa: E402

TINY = "--tiny" in sys.argv or os.environ.get("F16_ENGINE_TINY") == "1"
C124, CXL = (64, 160) if TINY else (768, 1600)
VOCAB = 500 if TINY else 50257
SHAPES = {f"{name}/{role}": (k, n) for name, c in (("124m", C124), ("xl", CXL))
          for role, (k, n) in (("qkv", (c, 3 * c)), ("proj", (c, c)), ("fc", (c, 4 * c)), ("fc2", (4 * c, c)),
                               ("head", (c, VOCAB)))}
MS = (9, 37) if TINY else (128, 1023)
F16_VARIANTS = ["engine", *(f"engine-{f}" for f in mb.F16)]  # float16 x float16: every (words, math)
MIXED_VARIANTS = {"words": "engine", "vec": "engine-vec-f32"}  # float32 x float16: the loads of B
REPS = 2 if TINY else 5


def kernel_times(dev, res):
    rng = np.random.default_rng(0)
    for shape, (K, N) in SHAPES.items():
        w32 = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        w = {d: wt.tensor(w32.astype(d), device=dev).T for d in ("float32", "float16")}  # k-major (K, N) views
        for M in MS:
            x = rng.standard_normal((M, K)).astype(np.float32)
            a = {d: wt.tensor(x.astype(d), device=dev) for d in ("float32", "float16")}
            # (label, matmul_bench variant, A dtype, B dtype, further switches, output dtype: None = linear's)
            cases = [("float32", "engine", "float32", "float32", {}, None)]
            cases += [(f"f32xf16/{name}", v, "float32", "float16", {}, None) for name, v in MIXED_VARIANTS.items()]
            cases += [(f"float16/{v.removeprefix('engine-') if v != 'engine' else 'words-f32'}", v, "float16",
                       "float16", {}, None) for v in F16_VARIANTS]
            cases += [("float16/words-f32/out-halves", "engine", "float16", "float16", {"ENGINE_F16_OUT_WORDS": False},
                       None), ("float16/words-f32/out-f32", "engine", "float16", "float16", {}, wt.float32)]
            for label, variant, ad, bd, extra, out_dtype in cases:
                fn = None if out_dtype is None else (lambda x, y, d=out_dtype: gops.matmul(x, y, d))
                with mb._switches({**mb._SWITCHES[variant], **extra}):
                    us, kernels = mb._time_case(dev, a[ad], w[bd], REPS, fn)
                key = f"kernel/{shape}/M={M}/{label}"
                res[key] = {"us": round(us, 2), "gflops": round(2 * M * N * K / us / 1e3, 1), "kernel": kernels}
                log(key, res[key])
            del a
        del w
        dev.ctx.empty_cache()


def model_prefill(dev, res):
    tiny = dict(n_embd=C124, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB)
    c124 = GPT2Config(**tiny) if TINY else GPT2Config()
    cxl = GPT2Config(**dict(tiny, n_embd=CXL, n_head=5)) if TINY else GPT2Config(n_embd=1600, n_layer=48, n_head=25)
    t_124, t_xl = ((16, 100), (100,)) if TINY else ((128, 1023), (1023,))
    # (name, config, dtypes, prompt lengths): one set of random weights per config, uploaded per dtype
    runs = [("124m", c124, ("float32", "float16"), t_124), ("xl", cxl, ("float16", "float32"), t_xl)]
    timestamps = "timestamp-query" in dev.ctx.api.features
    for name, cfg, dtypes, Ts in runs:
        arrays = random_arrays("gpt2", cfg)
        for dtype in dtypes:
            m = GPT2.from_arrays(cfg, arrays, dev, dtype, name=f"random-{name}")
            words = (True, False) if dtype == "float16" else (True,)
            for rnd in range(2):
                for wv in words:
                    dev.kernel_policy = dev.kernel_policy.replace(engine_f16_words=wv)
                    for T in Ts:
                        tps = T / prefill_s(m, T)
                        key = f"prefill/{name}/{dtype}/{'words' if wv else 'vec'}/T={T}"
                        res.setdefault(key, []).append(round(tps, 1))
                        log(key, "round", rnd, round(tps))
            for wv in words:
                dev.kernel_policy = dev.kernel_policy.replace(engine_f16_words=wv)
                if timestamps:
                    key = f"profile/{name}/{dtype}/{'words' if wv else 'vec'}/T={max(Ts)}"
                    p = res[key] = profile_prefill(m, max(Ts))
                    log(key, round(p["total_us"]), "us", [(k, round(us)) for k, us in p["kernels"][:6]])
            dev.kernel_policy = dev.kernel_policy.replace(engine_f16_words=True)
            del m
            dev.ctx.empty_cache()
        del arrays


def summary(res):
    """fp16 / fp32 time ratios of the default kernels (< 1: fp16 faster) and prefill tok/s."""
    log("== kernels: us float32 | f32xf16 words (vec) | float16 words-f32 (vec-chunked: the old one)")
    for shape in SHAPES:
        for M in MS:
            k = f"kernel/{shape}/M={M}"
            f32 = res[f"{k}/float32"]["us"]
            row = [res[f"{k}/{c}"]["us"] for c in ("f32xf16/words", "f32xf16/vec", "float16/words-f32",
                                                    "float16/vec-chunked")]
            log(f"{shape:>10} M={M:<5} {f32:9.1f} | {row[0]:9.1f} ({row[1]:9.1f}) x{row[0] / f32:.2f} | "
                f"{row[2]:9.1f} ({row[3]:9.1f}) x{row[2] / f32:.2f}")
    log("== prefill tok/s (rounds)")
    for k, v in res.items():
        if k.startswith("prefill/"):
            log(k, v)


def main():
    def summarize(dev, res):
        summary(res)
    run_sweep("f16_engine", TINY, [kernel_times, model_prefill, summarize])


if __name__ == "__main__":
    main()
