"""GPU time per kernel through timestamp queries (native wgpu only): each dispatch of a command
list runs in its own compute pass with begin / end timestamps (`GpuApi.timestamps`). Used by
`webtensor bench --profile` on the decode step's graph and on the prompt pass."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def kernel_kind(name: str) -> str:
    """A kernel variant's label ("gemv-32u-true-...") shortened to its file, "+ln" for fused norms."""
    base = name.split("-")[0]
    return base + ("+ln" if base == "gemv" and "-true" in name else "")


def time_commands(ctx: Any, commands: list[tuple]) -> list[float]:
    """Microseconds of GPU time for each dispatch in `commands` (one submit, then a readback)."""
    with ctx.lock:
        ctx.flush()
        times = ctx.api.timestamps([c for c in commands if c[0] == "dispatch"])
    if times is None:
        raise RuntimeError(f"{ctx.info.name} has no timestamp-query feature: no GPU profile")
    return times


def _by_kind(names: list[str], times: list[float]) -> list[tuple[str, float]]:
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in zip(names, times, strict=True):
        by_kind[kernel_kind(name)] += us
    return sorted(by_kind.items(), key=lambda kv: -kv[1])


def profile_decode_step(model: Any, ids: list[int], repeats: int = 5) -> dict[str, Any]:
    """GPU time of one greedy decode step (the replayed graph), by kernel kind (median of `repeats`)."""
    from ...runtime.runner import RunRow

    runner = model.runner(1)
    try:
        runner.prefill(0, ids)
        runner.collect(runner.launch([RunRow(0, (ids[-1],), len(ids))]))  # the greedy step's graph, captured
        graph = runner._graph(1, None, False).graph.graph
        cmds = [c for c in graph.commands if c[0] == "dispatch"]
        names = [n for c, n in zip(graph.commands, graph.names, strict=True) if c[0] == "dispatch"]
        runs = [time_commands(model.device.ctx, cmds) for _ in range(repeats)]
        per = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(len(cmds))]
    finally:
        runner.close()
    return {"kernels": _by_kind(names, per), "total_us": sum(per), "dispatches": len(cmds),
            "per_dispatch": [(kernel_kind(n), us) for n, us in zip(names, per, strict=True)]}


def profile_prefill(model: Any, n_tokens: int) -> dict[str, Any]:
    """GPU time per kernel kind of one prompt pass of `n_tokens`, recorded as a graph."""
    from ...runtime.batch import StepBatch
    from ...runtime.runner import int_tensor

    dev = model.device
    ids = [i % model.vocab_size for i in range(n_tokens)]
    cache = model.new_cache()
    batch = StepBatch(int_tensor(ids, dev), int_tensor(list(range(n_tokens)), dev), int_tensor([0] * n_tokens, dev),
                      span=(0, 0), last_only=True)
    g = dev.capture(lambda: model.forward(batch, cache))
    try:
        cmds = [c for c in g.graph.commands if c[0] == "dispatch"]
        names = [n for c, n in zip(g.graph.commands, g.graph.names, strict=True) if c[0] == "dispatch"]
        times = time_commands(dev.ctx, cmds)
    finally:
        g.release()
    return {"kernels": _by_kind(names, times), "total_us": sum(times), "dispatches": len(cmds), "tokens": n_tokens}
