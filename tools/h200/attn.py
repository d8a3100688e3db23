"""H200: prefill attention kernels beside torch's SDPA, and shader runtime checks on / off, in one
process (`source .gl/env.sh && python3 tools/h200/attn.py`; $OUT/attn.json; a table last).

1. Attention, causal, on the issue's shapes (T x H / KVH x D: 1,023 x 12 x 64, 4,096 x 12 x 64,
   SmolLM2's 4,096 and 8,192 x 9 / 3 x 64, GPT-2 xl's 1,023 x 25 x 64, a 128-token prompt), float32
   and float16: torch's SDPA (CUDA events; TF32 off; its fused kernels) beside webtensor's
   attention_tiled (tiles of 64 or 32 keys, row maxima by subgroup shuffles or through workgroup
   memory), attention_prefill (the kernel before) and, for 128 tokens, attention.wgsl. GPU time
   from timestamp queries, the timed launches queued right behind ~50 ms of the same launches (no
   idle gap: see tools/h200/slowdown.py). Every variant's result is checked against float64 torch.
2. The same kernels and three matmul_engine products compiled with the shader compiler's runtime
   checks (`Device.wgpu(shader_checks=True)`) beside without (the default).

`--tiny`: small shapes, GPU kernels forced on a CPU adapter, no torch CUDA (checks the script).
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
from webtensor.backends.wgpu.profiler import time_commands
from webtensor.bench import matmul_bench as mb

TINY = "--tiny" in sys.argv
OUT = os.environ.get("OUT", ".")
SHAPES = ([(70, 2, 2, 64), (130, 3, 1, 64)] if TINY else
          [(1023, 12, 12, 64), (4096, 12, 12, 64), (4096, 9, 3, 64), (8192, 9, 3, 64), (1023, 25, 25, 64),
           (128, 12, 12, 64)])
REPS = 3 if TINY else 10
WARM_US = 5_000 if TINY else 50_000
# name -> ops switches
VARIANTS: dict[str, dict[str, Any]] = {
    "tiled64-sg": {"TILED_KEYS": (64,), "sg": True},
    "tiled64": {"TILED_KEYS": (64,), "sg": False},
    "tiled32-sg": {"TILED_KEYS": (32,), "sg": True},
    "tiled32": {"TILED_KEYS": (32,), "sg": False},
    "prefill": {"TILED": False, "PREFILL_MIN_QUERIES": 1},
    "attention": {"TILED": False, "PREFILL": False, "FLASH_MIN_QUERIES": 1 << 30},
}


def log(*a: Any) -> None:
    print(*a, flush=True)


def gpu_us(dev: wt.Device, fn: Any) -> tuple[float, str]:
    """(median GPU µs of fn()'s launches, timed right behind ~WARM_US of the same launches; the
    kernel variants that ran)."""
    ctx = dev.ctx
    fn().numpy()  # compile, warm up
    with ctx.lock, dev.dispatch_scope():
        fn()
        cmds, names = ctx.take_pending()
    per = time_commands(ctx, cmds)
    n_warm = max(1, min(2000, math.ceil(WARM_US / max(sum(per), 1.0))))
    ctx.enqueue(cmds * n_warm)
    ctx.flush()
    per = time_commands(ctx, cmds * REPS)
    n = len(cmds)
    return statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(REPS)), ",".join(names)


def torch_sdpa(shapes: list[tuple[int, int, int, int]], res: dict[str, Any]) -> None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for T, H, KVH, D in shapes:
        for dtype in ("float32", "float16"):
            g = torch.Generator(device="cuda").manual_seed(0)
            td = getattr(torch, dtype)
            q = torch.randn(1, H, T, D, device="cuda", dtype=td, generator=g)
            k = torch.randn(1, KVH, T, D, device="cuda", dtype=td, generator=g)
            v = torch.randn(1, KVH, T, D, device="cuda", dtype=td, generator=g)

            def run(q: Any = q, k: Any = k, v: Any = v, gqa: bool = KVH != H) -> Any:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            for _ in range(3):
                run()
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1e3)
            key = f"attn/{T}x{H}/{KVH}x{D}/{dtype}/torch-sdpa"
            res[key] = {"us": round(statistics.median(times), 1)}
            log(key, res[key])


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 causal attention (T, H, D), query head h on KV head h // G (torch on the GPU if there)."""
    G = q.shape[1] // k.shape[1]
    try:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        tq, tk, tv = (torch.from_numpy(x.astype(np.float64)).to(dev).transpose(0, 1) for x in (q, k, v))
        tk, tv = tk.repeat_interleave(G, 0), tv.repeat_interleave(G, 0)
        o = torch.nn.functional.scaled_dot_product_attention(tq[None], tk[None], tv[None], is_causal=True)
        return o[0].transpose(0, 1).cpu().numpy()
    except ImportError:
        k, v = np.repeat(k.astype(np.float64), G, 1), np.repeat(v.astype(np.float64), G, 1)
        s = np.einsum("thd,shd->hts", q.astype(np.float64), k) / np.sqrt(q.shape[2])
        T = q.shape[0]
        s[:, np.arange(T)[None, :] > np.arange(T)[:, None]] = -np.inf
        e = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("hts,shd->thd", e / e.sum(-1, keepdims=True), v)


