"""Time `BatchedGPT2Engine.step` alone (no server): B greedy decode rows a step, steady state.

    PYTHONPATH=src python tools/engine_step.py --device lavapipe --rows 1,8,32 [--model DIR] [--group G]
        [--modes graph,eager]

Each width gets its own engine of B slots, B prompts of 8 tokens, then `--warmup` steps (graph
capture, kernel compiles) and `--steps` timed steps; prints the median and best ms a step and the
tokens/s of the median. `--modes graph,eager` runs an engine of each kind (replayed graphs, op by
op) side by side, alternating step by step, so that both see the same load on a noisy machine.
Run two trees with the same command for a before/after."""

from __future__ import annotations

import argparse
import statistics
import time

from webtensor.models.gpt2.model import GPT2
from webtensor.serve.batched import BatchedGPT2Engine
from webtensor.serve.engine import Row, Sampling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="checkpoint dir or HF id (default: the shipped model)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--group", type=int, default=None, help="rows per forward (default: all)")
    ap.add_argument("--modes", default="default", help="comma-separated: default, graph, eager (interleaved)")
    a = ap.parse_args()
    model = GPT2.from_pretrained(a.model, device=a.device, dtype=a.dtype)
    greedy = Sampling()
    modes = a.modes.split(",")
    for B in (int(v) for v in a.rows.split(",")):
        kw = {} if a.group is None else {"group": a.group}
        engines = [BatchedGPT2Engine(model, B, use_graph={"graph": True, "eager": False}.get(m), **kw) for m in modes]
        last = [e.step([Row(s, tuple(range(1 + s, 9 + s)), 0, greedy) for s in range(B)]) for e in engines]
        pos = 8
        times: list[list[float]] = [[] for _ in engines]
        for i in range(a.warmup + a.steps):
            for k, e in enumerate(engines):
                t0 = time.perf_counter()
                last[k] = e.step([Row(s, (last[k][s],), pos, greedy) for s in range(B)])
                if i >= a.warmup:
                    times[k].append(time.perf_counter() - t0)
            pos += 1
        for mode, e, ts in zip(modes, engines, times, strict=True):
            e.close()
            med = statistics.median(ts)
            what = "" if mode == "default" else f" {mode}"
            print(f"{a.device}{what} rows {B}: {med * 1e3:.1f} ms a step (best {min(ts) * 1e3:.1f}), "
                  f"{B / med:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
