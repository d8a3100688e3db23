"""Time the serving engine's step alone (`serve.engine.ModelEngine`, no server): B greedy decode rows a step, steady
state, for any model `load_model` reads.

    PYTHONPATH=src python tools/engine_step.py --device lavapipe --rows 1,8,32 [--model DIR]
        [--modes graph,eager] [--follow] [--profile] [--set NAME=VALUE ...]

Each width gets its own engine of B slots, B prompts of 8 tokens, then `--warmup` steps (graph
capture, kernel compiles) and `--steps` timed steps; prints the median and best ms a step and the
tokens/s of the median. `--modes graph,eager` runs an engine of each kind (replayed graphs, op by
op) side by side, alternating step by step, so that both see the same load on a noisy machine.
`--follow`: also a chain of `follow`s (each step launched before the one before it is read, as
the server runs greedy streams). `--profile` (WebGPU with timestamps): the GPU time of one replay
of each captured step graph by kernel kind. `--set NAME=VALUE` sets a planner constant of
`backends.wgpu.ops` for the run (a Python literal: e.g. GEMV_STACK_F16_MAX_ROWS=None,
ENGINE_SPLIT_K=False), for an A/B in one session. Run two trees with the same command for a
before/after."""

from __future__ import annotations

import argparse
import statistics
import time

import webtensor as wt
from webtensor.serve.engine import ModelEngine, Row, Sampling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="checkpoint dir, .gguf file or HF id (default: the shipped model)")
    ap.add_argument("--dtype", default=None, help="float32, float16, q8_0 (default: as stored)")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="default", help="comma-separated: default, graph, eager (interleaved)")
    ap.add_argument("--follow", action="store_true", help="also time a chain of follows (greedy steps fed back)")
    ap.add_argument("--profile", action="store_true", help="GPU time per kernel kind of one step (WebGPU)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a field of the device's kernel policy (backends/wgpu/policy.py) for this run (repeatable)")
    a = ap.parse_args()
    model = wt.load_model(a.model, device=a.device, dtype=a.dtype)
    for item in a.set:
        import ast

        name, _, value = item.partition("=")
        try:
            model.device.kernel_policy = model.device.kernel_policy.replace(**{name: ast.literal_eval(value)})
        except (ValueError, AttributeError) as e:
            ap.error(f"--set {item}: {e}")
    greedy = Sampling()
    modes = a.modes.split(",")
    for B in (int(v) for v in a.rows.split(",")):
        engines = [ModelEngine(model, B, use_graph={"graph": True, "eager": False}.get(m)) for m in modes]
        prompts = [Row(s, tuple(range(1 + s, 9 + s)), 0, greedy) for s in range(B)]
        last = [e.step(prompts) for e in engines]  # B prompt chunks of 8 tokens
        for e in engines:  # again, warm
            for s in range(B):
                e.release(s)
            t0 = time.perf_counter()
            e.step(prompts)
            print(f"{a.device} rows {B}: a step of {B} 8-token prompts {(time.perf_counter() - t0) * 1e3:.1f} ms",
                  flush=True)
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
            med = statistics.median(ts)
            what = "" if mode == "default" else f" {mode}"
            print(f"{a.device}{what} rows {B}: {med * 1e3:.1f} ms a step (best {min(ts) * 1e3:.1f}), "
                  f"{B / med:,.0f} tok/s", flush=True)
            if a.follow and e.use_graph:
                print_follow(e, a.warmup, a.steps)
            if a.profile:
                print_profile(e)
            e.close()


def print_follow(e: ModelEngine, warmup: int, steps: int) -> None:
    """Time a chain of `follow`s, two deep as the server runs them (each step launched before the
    one before it is read), over the positions the plain steps ran (the slots read again)."""
    greedy = Sampling()
    B = e.max_batch
    for s in range(B):
        e.release(s)
    first = e.step([Row(s, tuple(range(1 + s, 9 + s)), 0, greedy) for s in range(B)])
    h = e.launch([Row(s, (first[s],), 8, greedy) for s in range(B)])  # type: ignore[arg-type]
    for i in range(1, warmup + steps + 1):
        if i == warmup + 1:
            t0 = time.perf_counter()
        nxt = e.follow(h, [Row(s, (0,), 8 + i, greedy) for s in range(B)])  # (one step a follow)
        e.collect(h)
        h = nxt
    e.collect(h)
    per = (time.perf_counter() - t0) / steps
    print(f"  follow rows {B}: {per * 1e3:.2f} ms a step, {B / per:,.0f} tok/s", flush=True)


def print_profile(e: ModelEngine) -> None:
    """GPU µs of one replay of each captured step graph of `e`, by kernel kind (median of 5)."""
    from webtensor.backends.wgpu.profiler import _by_kind, time_commands

    for (kind, rows, picks, _masked), g in e.runner._graphs.items():
        graph = g.graph.graph
        cmds = [c for c in graph.commands if c[0] == "dispatch"]
        names = [n for c, n in zip(graph.commands, graph.names, strict=True) if c[0] == "dispatch"]
        runs = [time_commands(e.model.device.ctx, cmds) for _ in range(5)]
        per = [sorted(r[i] for r in runs)[2] for i in range(len(cmds))]
        kinds = ", ".join(f"{k} {us:.0f}" for k, us in _by_kind(names, per))
        what = f"rows {rows} (head rows {picks or rows})" if kind == "step" else f"prompt chunk {rows} (head {picks})"
        print(f"  profile {what}: {sum(per):.0f} us GPU in {len(cmds)} dispatches: {kinds}", flush=True)


if __name__ == "__main__":
    main()