def webtensor_attention(devs: dict[str, wt.Device], res: dict[str, Any]) -> None:
    rng = np.random.default_rng(0)
    for T, H, KVH, D in SHAPES:
        for dtype in ("float32", "float16"):
            q, k, v = (rng.standard_normal((T, h, D)).astype(dtype) for h in (H, KVH, KVH))
            want = reference(q, k, v)
            for dname, dev in devs.items():
                if dtype == "float16" and not dev.ctx.has_f16:
                    continue
                tq, tk, tv = (wt.tensor(x, device=dev) for x in (q, k, v))
                for name, sw in VARIANTS.items():
                    if dname == "checked" and name not in ("tiled64-sg", "tiled32-sg", "prefill"):
                        continue
                    if name in ("prefill", "attention") and KVH != H:
                        continue  # (one KV head a query head there)
                    if name == "attention" and T > 1024:
                        continue
                    switches = {kk: vv for kk, vv in sw.items() if kk != "sg"}
                    if TINY:
                        switches["gpu_style"] = True
                    key = f"attn/{T}x{H}/{KVH}x{D}/{dtype}/{name}/{dname}"
                    old_sg = dev.ctx.subgroup_size
                    try:
                        if "sg" in sw and not sw["sg"]:
                            dev.ctx.subgroup_size = 0
                        with mb._switches(switches, dev):
                            def fn(dev: wt.Device = dev, ts: tuple = (tq, tk, tv), scale: float = D ** -0.5) -> Any:
                                return dev.backend.attention(*ts, True, scale)
                            got = fn().numpy().astype(np.float64)
                            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                            us, kern = gpu_us(dev, fn)
                        res[key] = {"us": round(us, 1), "err": err, "kernel": kern,
                                    "tflops": round(2 * T * T * D * H / us / 1e6, 2)}  # causal: half of 4 T^2 D H
                    except Exception as e:  # a variant the device refuses (workgroup memory): recorded
                        res[key] = {"error": str(e)[:300]}
                    finally:
                        dev.ctx.subgroup_size = old_sg
                    log(key, res[key])
                del tq, tk, tv
                dev.empty_cache()


def matmul_checks(devs: dict[str, wt.Device], res: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    shapes = [(40, 64, 96)] if TINY else [(1023, 768, 2304), (1023, 3072, 768), (1023, 768, 50257)]
    for M, K, N in shapes:
        for wd in ("float32", "float16"):
            for dname, dev in devs.items():
                w = wt.tensor((rng.standard_normal((N, K)) * 0.02).astype(wd), device=dev).T
                a = wt.tensor(rng.standard_normal((M, K)).astype(np.float32), device=dev)
                sw = {"gpu_style": True} if TINY else {}
                with mb._switches(sw, dev):
                    us, _ = gpu_us(dev, lambda a=a, w=w: wt.linear(a, w))
                key = f"matmul/{M}x{K}x{N}/f32x{wd[5:]}/{dname}"
                res[key] = {"us": round(us, 1), "tflops": round(2 * M * K * N / us / 1e6, 2)}
                log(key, res[key])
                del w, a
                dev.empty_cache()


def summary(res: dict[str, Any]) -> None:
    log("== attention, causal: GPU µs (x torch SDPA), rel err vs float64")
    for key, val in res.items():
        if not key.startswith("attn/") or key.endswith("torch-sdpa"):
            continue
        shape, dtype = key.split("/")[1:3], key.split("/")[3]
        base = res.get(f"attn/{shape[0]}/{shape[1]}/{dtype}/torch-sdpa", {}).get("us")
        if "us" in val:
            ratio = f"x{val['us'] / base:.2f}" if base else ""
            log(f"{key:<52} {val['us']:>9.1f} {ratio:>7} err {val['err']:.1e} {val['tflops']:>6} TFLOP/s "
                f"{val['kernel'][:40]}")
        else:
            log(f"{key:<52} {val['error'][:80]}")
    for key, val in res.items():
        if key.endswith("torch-sdpa"):
            log(f"{key:<52} {val['us']:>9.1f}")
    log("== matmul: trusted vs checked GPU µs")
    for key, val in res.items():
        if key.startswith("matmul/") and key.endswith("/trusted"):
            chk = res[key.replace("/trusted", "/checked")]["us"]
            log(f"{key:<44} {val['us']:>9.1f} checked {chk:>9.1f} (x{chk / val['us']:.2f})")


def main() -> None:
    t0 = time.perf_counter()
    res: dict[str, Any] = {}
    devs = {"trusted": wt.Device.wgpu(), "checked": wt.Device.wgpu(shader_checks=True)}
    res["adapter"] = {k: d.describe() for k, d in devs.items()}
    res["limits"] = {k: devs["trusted"].ctx.api.limits.get(k) for k in ("max-compute-workgroup-storage-size",)}
    res["subgroup_size"] = devs["trusted"].ctx.subgroup_size
    log(res["adapter"], res["limits"], res["subgroup_size"])
    try:
        if not TINY:
            torch_sdpa([(T, H, KVH, D) for T, H, KVH, D in SHAPES], res)
        webtensor_attention(devs, res)
        matmul_checks(devs, res)
    finally:
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        with open(os.path.join(OUT, "attn.json"), "w") as f:
            json.dump(res, f, indent=1)
        summary(res)
        log("done in", res["wall_s"], "s")


if __name__ == "__main__":
    main()
