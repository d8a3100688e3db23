"""H200, one device call (3-5 minutes, BUDGET=330 s of cases at most): the matrix engine with quantized weights
(matmul_engine_quant.wgsl) beside float16 weights on the products of SmolLM2-135M, Llama-3.2-1B and
Llama-3.1-8B (qkv, o, gate_up, down, and the LM head at batch sizes), every type webtensor loads (`quant.TYPES`,
or those named in TYPES=Q5_K,IQ4_XS,...; the 256-value types only where K is a multiple of 256), at M = 16, 32,
64, 128, 512, 1,024, 4,096 rows.

    source .gl/env.sh && python3 tools/h200/quant_engine.py          (carry [".gl", ".whl"])
    here: PYTHONPATH=src:tools/h200 python3 tools/h200/quant_engine.py --tiny   (small shapes, GPU kernels
    on lavapipe: checks the script, not the speed)

Each case is C (M, N) = A (M, K) @ W^T with float32 activations, as the models run it: W float16 (the F16
models) or quantized (random blocks of the type, float16 scales ~2^-11). Before it is timed, each result
is checked against float64 numpy on three rows and 256 columns (W's rows dequantized by quant/dequant.py);
a case over 1e-4 relative error is marked FAIL. GPU time from timestamp queries (tools/h200/engine_sweep.py's
time_case: ~20 ms of the case's own launches queued before 5 timed copies; keep_busy before each weight).
Variants, in $OUT/quant_engine.json:
- `default`: what the planner runs for a plain (M, K) product (the engine above 8 rows);
- `gemv` (M <= 64): the rows as a stack of one-row products on the GEMV (gemv.wgsl / gemv_quant.wgsl), what
  a batched decode step of M rows runs up to policy.gemv_stack_*_max_rows (16); the engine above that;
- `bk16`: the engine with f32 tiles 16 deep (policy.engine_bk = 16; left out past 60 % of the budget);
- the 8B shapes at 1,024 rows in float16 (issue 28's 50 TFLOP/s prefill target): float16 activations too
  (`f16xf16-<math>`: f32 / f16 tiles, packed f16 FMAs), 128 x 128 tiles (`t128x128`), and bk16.
Tables last: (1) per model and M, a step's products summed (the LM head at M <= 128 only: a prompt pass runs
it on one row) as routed today, float16's GPU time and TFLOP/s and each type's ratio F16 / type (> 1: the
type is faster); (2) the stack crossover, GEMV / engine per type at 16 / 32 / 64 rows; (3) the 8B float16
prefill variants in TFLOP/s; bk16 against the default by M.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
from engine_sweep import time_case

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops
from webtensor.backends.wgpu.profiler import keep_busy
from webtensor.bench import matmul_bench as mb
from webtensor.quant.weight import QuantWeight

TINY = "--tiny" in sys.argv
OUT = os.environ.get("OUT", ".")
# (hidden C, MLP F, heads H, KV heads, head dim, vocabulary)
MODELS = {"tiny": (256, 512, 4, 2, 64, 1000)} if TINY else {
    "smollm2-135m": (576, 1536, 9, 3, 64, 49152),
    "llama-3.2-1b": (2048, 8192, 32, 8, 64, 128256),
    "llama-3.1-8b": (4096, 14336, 32, 8, 128, 128256),
}
MS = (16, 64, 300) if TINY else (16, 32, 64, 128, 512, 1024, 4096)
TYPES = ["F16", *[t for t in os.environ.get("TYPES", ",".join(quant.TYPES)).split(",") if t]]  # all by default
HEAD_MAX_M = 128
GEMV_MAX_M = 64
PREFILL_M = 300 if TINY else 1024
BIG = "tiny" if TINY else "llama-3.1-8b"
TOL = 1e-4
BUDGET = float(os.environ.get("BUDGET", "330"))  # seconds: past 60 % the bk16 variant is left out, past 100 % the
T0 = time.perf_counter()                          # remaining cases (the tables print what was measured)


def elapsed() -> float:
    return time.perf_counter() - T0


def log(*a: Any) -> None:
    print(*a, flush=True)


def products(C: int, F: int, H: int, KVH: int, D: int, V: int) -> list[tuple[str, int, int]]:
    """(name, K, N) of a layer's products and the LM head."""
    return [("qkv", C, H * D + 2 * KVH * D), ("o", H * D, C), ("gate_up", C, 2 * F), ("down", F, C), ("head", C, V)]


