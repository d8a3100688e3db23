"""H200: the per-process slowdown of issue 25 (some fresh processes run some products 4-5x slower
after a large allocation), reproduced in fresh processes with everything recorded beside it.

    source .gl/env.sh && python3 tools/h200/slowdown.py [--children 5] [--tiny]

The parent starts an nvidia-smi log (SM / memory clocks, power, performance state every 50 ms:
$OUT/smi.csv) and runs `--children` fresh child processes one after the other. Each child runs the
issue's reproduction, `matmul_bench --m 64,1023 --dtypes float32,float16 --variants default` over
GPT-2 124M's four shapes (the 768 x 50,257 LM head included), and records for every case:

- `cold`: GPU µs as matmul_bench measures it (a warm-up call whose output is read back, then the
  timed copies in one submit: the GPU idles while the host reads the output back),
- `warm`: the same timed copies submitted right behind ~100 ms of the same case's own launches
  (no readback, no idle gap before the timed ones),
- the SM clock (NVML) just before each of the two timed submits,
- where each buffer of 1 MiB or more landed: the Vulkan heaps' usage by this process before and
  after its creation (tools/vkmem.py: a Vulkan instance of our own, VK_EXT_memory_budget).

The parent prints, per case, min / median / max over the children of cold and warm, and writes
every child's record to $OUT/slowdown.jsonl. `--tiny`: small shapes on any adapter (lavapipe) to
check the script; no NVML, no nvidia-smi.

`--idle` (one process): the deliberate reproduction. Two products (float16 1,023 x 768 x 2,304,
float32 1,023 x 3,072 x 768) are timed after the GPU was kept busy for 0.5 s and then left idle
for 0 .. 3 s (time.sleep): `cold` is the timed submit alone, `gated` the same after
`profiler.keep_busy` (0.3 s of GPU work, waited for); the SM clock (NVML) is read after the idle
time. Twice over; $OUT/idle.json.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tools/ (vkmem)

OUT = Path(os.environ.get("OUT", "."))
TINY = "--tiny" in sys.argv
SHAPES = [(64, 96), (64, 2000)] if TINY else [(768, 2304), (768, 3072), (3072, 768), (768, 50257)]
MS = (8, 40) if TINY else (64, 1023)
REPS = 5
WARM_US = 100_000  # GPU time of the same launches queued right before the warm timing


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return lambda: int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return lambda: -1


def child(name: str) -> dict[str, Any]:
    import numpy as np

    import webtensor as wt
    from webtensor import ops
    from webtensor.backends.wgpu.profiler import time_commands
    from webtensor.bench import matmul_bench as mb

    try:
        from vkmem import VkMemory

        vk = VkMemory()
    except Exception as e:  # no loader / no budget extension: heaps unknown
        print("vkmem:", e, file=sys.stderr)
        vk = None
    sm_clock = _nvml()
    dev = wt.Device.wgpu()
    if TINY:
        dev.kernel_policy = dev.kernel_policy.replace(gpu_style=True)
    ctx = dev.ctx
    match = ctx.info.name.split(" (")[0]
    usage = (lambda: vk.usage(match)) if vk is not None else (lambda: [])
    allocs: list[dict[str, Any]] = []
    create = ctx.api.create_buffer

    def traced(size: int, usage_bits: int, label: str = "") -> Any:
        if size < (1 << 20):
            return create(size, usage_bits, label)
        before = usage()
        buf = create(size, usage_bits, label)
        after = usage()
        allocs.append({"size": size, "usage": usage_bits, "label": label,
                       "heap_delta": [b - a for a, b in zip(before, after, strict=False)]})
        return buf

    ctx.api.create_buffer = traced  # type: ignore[method-assign]
    rec: dict[str, Any] = {"child": name, "adapter": dev.describe(), "heaps": vk.snapshot() if vk else [],
                           "cases": [], "allocs": allocs}
    rng = np.random.default_rng(0)
    t_start = time.perf_counter()
    for dtype in ("float32", "float16"):
        if dtype == "float16" and not ctx.has_f16:
            continue
        for K, N in SHAPES:
            w = wt.tensor((rng.standard_normal((N, K)) * 0.02).astype(dtype), device=dev).T
            for M in MS:
                a = wt.tensor(rng.standard_normal((M, K)).astype(dtype), device=dev)
                clk_cold = sm_clock()
                cold, kernels = mb._time_case(dev, a, w, REPS)  # as matmul_bench (readback, then timed)
                with ctx.lock, dev.dispatch_scope():
                    ops.linear(a, w)
                    cmds, _ = ctx.take_pending()
                n_warm = max(1, min(4000, math.ceil(WARM_US / max(cold, 1.0))))
                ctx.enqueue(cmds * n_warm)
                ctx.flush()  # (no wait: the timed copies queue right behind)
                clk_warm = sm_clock()
                per = time_commands(ctx, cmds * REPS)
                n = len(cmds)
                warm = statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(REPS))
                rec["cases"].append({"case": f"{dtype} {M}x{K}x{N}", "kernels": kernels, "cold": round(cold, 1),
                                     "warm": round(warm, 1), "clk_cold": clk_cold, "clk_warm": clk_warm,
                                     "t": round(time.perf_counter() - t_start, 2), "heap_usage": usage()})
                print(f"[{name}] {rec['cases'][-1]}", file=sys.stderr, flush=True)
                del a
            del w
            ctx.empty_cache()
    rec["stats"] = dev.stats()
    return rec


def parent(n: int) -> None:
    smi = None
    if not TINY:
        try:
            smi = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu,"
                 "clocks_event_reasons.active", "--format=csv", "-lms", "50"],
                stdout=open(OUT / "smi.csv", "w"), stderr=subprocess.DEVNULL)
        except OSError as e:
            print("nvidia-smi:", e)
    recs = []
    try:
        for i in range(n):
            p = subprocess.run([sys.executable, __file__, "--child", f"p{i}", *(["--tiny"] if TINY else [])],
                               capture_output=True, text=True)
            (OUT / f"child{i}.log").write_text(p.stderr) if i < 2 else None
            if p.returncode != 0:
                print(f"child {i} failed:\n{p.stderr[-3000:]}")
                continue
            recs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    finally:
        if smi is not None:
            smi.terminate()
    with open(OUT / "slowdown.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    if not recs:
        return
    print(recs[0]["adapter"])
    for name, heaps in recs[0]["heaps"]:
        print(" ", name, [(i, round(size / 2**30, 1), flags, round(b / 2**30, 1), round(u / 2**20))
                          for i, size, flags, b, u in heaps])
    big = {}
    for r in recs:
        for al in r["allocs"]:
            key = (al["size"], tuple(1 if d > 0 else 0 for d in al["heap_delta"]))
            big[key] = big.get(key, 0) + 1
    print("buffers >= 1 MiB: (bytes, heaps that grew) -> count over all children")
    for (size, heaps), c in sorted(big.items()):
        print(f"  {size:>12,} heaps {heaps} x{c}")
    print(f"{'case':<28}{'kernels':<18}{'cold min/med/max µs':>28}{'warm min/med/max µs':>28}  clk cold / warm (MHz)")
    for j, c0 in enumerate(recs[0]["cases"]):
        cold = [r["cases"][j]["cold"] for r in recs]
        warm = [r["cases"][j]["warm"] for r in recs]
        clk = [(r["cases"][j]["clk_cold"], r["cases"][j]["clk_warm"]) for r in recs]

        def mmm(x: list[float]) -> str:
            return f"{min(x):8.1f} {statistics.median(x):8.1f} {max(x):8.1f}"

        print(f"{c0['case']:<28}{c0['kernels'][:17]:<18}{mmm(cold):>28}{mmm(warm):>28}  {clk}")


def idle_sweep() -> None:
    import numpy as np

    import webtensor as wt
    from webtensor import ops
    from webtensor.backends.wgpu.profiler import keep_busy, time_commands

    sm_clock = _nvml()
    dev = wt.Device.wgpu()
    if TINY:
        dev.kernel_policy = dev.kernel_policy.replace(gpu_style=True)
    ctx = dev.ctx
    rng = np.random.default_rng(0)
    cases = []
    for (M, K, N), wd in (((40, 64, 96), "float16"), ((40, 96, 64), "float32")) if TINY else (
            ((1023, 768, 2304), "float16"), ((1023, 3072, 768), "float32")):
        a = wt.tensor(rng.standard_normal((M, K)).astype(np.float32), device=dev)
        w = wt.tensor((rng.standard_normal((N, K)) * 0.02).astype(wd), device=dev).T
        ops.linear(a, w).numpy()
        with ctx.lock, dev.dispatch_scope():
            ops.linear(a, w)
            cmds, _ = ctx.take_pending()
        cases.append((f"f32x{wd[5:]} {M}x{K}x{N}", a, w, cmds))

    def timed(cmds: list) -> float:
        n = len(cmds)
        per = time_commands(ctx, cmds * REPS)
        return statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(REPS))

    rows = []
    for rnd in range(2):
        for idle in (0.0, 0.5, 1.0, 2.0, 3.0):
            for name, _, _, cmds in cases:
                keep_busy(dev, 0.5)
                time.sleep(idle)
                clk = sm_clock()
                cold = timed(cmds)
                keep_busy(dev)
                clk_g = sm_clock()
                gated = timed(cmds)
                rows.append({"round": rnd, "idle_s": idle, "case": name, "clk_after_idle": clk, "cold": round(cold, 1),
                             "clk_gated": clk_g, "gated": round(gated, 1)})
                print(rows[-1], flush=True)
    with open(OUT / "idle.json", "w") as f:
        json.dump({"adapter": dev.describe(), "rows": rows}, f, indent=1)
    print(f"{'case':<26}{'idle s':>7}{'clock MHz':>10}{'cold µs':>10}{'gated µs':>10}{'cold/gated':>11}")
    for r in rows:
        print(f"{r['case']:<26}{r['idle_s']:>7}{r['clk_after_idle']:>10}{r['cold']:>10}{r['gated']:>10}"
              f"{r['cold'] / r['gated']:>11.2f}")


if __name__ == "__main__":
    if "--idle" in sys.argv:
        idle_sweep()
    elif "--child" in sys.argv:
        print(json.dumps(child(sys.argv[sys.argv.index("--child") + 1])))
    else:
        n = int(sys.argv[sys.argv.index("--children") + 1]) if "--children" in sys.argv else 5
        parent(n)
