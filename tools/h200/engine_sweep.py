"""H200: matmul_engine's workgroup tile and split-K choices against cuBLAS, on every product shape of
GPT-2 124M, GPT-2 xl and SmolLM2-135M at M = 64, 128, 1,024 and 4,096 rows, in one process
(`source .gl/env.sh && python3 tools/h200/engine_sweep.py`; $OUT/engine_sweep.json, a table last).

Each case is C (M, N) = A (M, K) @ W^T, A float32, W (N, K) float16 (the float16 models' products)
and, for the anchor, cuBLAS SGEMM on float32 W (torch's `F.linear`, TF32 off, CUDA events). The
engine runs with each workgroup tile (64 MT x 64 NT, MT, NT in 1, 2) and K cut in S = 1, 2, 4 or
8 slices (split-K, slices of at least 128), beside what the planner picks today (`default`). GPU
time from timestamp queries (`time_case`: ~20 ms of the case's own launches queued before the
timed ones, after a 0.3 s `keep_busy` per shape; no output read back). The table: per case
cuBLAS, the default, the best variant and their ratios.

`--tiny`: small shapes on any adapter (checks the script).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import webtensor as wt
from webtensor.backends.wgpu.profiler import keep_busy, time_commands
from webtensor.bench import matmul_bench as mb

TINY = "--tiny" in sys.argv
OUT = os.environ.get("OUT", ".")
MODELS = {"tiny": [(64, 96), (256, 64)]} if TINY else {
    "gpt2": [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257)],
    "gpt2-xl": [(1600, 4800), (1600, 1600), (1600, 6400), (6400, 1600), (1600, 50257)],
    "smollm2": [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)],
}
MS = (9, 40) if TINY else (64, 128, 1024, 4096)
TILES = [(1, 1), (1, 2), (2, 1), (2, 2)]
SPLITS = (1, 2, 4, 8)
REPS = 3 if TINY else 5


def log(*a: Any) -> None:
    print(*a, flush=True)


def cublas_us(M: int, K: int, N: int) -> float | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g) * 0.02
    for _ in range(3):
        F.linear(a, w)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        F.linear(a, w)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def time_case(dev: wt.Device, a: Any, w: Any) -> tuple[float, str]:
    """(median GPU µs of linear(a, w) under the current switches, the kernels that ran)."""
    ctx = dev.ctx
    wt.linear(a, w)
    dev.synchronize()  # (compiled)
    with ctx.lock, dev.dispatch_scope():
        wt.linear(a, w)
        cmds, names = ctx.take_pending()
    n = len(cmds)
    rough = sum(time_commands(ctx, cmds))
    ctx.enqueue(cmds * max(1, min(2000, math.ceil(20_000 / max(rough, 1.0)))))
    ctx.flush()
    per = time_commands(ctx, cmds * REPS)
    kernels = ",".join(sorted({x.split("-")[0] for x in names}))
    return statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(REPS)), kernels


def split_for(S: int, K: int) -> tuple[int, int] | None:
    """(S, ks) cutting K in S slices (ks a multiple of 16, at least 128), or None."""
    if S == 1:
        return 1, 0
    ks = math.ceil(math.ceil(K / S) / 16) * 16
    if ks < 128 or math.ceil(K / ks) < 2:
        return None
    return math.ceil(K / ks), ks


def main() -> None:
    t0 = time.perf_counter()
    dev = wt.Device.wgpu()
    res: dict[str, Any] = {"adapter": dev.describe(), "cases": []}
    rng = np.random.default_rng(0)
    base = {"gpu_style": True} if TINY else {}
    try:
        for model, shapes in MODELS.items():
            for K, N in shapes:
                w = wt.tensor((rng.standard_normal((N, K)) * 0.02).astype(np.float16), device=dev).T
                for M in MS:
                    if N > 40000 and M > 1024:
                        continue  # (the LM head runs over the last rows only)
                    a = wt.tensor(rng.standard_normal((M, K)).astype(np.float32), device=dev)
                    case: dict[str, Any] = {"model": model, "M": M, "K": K, "N": N, "cublas": cublas_us(M, K, N),
                                            "variants": {}}
                    keep_busy(dev)
                    with mb._switches(base, dev):
                        us, kern = time_case(dev, a, w)
                    case["variants"]["default"] = {"us": round(us, 1), "kernel": kern}
                    for tile in TILES:
                        for S in SPLITS:
                            sp = split_for(S, K)
                            if sp is None:
                                continue
                            if S > 1 and sp[0] * M * N * 4 > dev.ctx.max_binding_bytes:
                                continue
                            sw = dict(base, engine_tile=lambda m, n, p, t=tile: t,
                                      engine_split=lambda m, n, k, t, p, sp=sp: sp,
                                      ENGINE_SPLIT_K=True)
                            with mb._switches(sw, dev):
                                us, kern = time_case(dev, a, w)
                            case["variants"][f"{64 * tile[0]}x{64 * tile[1]}/S{sp[0]}"] = {"us": round(us, 1),
                                                                                       "kernel": kern}
                    best = min(case["variants"].items(), key=lambda kv: kv[1]["us"])
                    case["best"] = best[0]
                    res["cases"].append(case)
                    cb = case["cublas"]
                    log(f"{model:<8} M={M:<5} {K}x{N:<6} cublas {cb or 0:>8.1f}  default "
                        f"{case['variants']['default']['us']:>8.1f}  best {best[0]:<12} {best[1]['us']:>8.1f}")
                    del a
                del w
                dev.empty_cache()
    finally:
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(os.path.join(OUT, "engine_sweep.json"), "w") as f:
            json.dump(res, f, indent=1)
    log(f"{'model':<8} {'M':>5} {'K x N':<12} {'cuBLAS':>8} {'default':>8} {'best':>8} {'variant':<12} "
        f"{'cub/def':>8} {'cub/best':>8}")
    for c in res["cases"]:
        d, b = c["variants"]["default"]["us"], c["variants"][c["best"]]["us"]
        cb = c["cublas"] or float("nan")
        log(f"{c['model']:<8} {c['M']:>5} {c['K']}x{c['N']:<7} {cb:>8.1f} {d:>8.1f} {b:>8.1f} {c['best']:<12} "
            f"{cb / d:>8.2f} {cb / b:>8.2f}")
    log("done in", res["wall_s"], "s")


if __name__ == "__main__":
    main()
