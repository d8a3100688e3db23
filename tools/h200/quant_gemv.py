"""H200: the quantized GEMV (decode, one row) in GB/s of weight bytes, every type webtensor loads, on the
Llama-3.1-8B matrices, beside the memory's ceiling measured in the same process.

    source .gl/env.sh && python3 tools/h200/quant_gemv.py [--quick]      ($OUT/quant_gemv.json, a table last)
    TYPES=Q5_K,Q3_K,Q2_K,IQ4_NL,IQ4_XS python3 tools/h200/quant_gemv.py  (only these types; default: all)
    LOCAL=1 python3 tools/h200/quant_gemv.py --tiny                     (small shapes on lavapipe: checks the script)

Ceiling: a read-only kernel streaming 1 GiB (each thread sums vec4s; what a GEMV can at best reach) and the
float16 GEMV (gemv.wgsl) on the same shapes. Per type (`quant.random_weight`: random blocks with float16 scales
near 2^-8; the speed does not depend on the values) and shape (N x K = 4,096 x 4,096, 14,336 x 4,096, 4,096 x
14,336, 128,256 x 4,096), the kernels the planner picks under each variant of the kernel policy:

    f32          gemv_quant.wgsl (float32 activations; the fallback, and CPU adapters' kernel)
    dot4         gemv_quant_dot4.wgsl (int8 activations, dot4I8Packed) with the policy's defaults
    dot4 ...     the same with another NR (outputs a thread), LANES (threads an output) or cap on the
                 workgroups a compute unit (waves)

Each result is checked before it is timed: 192 of its outputs (the first, the last, random ones) against
numpy (f32: float64 x @ W.T, rel 1e-4; dot4: quant.q8.q8_product within its bound). GPU time from timestamp
queries (bench.matmul_bench's timer: each launch in its own pass, median of REPS after ~0.3 s of the same launches
queued) after a keep_busy; also `b2b`: the wall time a launch of 50 replayed back to back in one submit (the
decode graph's situation: no pass boundaries, the dispatch gaps included).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops
from webtensor.backends.wgpu.profiler import keep_busy, time_commands
from webtensor.backends.wgpu.signatures import Signature
from webtensor.bench import matmul_bench as mb
from webtensor.quant.q8 import q8_product
from webtensor.quant.weight import QuantWeight

TINY = "--tiny" in sys.argv
QUICK = "--quick" in sys.argv
OUT = os.environ.get("OUT", ".")
SHAPES = [(64, 512), (96, 1024)] if TINY else [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]  # (N, K)
TYPES = [t for t in os.environ.get("TYPES", ",".join(quant.TYPES)).split(",") if t]  # every type by default
REPS = 3 if TINY else 9
CHECK_ROWS = 192
BUDGET_S = float(os.environ.get("BUDGET_S", 240))  # the sweep's variants stop here (the table still comes)
# policy variants: name -> changes (gpu_style on lavapipe with --tiny)
VARIANTS: dict[str, dict[str, Any]] = {"f32": dict(gemv_quant_dot4=False), "dot4": {}}
SWEEP: dict[str, dict[str, Any]] = {
    "dot4 pre": dict(gemv_dot4_prequant=True), "dot4 u2": dict(gemv_dot4_unroll=2),
    "dot4 pre u2": dict(gemv_dot4_prequant=True, gemv_dot4_unroll=2),
    "dot4 nr1": dict(gemv_dot4_nr=1), "dot4 nr4": dict(gemv_dot4_nr=4),
    "dot4 l16": dict(gemv_quant_lanes=16), "dot4 l64": dict(gemv_quant_lanes=64),
    "dot4 w2": dict(gemv_dot4_waves=2), "dot4 w8": dict(gemv_dot4_waves=8), "dot4 w16": dict(gemv_dot4_waves=16),
    "dot4 pre w16": dict(gemv_dot4_prequant=True, gemv_dot4_waves=16),
    "f32 nr2": dict(gemv_quant_dot4=False, gemv_quant_nr_gpu=2), "f32 l64": dict(gemv_quant_dot4=False,
                                                                              gemv_quant_lanes=64),
}
SWEEP_TYPES = {"Q4_K", "Q8_0", "Q6_K"}  # (the sweep's variants on these; the others run f32 and dot4)

READ_WGSL = """
struct P { n4: u32, per: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let stride = nwg.x * 256u;
  var acc = vec4<f32>();
  for (var i = g.x; i < p.n4; i = i + stride) { acc = acc + src[i]; }
  dst[g.x] = acc.x + acc.y + acc.z + acc.w;
}
"""


def log(*a: Any) -> None:
    print(*a, flush=True)


def timed(dev: wt.Device, fn: Any) -> tuple[float, float, list[str]]:
    """(median GPU µs of the launches fn plans (matmul_bench's timer: timestamps, the clock warmed by ~0.3 s of the
    same launches), wall µs a launch back to back in one replayed graph of 50, kernel names)."""
    gpu, kernels = mb._time_case(dev, None, None, REPS, fn=lambda a, w: fn())
    g = dev.capture(lambda: [fn() for _ in range(50)])
    g.replay(1)
    dev.synchronize()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        g.replay(1)
        dev.synchronize()
        walls.append((time.perf_counter() - t0) / 50 * 1e6)
    g.release()
    return gpu, min(walls), kernels.split(",")


def check(got: np.ndarray, x: np.ndarray, w: QuantWeight, rows: np.ndarray, dot4: bool) -> str:
    """'ok' or what is wrong with outputs `rows` of got (1, N) (module docstring)."""
    sub = QuantWeight(w.qtype, w.blocks[rows], (len(rows), w.shape[1]))
    g = got[0, rows].astype(np.float64)
    if dot4:
        want, bound = q8_product(x, sub)
        want = want[0]
        floor = 1e-5 * np.maximum(np.abs(want), np.sqrt(np.mean(want * want)))
        bad = np.abs(g - want) > bound[0] + floor
        return "ok" if not bad.any() else f"BAD {int(bad.sum())} of {len(rows)}: max |d| {np.abs(g - want).max():.3g}"
    want = (x.astype(np.float64) @ sub.dequantize().astype(np.float64).T)[0]
    err = float(np.linalg.norm(g - want) / max(np.linalg.norm(want), 1e-30))
    return "ok" if err <= 1e-4 else f"BAD rel {err:.3g}"


def ceiling(dev: wt.Device, res: dict[str, Any]) -> None:
    """GB/s of a 1 GiB read (and 64 MiB, L2-sized-ish) and of the float16 GEMV."""
    ctx = dev.ctx
    path = os.path.join(OUT, "read_bw.wgsl")
    with open(path, "w") as f:
        f.write(READ_WGSL)
    kern = ctx.kernel(path, signature=Signature("read_bw", "n4 per", "src -> dst"))
    res["read"] = {}
    for mib in ((64,) if TINY else (1024, 256)):
        nbytes = mib << 20
        src = ctx.alloc(nbytes)
        groups = 4 * 132 * 8 if not TINY else 64
        dst = ctx.alloc(groups * 256 * 4)
        keep_busy(dev)
        with ctx.lock, dev.dispatch_scope():
            ctx.launch(kern, dict(n4=nbytes // 16, per=0), dict(src=src, dst=dst), (groups, 1, 1))
            cmds, _ = ctx.take_pending()
        time_commands(ctx, cmds * 3)
        us = statistics.median(time_commands(ctx, cmds * REPS))
        res["read"][f"{mib} MiB"] = {"us": round(us, 1), "GB/s": round(nbytes / us / 1e3, 1)}
        log(f"read {mib} MiB: {us:.1f} µs, {nbytes / us / 1e3:.0f} GB/s")
        ctx.release(src)
        ctx.release(dst)
    rng = np.random.default_rng(0)
    res["f16"] = {}
    for n, k in SHAPES:
        w = wt.tensor((rng.standard_normal((n, k), dtype=np.float32) * 0.02).astype(np.float16), device=dev).T
        x = wt.tensor(rng.standard_normal((1, k)).astype(np.float32), device=dev)
        keep_busy(dev)
        gpu, b2b, kern_names = timed(dev, lambda x=x, w=w: wt.linear(x, w))
        gbs = 2 * n * k / gpu / 1e3
        res["f16"][f"{n}x{k}"] = {"us": round(gpu, 1), "b2b_us": round(b2b, 1), "GB/s": round(gbs, 1),
                                  "kernels": kern_names}
        log(f"F16 {n}x{k}: {gpu:.1f} µs ({gbs:.0f} GB/s), b2b {b2b:.1f} µs, {kern_names}")
        del w


def quant_types(dev: wt.Device, res: dict[str, Any]) -> None:
    base = dev.kernel_policy
    rng = np.random.default_rng(1)
    res["types"] = {}
    for qtype in TYPES:
        res["types"][qtype] = {}
        for n, k in SHAPES:
            if k % quant.TYPES[qtype].values:
                continue
            w = quant.random_weight(qtype, (n, k), rng, -8)
            g = quant_ops.upload(dev, w)
            nbytes = g.nbytes
            x_np = rng.standard_normal((1, k), dtype=np.float32)
            x = wt.tensor(x_np, device=dev)
            rows = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, CHECK_ROWS - 2)]))
            case: dict[str, Any] = {"bytes": nbytes}
            variants = dict(VARIANTS)
            if qtype in SWEEP_TYPES and not QUICK:
                variants.update(SWEEP)
            keep_busy(dev)
            for name, changes in variants.items():
                if name not in VARIANTS and time.perf_counter() - T0 > BUDGET_S:
                    continue
                dev.kernel_policy = base.replace(**changes)
                which = quant_ops.kernel_for(dev.ctx, qtype, 1, k)[1]
                got = wt.linear(x, g).numpy()
                ok = check(got, x_np, w, rows, which.startswith("dot4"))
                gpu, b2b, kern_names = timed(dev, lambda x=x, g=g: wt.linear(x, g))
                gbs = nbytes / gpu / 1e3
                case[name] = {"us": round(gpu, 1), "b2b_us": round(b2b, 1), "GB/s": round(gbs, 1), "kernel": which,
                              "check": ok}
                log(f"{qtype} {n}x{k} {name:<9} {which:<5} {gpu:8.1f} µs {gbs:7.0f} GB/s  b2b {b2b:8.1f} µs  {ok}")
            dev.kernel_policy = base
            res["types"][qtype][f"{n}x{k}"] = case
            save(res)
            del g, w


def save(res: dict[str, Any]) -> None:
    res["wall_s"] = round(time.perf_counter() - T0, 1)
    with open(os.path.join(OUT, "quant_gemv.json"), "w") as f:
        json.dump(res, f, indent=1)


def table(res: dict[str, Any]) -> None:
    """GB/s per type and shape: f32 / dot4 / the best variant (its name); then every variant of the swept types."""
    ceil = max((v["GB/s"] for v in res.get("read", {}).values()), default=0.0)
    log(f"\nGB/s of weight bytes (read ceiling {ceil:.0f} GB/s; datasheet 4,800): f32 / dot4 / best (variant); "
        "! = a check failed")
    shapes = [f"{n}x{k}" for n, k in SHAPES]
    log(f"{'type':<6}" + "".join(f"{s:>32}" for s in shapes))
    if "f16" in res:
        log(f"{'F16':<6}" + "".join(f"{res['f16'][s]['GB/s']:>32.0f}" for s in shapes if s in res["f16"]))
    swept: dict[str, dict[str, list[str]]] = {}
    for qtype, cases in res.get("types", {}).items():
        cells = []
        for s in shapes:
            c = cases.get(s)
            if c is None:
                cells.append(f"{'-':>32}")
                continue
            vs = {k: v for k, v in c.items() if isinstance(v, dict)}
            best = max(vs.items(), key=lambda kv: kv[1]["GB/s"])
            bad = "!" if any(v["check"] != "ok" for v in vs.values()) else " "
            f32, dot4 = vs["f32"]["GB/s"], vs["dot4"]["GB/s"]
            cells.append(f"{f32:>6.0f}/{dot4:>5.0f}/{best[1]['GB/s']:>5.0f} ({best[0]:<12}){bad}")
            if len(vs) > 2:
                for name, v in vs.items():
                    swept.setdefault(qtype, {}).setdefault(name, []).append(f"{v['GB/s']:>6.0f}/{v['b2b_us']:>7.1f}")
        log(f"{qtype:<6}" + "".join(f"{c:>32}" for c in cells))
    for qtype, rows in swept.items():
        log(f"\n{qtype}: GB/s (GPU time) / µs a launch back to back, per shape {', '.join(shapes)}")
        for name, cells in rows.items():
            log(f"  {name:<13}" + "".join(f"{c:>16}" for c in cells))


T0 = time.perf_counter()


def main() -> None:
    dev = wt.Device.wgpu()
    if TINY:
        dev.kernel_policy = dev.kernel_policy.replace(gpu_style=True, gemv_quant_dot4=dev.ctx.has_dot4)
    res: dict[str, Any] = {"adapter": dev.describe(), "dot4": dev.ctx.has_dot4, "policy": repr(dev.kernel_policy),
                           "limits": dev.ctx.api.limits}
    log(res["adapter"], "dot4:", res["dot4"])
    try:
        ceiling(dev, res)
        quant_types(dev, res)
    finally:
        save(res)
        table(res)
        log("done in", res["wall_s"], "s")


if __name__ == "__main__":
    main()
