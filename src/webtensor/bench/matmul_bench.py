"""GFLOP/s of each WebGPU matmul kernel variant on GPT-2's linear shapes, on any adapter.

`python -m webtensor.bench.matmul_bench [--m 1,16,128] [--shapes 768x2304,...] [--dtypes float32,float16]
[--variants engine,tiled64] [--reps 5] [--json PATH|-]`

Each case is C (M, N) = A (M, K) @ W, W stored k-major (N, K) as GPT-2's weights are on WebGPU (the
LM head's 768x50257 is row-chunked where it is over the binding limit). A variant forces one kernel
through the switches in `backends.wgpu.ops`:

- `default`:       what ops picks on this adapter today
- `engine`:        matmul_engine.wgsl (register-tiled, double-buffered; float16 read as u32 words,
                   f32 tiles and FMAs)
- `engine-F16`:    matmul_engine.wgsl for float16 with ENGINE_F16_WORDS / ENGINE_F16_MATH set as
                   F16 says: `words-f16` (u32 words, f16 tiles, f32 FMAs), `words-chunked` (u32
                   words, packed f16 FMAs), `vec-f32`, `vec-f16`, `vec-chunked` (vec4<f16> loads;
                   `vec-chunked` is the float16 engine before the u32 loads)
- `engine-RxC`:    matmul_engine.wgsl with the workgroup tile forced to R x C (64x64, 64x128,
                   128x64, 128x128) instead of `engine_tile`'s choice (for tuning the tile rule)
- `tiled64`:       matmul.wgsl (64x64 tiles, 4x4 a thread), the GPU kernel before the engine
- `regs`:          matmul_regs.wgsl (no workgroup memory), CPU adapters only
- `gemv`:          gemv.wgsl for every row (M <= 64 only)

Times are GPU time from timestamp queries (each dispatch in its own pass; a case's dispatches
summed; median of `reps`), or the wall clock over `reps` calls where the adapter has no timestamps.
GFLOP/s = 2 M N K / time. The `kernel` column names what really ran. On GPUs the timed copies are
queued right behind ~WARM_MS of the case's own launches (no wait between): a GPU left idle while
the host prepares a case lowers its clock, and a figure taken then depends on the process's host
work (issue 25: 4-5x on the H200; profiler.keep_busy says more).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

SHAPES = [(768, 2304), (768, 3072), (3072, 768), (768, 50257)]
MS = [1, 16, 128, 512, 1023, 4096]
TILES = {"64x64": (1, 1), "64x128": (1, 2), "128x64": (2, 1), "128x128": (2, 2)}
# float16 engine variants: (engine_f16_words, engine_f16_math)
F16 = {"words-f16": (True, "f16"), "words-chunked": (True, "chunked"), "vec-f32": (False, "f32"),
       "vec-f16": (False, "f16"), "vec-chunked": (False, "chunked")}
VARIANTS = ["default", "engine", *(f"engine-{f}" for f in F16), *(f"engine-{t}" for t in TILES), "tiled64", "regs",
            "gemv"]
_ENGINE = {"engine": True, "gpu_style": True, "gemv_max_rows": 0, "engine_f16_words": True,
           "engine_f16_math": "f32"}
# kernel-policy fields per variant (unlisted ones keep the device's values); a name that is no
# policy field replaces the function of that name in backends.wgpu.ops (engine_tile)
_SWITCHES: dict[str, dict[str, Any]] = {
    "default": {},
    "engine": _ENGINE,
    **{f"engine-{name}": {**_ENGINE, "engine_f16_words": w, "engine_f16_math": m} for name, (w, m) in F16.items()},
    **{f"engine-{name}": {**_ENGINE, "engine_tile": lambda m, n, p, t=tile: t} for name, tile in TILES.items()},
    "tiled64": {"engine": False, "gpu_style": True, "gemv_max_rows": 0},
    "regs": {"gemv_max_rows": 0, "gpu_style": False},
    "gemv": {"gemv_max_rows": 1 << 30},
}


@contextlib.contextmanager
def _switches(values: dict[str, Any], device: Any = None) -> Iterator[None]:
    """Within: `device`'s kernel policy (default: `Device.wgpu()`) with the fields in `values`
    replaced, and the functions of backends.wgpu.ops named there replaced. Old upper-case switch
    names (ENGINE_F16_MATH) are taken as the policy's fields (GPU_STYLE_ON_SOFTWARE: gpu_style)."""
    import dataclasses

    from ..backends.wgpu import ops as gops
    from ..backends.wgpu.policy import KernelPolicy
    from ..device import Device

    dev = device if device is not None else Device.wgpu()
    fields = {f.name for f in dataclasses.fields(KernelPolicy)}
    named = {("gpu_style" if k == "GPU_STYLE_ON_SOFTWARE" else k.lower() if k.isupper() else k): v
             for k, v in values.items()}
    policy = {k: v for k, v in named.items() if k in fields}
    funcs = {k: v for k, v in named.items() if k not in fields}
    old_policy, old_funcs = dev.kernel_policy, {k: getattr(gops, k) for k in funcs}
    try:
        dev.kernel_policy = old_policy.replace(**policy)
        for k, v in funcs.items():
            setattr(gops, k, v)
        yield
    finally:
        dev.kernel_policy = old_policy
        for k, v in old_funcs.items():
            setattr(gops, k, v)


