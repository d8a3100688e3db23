"""Prompt attention with and without a sliding window, in each WebGPU kernel that takes one (attention_flash: CPU
adapters; attention_tiled: GPUs, forced here with the GPU kernel policy): T queries over T keys, causal, the minimum
of `--reps` timed calls (each read back) after a warm-up. What a window saves: the kernels start at the key tile of
the first key a block sees.

    python tools/attention_window.py [--device lavapipe] [--T 1024] [--heads 4] [--kv-heads 1] [--head-dim 64]
        [--window 128] [--reps 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import webtensor as wt

KERNELS = {"attention_flash": dict(tiled=False, flash_min_queries=1),
           "attention_tiled": dict(tiled=True, tiled_min_queries=1, gpu_style=True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="lavapipe")
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    dev = wt.Device.parse(a.device)
    if dev.kind != "wgpu":
        raise SystemExit(f"--device {a.device!r}: a WebGPU device is needed (the kernels are what is timed)")
    rng = np.random.default_rng(0)
    q = wt.tensor(rng.standard_normal((a.T, a.heads, a.head_dim), np.float32), device=dev)
    k, v = (wt.tensor(rng.standard_normal((a.T, a.kv_heads, a.head_dim), np.float32), device=dev) for _ in "kv")
    base = dev.kernel_policy
    print(f"{dev.describe()}: T = S = {a.T}, {a.heads} heads on {a.kv_heads} KV heads, D = {a.head_dim}")
    print("| kernel | full causal ms | window", a.window, "ms | ratio |")
    print("|---|---:|---:|---:|")
    for name, policy in KERNELS.items():
        dev.kernel_policy = base.replace(**policy)
        ms = []
        for window in (None, a.window):
            wt.attention(q, k, v, window=window).numpy()  # (compiled, warm)
            ts = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                wt.attention(q, k, v, window=window).numpy()
                ts.append(time.perf_counter() - t0)
            ms.append(1e3 * min(ts))
        print(f"| {name} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[0] / ms[1]:.2f}x |")
    dev.kernel_policy = base


if __name__ == "__main__":
    main()
