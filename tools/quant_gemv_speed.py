"""Decode GEMV time, float32 against the quantized types (gemv_quant.wgsl, with NR outputs a thread
on CPU adapters), on decode shapes (one row of activations), side by side in one run.

    python tools/quant_gemv_speed.py [--device lavapipe] [--types Q8_0,Q4_1,...] [--nr 1,2]
        [--shapes gpt2|smollm2] [--reps 5] [--calls 20] [--decode 16 [--model gpt2]]

Each case captures `calls` launches of one product into a graph, replays it `reps` times (wall
clock, after a warm-up) and prints the median per launch in µs; the rows interleave the variants so
that they share the machine's noise. Q8_0 / Q4_0 / Q4_1 weights are quantized from random floats,
Q4_K / Q6_K are random blocks (finite scales); shapes whose K is not whole blocks of a type skip it.
With --decode N, then GPT-2's greedy decode tokens/s (`webtensor bench`'s measurement: N tokens after
a prompt of 8, best of --rounds) in float32 and in int8 (Q8_0) with each NR, the models built once
per variant and run in turn. (PYTHONPATH selects the tree.)"""

import argparse
import statistics
import time

import numpy as np

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops

SHAPES = {"gpt2": [(768, 2304), (768, 3072), (3072, 768), (768, 50257)],  # (K, N): qkv, fc, proj, LM head
          "smollm2": [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]}  # q, k, gate, down, LM head

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--device", default="lavapipe")
p.add_argument("--types", default=",".join(quant.TYPES), help="quantized types, comma-separated")
p.add_argument("--nr", default="2", help="gemv_quant outputs per thread (CPU adapters), comma-separated")
p.add_argument("--shapes", default="gpt2", choices=sorted(SHAPES))
p.add_argument("--reps", type=int, default=5)
p.add_argument("--calls", type=int, default=20)
p.add_argument("--decode", type=int, default=0, help="also GPT-2 decode tokens/s over this many tokens")
p.add_argument("--model", default="gpt2", help="a GPT-2 preset (random weights) for --decode")
p.add_argument("--rounds", type=int, default=2, help="--decode: rounds over the variants")
a = p.parse_args()
dev = wt.Device.parse(a.device)
nrs = [int(x) for x in a.nr.split(",")]
types = [t.strip() for t in a.types.split(",") if t.strip()]
rng = np.random.default_rng(0)
print(f"{dev.describe()}; median µs per launch over {a.reps} replays of {a.calls} launches")


def time_us(fn) -> float:
    g = dev.capture(lambda: [fn() for _ in range(a.calls)])
    g.replay(1)
    dev.synchronize()
    ts = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        g.replay(1)
        dev.synchronize()
        ts.append((time.perf_counter() - t0) / a.calls * 1e6)
    g.release()
    return statistics.median(ts)


def make(qtype: str, w: np.ndarray) -> quant.QuantWeight:
    if qtype in quant.QUANTIZABLE:
        return quant.quantize(w, qtype)
    return quant.random_weight(qtype, w.shape, rng, -8)  # float16 scales near 2^-8


total: dict[str, float] = {}  # variant -> its µs over the shapes it ran
base: dict[str, float] = {}  # variant -> float32's µs over the same shapes
for K, N in SHAPES[a.shapes]:
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
    x = wt.tensor(rng.standard_normal((1, K)).astype(np.float32), device=dev)
    wf = wt.tensor(w, device=dev).T  # (K, N) view of k-major storage, as GPT-2's weights on WebGPU
    row = {"float32": time_us(lambda x=x, wf=wf: wt.linear(x, wf))}
    for qtype in types:
        if K % quant.TYPES[qtype].values:
            continue
        wq = quant_ops.upload(dev, make(qtype, w))
        ref = None
        for nr in nrs:
            dev.kernel_policy = dev.kernel_policy.replace(gemv_quant_nr=nr)
            got = wt.linear(x, wq).numpy()
            ref = got if ref is None else ref
            assert np.array_equal(got, ref)  # every NR: the same bits
            row[f"{qtype} NR={nr}"] = time_us(lambda x=x, wq=wq: wt.linear(x, wq))
    for k, v in row.items():
        total[k] = total.get(k, 0.0) + v
        base[k] = base.get(k, 0.0) + row["float32"]
    print(f"K={K:5d} N={N:6d}: " + "  ".join(f"{k} {v:8.0f}" for k, v in row.items()))
print("sums (float32 over the same shapes / the variant):  "
      + "  ".join(f"{k} {v:8.0f} ({base[k] / v:.2f}x)" for k, v in total.items()))

if a.decode:
    from webtensor.bench.model_bench import bench_webtensor
    from webtensor.models.gpt2 import GPT2
    from webtensor.models.gpt2.config import GPT2Config
    from webtensor.models.loader import random_arrays

    cfg = GPT2Config.preset(a.model)
    arrays = random_arrays("gpt2", cfg, 0)
    models = {"float32": GPT2.from_arrays(cfg, arrays, dev, "float32", None)}
    for nr in nrs:  # each its own weights' upload and captured decode step, built under its NR
        dev.kernel_policy = dev.kernel_policy.replace(gemv_quant_nr=nr)
        models[f"int8 NR={nr}"] = GPT2.from_arrays(cfg, arrays, dev, "int8", None)
    tok_s: dict[str, list[float]] = {k: [] for k in models}
    nr_of = {k: int(k.split("=")[1]) for k in models if "NR" in k}
    for _ in range(a.rounds):
        for name, m in models.items():
            dev.kernel_policy = dev.kernel_policy.replace(gemv_quant_nr=nr_of.get(name, 1))
            tok_s[name].append(bench_webtensor(m, [8], a.decode, 2).decode_tok_s)
    base = max(tok_s["float32"])
    print(f"{a.model} decode tokens/s (best of {a.rounds} rounds): " + "  ".join(
        f"{k} {max(v):.2f} ({max(v) / base:.2f}x)" for k, v in tok_s.items()))