def _applies(variant: str, M: int, dtype: str, software: bool) -> bool:
    if variant.removeprefix("engine-") in F16:
        return dtype == "float16"
    if variant == "regs":
        return software
    if variant == "gemv":
        return M <= 64
    return True


WARM_MS = 300.0  # GPU time of a case's own launches queued before its timed copies (GPUs only)


def _time_case(dev: Any, a: Any, w: Any, reps: int, fn: Any = None) -> tuple[float, str]:
    """(µs a matmul, kernel names) of fn(a, w) (default ops.linear) under the current switches."""
    from .. import ops
    from ..backends.wgpu.profiler import time_commands

    fn = fn or ops.linear
    ctx = dev.ctx
    fn(a, w).numpy()  # compiles the variant and warms up
    with ctx.lock, dev.dispatch_scope():
        out = fn(a, w)
        cmds, names = ctx.take_pending()  # timed below instead of submitted by the scope
    kernels = ",".join(sorted({n.split("-")[0] for n in names}))
    if "timestamp-query" in ctx.api.features:
        n = len(cmds)
        if not ctx.info.is_software:  # the clock up first: the timed copies queue right behind these
            rough = sum(time_commands(ctx, cmds))
            ctx.enqueue(cmds * max(1, min(20000, math.ceil(WARM_MS * 1e3 / max(rough, 1.0)))))
            ctx.flush()
        per = time_commands(ctx, cmds * reps)
        us = statistics.median(sum(per[i * n:(i + 1) * n]) for i in range(reps))
    else:
        t0 = time.perf_counter()
        with dev.dispatch_scope():
            for _ in range(reps):
                out = fn(a, w)
        out[:1].numpy()
        us = (time.perf_counter() - t0) * 1e6 / reps
    return us, kernels


def measure(ms: list[int], shapes: list[tuple[int, int]], dtypes: list[str], variants: list[str],
            reps: int = 5, device: Any = None, progress: bool = False) -> dict[str, Any]:
    import numpy as np

    import webtensor as wt

    dev = device if device is not None else wt.Device.wgpu()
    ctx = dev.ctx
    software = ctx.info.is_software
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        if dtype == "float16" and not ctx.has_f16:
            print(f"skipping float16: {ctx.info.name} has no shader-f16", file=sys.stderr)
            continue
        for K, N in shapes:
            w = wt.tensor((rng.standard_normal((N, K)) * 0.02).astype(dtype), device=dev).T  # k-major (K, N) view
            for M in ms:
                a = wt.tensor(rng.standard_normal((M, K)).astype(dtype), device=dev)
                for variant in variants:
                    if not _applies(variant, M, dtype, software):
                        continue
                    with _switches(_SWITCHES[variant], dev):
                        us, kernels = _time_case(dev, a, w, reps)
                    rows.append({"M": M, "K": K, "N": N, "dtype": dtype, "variant": variant, "kernel": kernels,
                                 "us": round(us, 2), "gflops": round(2 * M * N * K / us / 1e3, 2)})
                    if progress:
                        print(_fmt(rows[-1]), file=sys.stderr)
                del a
            del w
            ctx.empty_cache()
    return {"adapter": ctx.info.name, "backend": ctx.info.backend, "software": software,
            "timing": "gpu-timestamps" if "timestamp-query" in ctx.api.features else "wall-clock",
            "reps": reps, "rows": rows}


def _fmt(r: dict[str, Any]) -> str:
    return (f"{r['dtype']:>8} M={r['M']:<5} {r['K']}x{r['N']:<6} {r['variant']:<14} {r['kernel']:<28} "
            f"{r['us']:>11.1f} us {r['gflops']:>9.1f} GFLOP/s")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _shapes(s: str) -> list[tuple[int, int]]:
    out = []
    for item in s.split(","):
        k, n = item.lower().split("x")
        out.append((int(k), int(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m webtensor.bench.matmul_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=_ints, default=MS, help="rows of A, comma-separated (default 1,16,128,512,1023,4096)")
    ap.add_argument("--shapes", type=_shapes, default=SHAPES, help="KxN list (default GPT-2 124M's four)")
    ap.add_argument("--dtypes", default="float32,float16", help="float32 and/or float16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in _SWITCHES]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    report = measure(args.m, args.shapes, [d for d in args.dtypes.split(",") if d], variants, args.reps,
                     progress=True)
    if args.json == "-":
        json.dump(report, sys.stdout, indent=1)
        print()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{report['adapter']} ({report['backend']}), {report['timing']}: {len(report['rows'])} cases",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
