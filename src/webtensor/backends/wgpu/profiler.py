"""GPU time per kernel through timestamp queries (native wgpu only): each dispatch of a command
list runs in its own compute pass with begin / end timestamps. Used by `webtensor bench --profile`."""

from __future__ import annotations

import struct
from collections import defaultdict
from typing import Any

from .gpu_api import COPY_SRC, QUERY_RESOLVE


def time_commands(ctx: Any, commands: list[tuple]) -> list[float]:
    """Microseconds of GPU time for each dispatch in `commands` (one submit, then a readback)."""
    import wgpu

    api = ctx.api
    if "timestamp-query" not in api.features:
        raise RuntimeError(f"{api.info.name} has no timestamp-query feature: no GPU profile")
    ctx.flush()
    dev, n = api.device, len(commands)
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
    out = dev.create_buffer(size=16 * n, usage=QUERY_RESOLVE | COPY_SRC)
    enc = dev.create_command_encoder()
    for i, (_, pipe, bg, uoff, x, y, z) in enumerate(commands):
        p = enc.begin_compute_pass(timestamp_writes={
            "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
        p.set_pipeline(pipe[0])
        p.set_bind_group(0, bg, [uoff])
        p.dispatch_workgroups(x, y, z)
        p.end()
    enc.resolve_query_set(qs, 0, 2 * n, out, 0)
    api.queue.submit([enc.finish()])
    raw = struct.unpack(f"<{2 * n}Q", bytes(api.queue.read_buffer(out)))
    out.destroy()
    return [(raw[2 * i + 1] - raw[2 * i]) / 1e3 for i in range(n)]


def profile_decode_step(model: Any, ids: list[int], repeats: int = 5) -> dict[str, Any]:
    """GPU time of one GPT-2 decode step, by kernel kind (median of `repeats`), from the graph."""
    ws = model._acquire_workspace()
    try:
        graph = ws.graph
        if graph is None:
            raise RuntimeError("no decode graph on this device / model")
        list(model.generate_ids(ids, 2, stop_at_eos=False))  # fills the cache
        graph.set_state(len(ids), ids[-1])
        cmds = [*graph.step_cmds, *graph.argmax_cmds]
        runs = [time_commands(model.device.ctx, cmds) for _ in range(repeats)]
        per = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(len(cmds))]
    finally:
        model._release_workspace(ws)
    by_kind: dict[str, float] = defaultdict(float)
    for name, us in zip(graph.names, per, strict=True):
        by_kind[name] += us
    return {"kernels": sorted(by_kind.items(), key=lambda kv: -kv[1]), "total_us": sum(per),
            "dispatches": len(cmds), "per_dispatch": list(zip(graph.names, per, strict=True))}


def profile_prefill(model: Any, n_tokens: int) -> dict[str, Any]:
    """GPU time per kernel kind of one op-by-op prefill of `n_tokens` (the prompt pass)."""
    ctx = model.device.ctx
    ids = [i % model.config.vocab_size for i in range(n_tokens)]
    cache = model.new_cache()
    with ctx.lock, model.device.dispatch_scope():
        model._forward(ids, cache, last_only=True)
        cmds, names = ctx.take_pending()  # timed below instead of submitted by the scope
    pairs = [(n.split("-")[0], c) for n, c in zip(names, cmds, strict=True) if c[0] == "dispatch"]
    times = time_commands(ctx, [c for _, c in pairs])
    by_kind: dict[str, float] = defaultdict(float)
    for (name, _), us in zip(pairs, times, strict=True):
        by_kind[name] += us
    return {"kernels": sorted(by_kind.items(), key=lambda kv: -kv[1]), "total_us": sum(times),
            "dispatches": len(pairs), "tokens": n_tokens}
