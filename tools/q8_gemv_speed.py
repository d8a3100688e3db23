"""Decode GEMV time, float32 against q8_0 (gemv_q8.wgsl with NR outputs a thread on CPU adapters), on
GPT-2 124M's decode shapes (one row of activations), side by side in one run.

    python tools/q8_gemv_speed.py [--device lavapipe] [--nr 1,2,4] [--reps 5] [--calls 20]
        [--decode 16 [--model gpt2]]

Each case captures `calls` launches of one product into a graph, replays it `reps` times (wall
clock, after a warm-up) and prints the median per launch in µs; the rows interleave the variants so
that they share the machine's noise. With --decode N, then GPT-2's greedy decode tokens/s (`webtensor
bench`'s measurement: N tokens after a prompt of 8, best of --reps 2) in float32 and in int8 with each
NR, the models built once per variant and run in turn. (PYTHONPATH selects the tree.)"""

import argparse
import statistics
import time

import numpy as np

import webtensor as wt
from webtensor.backends.wgpu import q8_ops
from webtensor.formats import q8_0

SHAPES = [(768, 2304), (768, 3072), (3072, 768), (768, 50257)]  # (K, N): qkv, fc, proj, LM head

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--device", default="lavapipe")
p.add_argument("--nr", default="1,2,4", help="gemv_q8 outputs per thread (CPU adapters), comma-separated")
p.add_argument("--reps", type=int, default=5)
p.add_argument("--calls", type=int, default=20)
p.add_argument("--decode", type=int, default=0, help="also GPT-2 decode tokens/s over this many tokens")
p.add_argument("--model", default="gpt2", help="a GPT-2 preset (random weights) for --decode")
p.add_argument("--rounds", type=int, default=2, help="--decode: rounds over the variants")
a = p.parse_args()
dev = wt.Device.parse(a.device)
nrs = [int(x) for x in a.nr.split(",")]
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


total = {"float32": 0.0, **{f"q8 NR={nr}": 0.0 for nr in nrs}}
for K, N in SHAPES:
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
    x = wt.tensor(rng.standard_normal((1, K)).astype(np.float32), device=dev)
    wf = wt.tensor(w, device=dev).T  # (K, N) view of k-major storage, as GPT-2's weights on WebGPU
    wq = q8_ops.upload(dev, q8_0.quantize(w))
    row = {"float32": time_us(lambda x=x, wf=wf: wt.linear(x, wf))}
    ref = wt.linear(x, wq).numpy()
    for nr in nrs:
        dev.kernel_policy = dev.kernel_policy.replace(gemv_q8_nr=nr)
        assert np.array_equal(wt.linear(x, wq).numpy(), ref)  # every NR: the same bits
        row[f"q8 NR={nr}"] = time_us(lambda x=x, wq=wq: wt.linear(x, wq))
    for k, v in row.items():
        total[k] += v
    print(f"K={K:5d} N={N:6d}: " + "  ".join(f"{k} {v:8.0f}" for k, v in row.items()))
print("sum of the four:  " + "  ".join(f"{k} {v:8.0f} ({total['float32'] / v:.2f}x fp32)" for k, v in total.items()))

if a.decode:
    from webtensor.bench.gpt2_bench import bench_webtensor
    from webtensor.models.gpt2 import GPT2
    from webtensor.models.gpt2.config import GPT2Config
    from webtensor.models.gpt2.model import random_arrays

    cfg = GPT2Config.preset(a.model)
    arrays = random_arrays(cfg, 0)
    models = {"float32": GPT2.from_arrays(cfg, arrays, dev, "float32", None)}
    for nr in nrs:  # each its own weights' upload and captured decode step, built under its NR
        dev.kernel_policy = dev.kernel_policy.replace(gemv_q8_nr=nr)
        models[f"int8 NR={nr}"] = GPT2.from_arrays(cfg, arrays, dev, "int8", None)
    tok_s: dict[str, list[float]] = {k: [] for k in models}
    nr_of = {k: int(k.split("=")[1]) for k in models if "NR" in k}
    for _ in range(a.rounds):
        for name, m in models.items():
            dev.kernel_policy = dev.kernel_policy.replace(gemv_q8_nr=nr_of.get(name, 1))
            tok_s[name].append(bench_webtensor(m, [8], a.decode, 2).decode_tok_s)
    base = max(tok_s["float32"])
    print(f"{a.model} decode tokens/s (best of {a.rounds} rounds): " + "  ".join(
        f"{k} {max(v):.2f} ({max(v) / base:.2f}x)" for k, v in tok_s.items()))
