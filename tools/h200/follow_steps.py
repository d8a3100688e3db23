"""H200, one device call (~3 minutes): what reading back every greedy token costs on a real GPU. The page shows a
reply token by token (`generate_ids(..., follow_steps=1)`: each step's token read back as soon as it is chosen, the
next step already queued); the CLI, the server and the API read back up to 16 steps at once (RING_STEPS). Greedy
decode tok/s of the same prompt with follow_steps 16, 1 and 2, interleaved round by round in one process (the
same clock state for each), on random SmolLM2-135M weights in its published types (Q4_1 matrices, Q8_0 embedding)
and GPT-2 124M float16.

Prepare once, in the repository root here, as for models_bench.sh: ../shared/tools/gpu-prep gguf==0.19.0
(the GGUF writer random_checkpoint.py uses). Run: carry [".gl", ".whl"], command:
    source .gl/env.sh && python tools/h200/follow_steps.py
(~2-3 minutes: two random checkpoints written, 2 x 3 x 5 runs of 256 tokens.)

A trial here without the GPU: DEVICE=lavapipe N_LAYER=2 DECODE=16 ROUNDS=2 python tools/h200/follow_steps.py
Prints one line a measurement, a table last; writes follow_steps.json to $OUT.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import webtensor as wt
from webtensor.backends.wgpu.profiler import keep_busy

DEVICE = os.environ.get("DEVICE", "wgpu")
DECODE = int(os.environ.get("DECODE", 256))
ROUNDS = int(os.environ.get("ROUNDS", 5))
STEPS = (16, 1, 2)
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp())
OUT.mkdir(parents=True, exist_ok=True)
W = Path(os.environ.get("W", "/tmp/wt-follow"))


def models() -> list[tuple[str, Path, str | None]]:
    """(name, source, dtype) of the random checkpoints, written once."""
    tool = Path(__file__).resolve().parents[1] / "random_checkpoint.py"
    nl = ["--n-layer", os.environ["N_LAYER"]] if os.environ.get("N_LAYER") else []
    smol, gpt2 = W / "smollm2", W / "gpt2"
    if not (W / "smollm2.q4_1.gguf").is_file():
        subprocess.run([sys.executable, str(tool), str(smol), "--preset", "smollm2-135m", "--dtype", "float16", *nl,
                        "--gguf", str(W / "smollm2.q4_1.gguf"), "--gguf-type", "q4_1",
                        "--gguf-embedding-type", "q8_0"], check=True)
    if not (gpt2 / "config.json").is_file():
        subprocess.run([sys.executable, str(tool), str(gpt2), "--preset", "gpt2", "--dtype", "float16", *nl],
                       check=True)
    return [("smollm2-135m Q4_1", W / "smollm2.q4_1.gguf", None), ("gpt2-124m float16", gpt2, "float16")]


def decode_tps(model: wt.LanguageModel, ids: list[int], follow: int) -> float:
    """Greedy tok/s over DECODE tokens after the first (EOS not stopping: random weights)."""
    gen = model.generate_ids(ids, DECODE + 1, stop_at_eos=False, follow_steps=follow)
    next(gen)  # the prompt pass and the first token
    t0 = time.perf_counter()
    n = sum(1 for _ in gen)
    return n / (time.perf_counter() - t0)


def main() -> None:
    dev = wt.Device.parse(DEVICE)
    print(dev.describe(), flush=True)
    rows, raw = [], {}
    for name, source, dtype in models():
        m = wt.load_model(source, dev, dtype)
        ids = list(range(10, 42))
        m.generate(ids, 8, stop_at_eos=False)  # every pipeline compiled
        got: dict[int, list[float]] = {f: [] for f in STEPS}
        for r in range(ROUNDS):
            for f in STEPS:
                if DEVICE != "cpu":
                    keep_busy(dev)
                got[f].append(decode_tps(m, ids, f))
                print(f"{name} round {r} follow_steps={f}: {got[f][-1]:.1f} tok/s", flush=True)
        raw[name] = got
        base = statistics.median(got[16])
        rows.append((name, *(statistics.median(got[f]) for f in STEPS), *(statistics.median(got[f]) / base
                                                                          for f in STEPS[1:])))
        del m
    (OUT / "follow_steps.json").write_text(json.dumps(dict(device=dev.describe(), decode=DECODE, rounds=ROUNDS,
                                                           tok_s=raw), indent=1))
    print(f"\n{dev.describe()}; greedy decode of {DECODE} tokens, median of {ROUNDS} interleaved rounds (tok/s)")
    print("| model | ring 16 | 1 (the page) | 2 | 1 / 16 | 2 / 16 |\n|---|---:|---:|---:|---:|---:|")
    for name, a, b, c, rb, rc in rows:
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {rb:.2f}x | {rc:.2f}x |")


if __name__ == "__main__":
    main()