def random_blocks(rng: np.random.Generator, qtype: str, n: int, k: int) -> np.ndarray:
    """(n, row bytes) uint8: random ggml blocks of `qtype` whose float16 scale fields are ~2^-11 (finite)."""
    t = quant.TYPES[qtype]
    raw = rng.integers(0, 256, (n, k // t.values, t.nbytes), dtype=np.uint8)
    for off in quant.HALVES[qtype]:
        raw[:, :, off + 1] = 0x10 | (raw[:, :, off + 1] & 0x83)  # exponent 4: 2^-11 .. 2^-9, either sign
    return raw.reshape(n, -1)


def make_weight(dev: wt.Device, rng: np.random.Generator, qtype: str, n: int, k: int) -> tuple[Any, Any]:
    """(the weight as linear takes it on `dev`, rows(idx) -> float64 rows of W for the check)."""
    if qtype == "F16":
        bits = rng.integers(0, 1 << 16, (n, k), dtype=np.uint16)
        w16 = ((bits & 0x83FF) | 0x2000).view(np.float16)  # exponent 8: 2^-7 .. 2^-6, either sign
        return wt.tensor(w16, device=dev).T, lambda idx: w16[idx].astype(np.float64)
    blocks = random_blocks(rng, qtype, n, k)
    w = quant_ops.upload_blocks(dev, qtype, blocks, (n, k))
    return w, lambda idx: QuantWeight.from_blocks(qtype, blocks[idx], (len(idx), k)).dequantize().astype(np.float64)


def check(dev: wt.Device, a: wt.Tensor, a_np: np.ndarray, w: Any, rows_of: Any, rng: np.random.Generator) -> float:
    """Relative error of linear(a, w) on rows 0, M / 2, M - 1 and 256 random columns against float64 numpy."""
    out = wt.linear(a, w)
    M, N = out.shape[0], out.shape[-1]
    rows = sorted({0, M // 2, M - 1})
    cols = np.sort(rng.choice(N, min(N, 256), replace=False))
    got = np.concatenate([out[r:r + 1].numpy().reshape(1, N) for r in rows])[:, cols]
    want = a_np[rows].astype(np.float64) @ rows_of(cols).T
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def timed(dev: wt.Device, a: wt.Tensor, w: Any, switches: dict[str, Any]) -> dict[str, Any]:
    with mb._switches(switches, dev):
        us, kern = time_case(dev, a, w)
    M, K = a.shape[0], a.shape[-1]
    N = w.shape[0] if hasattr(w, "qtype") else w.shape[1]
    return {"us": round(us, 2), "tflops": round(2 * M * N * K / us / 1e6, 2), "kernel": kern}


def run_model(dev: wt.Device, model: str, dims: tuple[int, ...], base: dict[str, Any], res: dict[str, Any],
              rng: np.random.Generator) -> None:
    prods = products(*dims)
    kmax = max(k for _, k, _ in prods)
    a_all = rng.standard_normal((max(MS), kmax)).astype(np.float32)
    for name, K, N in prods:
        for qtype in TYPES:
            if qtype != "F16" and K % quant.TYPES[qtype].values:
                continue  # (llama.cpp's K-quant files keep such rows in Q5_0 / Q8_0)
            if elapsed() > BUDGET:
                log(f"budget of {BUDGET:.0f} s spent: {model} {name} {qtype} and after left out")
                return
            w, rows_of = make_weight(dev, rng, qtype, N, K)
            keep_busy(dev)
            for M in MS:
                if name == "head" and M > HEAD_MAX_M:
                    continue
                a_np = np.ascontiguousarray(a_all[:M, :K])
                a = wt.tensor(a_np, device=dev)
                case: dict[str, Any] = {"model": model, "product": name, "K": K, "N": N, "M": M, "type": qtype}
                with mb._switches(base, dev):
                    case["err"] = check(dev, a, a_np, w, rows_of, rng)
                case["ok"] = case["err"] <= TOL
                v = case["variants"] = {"default": timed(dev, a, w, base)}
                if M <= GEMV_MAX_M:
                    stack = wt.tensor(a_np.reshape(M, 1, K), device=dev)
                    v["gemv"] = timed(dev, stack, w, dict(base, gemv_stack_f16_max_rows=None,
                                                          gemv_stack_quant_max_rows=None))
                    del stack
                if elapsed() < 0.6 * BUDGET:
                    v["bk16"] = timed(dev, a, w, dict(base, engine_bk=16))
                if model == BIG and qtype == "F16" and M == PREFILL_M and name != "head":
                    a16 = wt.tensor(a_np.astype(np.float16), device=dev)
                    for m_ in ("f32", "f16", "chunked"):
                        v[f"f16xf16-{m_}"] = timed(dev, a16, w, dict(base, engine_f16_math=m_))
                    del a16
                    v["t128x128"] = timed(dev, a, w, dict(base, engine_tile=lambda m, n, p: (2, 2)))
                res["cases"].append(case)
                log(f"{model:<13} {name:<7} {qtype:<4} M={M:<5} {K}x{N:<6} err {case['err']:.1e} "
                    + " ".join(f"{k} {x['us']:.1f}" for k, x in v.items()))
                del a
            del w
            dev.ctx.empty_cache()


STACK_LIMIT = 16  # policy.gemv_stack_f16_max_rows and gemv_stack_quant_max_rows as shipped


def step_us(by: dict[tuple[Any, ...], Any], model: str, M: int, qtype: str) -> tuple[float | None, bool, float]:
    """(GPU us of a step's products at M rows as routed today: a stack of up to STACK_LIMIT rows on the GEMV,
    else the engine; the LM head only at M <= HEAD_MAX_M), whether every result checked out, its FLOPs."""
    total, ok, flops = 0.0, True, 0.0
    for name in ("qkv", "o", "gate_up", "down", "head"):
        if name == "head" and M > HEAD_MAX_M:
            continue
        c = by.get((model, M, qtype, name))
        if c is None:
            return None, ok, 0.0
        v = c["variants"]
        total += v["gemv" if M <= STACK_LIMIT and "gemv" in v else "default"]["us"]
        ok = ok and c["ok"]
        flops += 2 * M * c["K"] * c["N"]
    return total, ok, flops


def tables(res: dict[str, Any]) -> None:
    cases = res["cases"]
    by = {(c["model"], c["M"], c["type"], c["product"]): c for c in cases}
    models = list(dict.fromkeys(c["model"] for c in cases))
    log(f"\n(1) GPU time of a step's products at M rows with float16 weights (us, TFLOP/s) and each type's speed "
        f"against it (F16 time / type time; > 1: faster), as routed today (M <= {STACK_LIMIT}: the GEMV, else the "
        "engine); '-': the type does not fit K; FAIL: a result off numpy")
    log(f"{'model':<13} {'M':>5} {'F16 us':>9} {'TFLOP/s':>8} " + " ".join(f"{t:>6}" for t in TYPES[1:]))
    for model in models:
        for M in MS:
            f16, f16_ok, flops = step_us(by, model, M, "F16")
            if f16 is None:
                continue
            cells = []
            for t in TYPES[1:]:
                us, ok, _ = step_us(by, model, M, t)
                cells.append(" FAIL " if not ok else "     -" if us is None else f"{f16 / us:>6.2f}")
            log(f"{model:<13} {M:>5} {f16:>9.1f} {flops / f16 / 1e6:>8.2f} " + " ".join(cells)
                + ("" if f16_ok else "  F16 FAIL"))
    log("\n(2) stacks of M one-row products: GEMV us / engine us, summed over the products (< 1: the GEMV wins)")
    log(f"{'model':<13} {'M':>5} " + " ".join(f"{t:>6}" for t in TYPES))
    for model in models:
        for M in (m for m in MS if m <= GEMV_MAX_M):
            cells = []
            for t in TYPES:
                cs = [c for c in cases if c["model"] == model and c["M"] == M and c["type"] == t]
                g = sum(c["variants"]["gemv"]["us"] for c in cs)
                e = sum(c["variants"]["default"]["us"] for c in cs)
                cells.append(f"{g / e:>6.2f}" if cs else "     -")
            log(f"{model:<13} {M:>5} " + " ".join(cells))
    log(f"\n(3) {BIG} float16 at {PREFILL_M} rows: TFLOP/s of each variant (the prompt pass's products; "
        "bk16 for every type in the JSON)")
    for c in cases:
        if c["model"] == BIG and c["M"] == PREFILL_M and c["type"] == "F16":
            log(f"{c['product']:<8} {c['K']}x{c['N']:<6} " + " ".join(f"{k} {x['tflops']:.1f}"
                                                                      for k, x in c["variants"].items()))
    pairs = [(c["M"], c["variants"]["bk16"]["us"], c["variants"]["default"]["us"]) for c in cases
             if "bk16" in c["variants"]]
    log("\nbk16 / default (engine, summed over the products and types measured with both) by M: " + " ".join(
        f"{M}: {sum(b for m, b, _ in pairs if m == M) / sum(d for m, _, d in pairs if m == M):.3f}"
        for M in MS if any(m == M for m, _, _ in pairs)))


def main() -> None:
    dev = wt.Device.wgpu()
    base: dict[str, Any] = {"gpu_style": True} if TINY else {}
    res: dict[str, Any] = {"adapter": dev.describe(), "tiny": TINY, "policy": str(dev.kernel_policy), "cases": []}
    rng = np.random.default_rng(0)
    try:
        for model, dims in MODELS.items():
            run_model(dev, model, dims, base, res, rng)
            log(f"== {model} done at {elapsed():.0f} s")
    finally:
        res["wall_s"] = round(elapsed(), 1)
        with open(os.path.join(OUT, "quant_engine.json"), "w") as f:
            json.dump(res, f, indent=1)
    tables(res)
    log(f"done in {res['wall_s']} s; failures: {sum(not c['ok'] for c in res['cases'])} of {len(res['cases'])}")


if __name__ == "__main__":
    main()
