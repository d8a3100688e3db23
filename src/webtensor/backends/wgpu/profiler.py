"""GPU time per kernel through timestamp queries (native wgpu only): each dispatch of a command
list runs in its own compute pass with begin / end timestamps (`GpuApi.timestamps`). Used by
`webtensor bench --profile` on the decode step's graph and on the prompt pass."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .gpu_api import Command


def kernel_kind(name: str) -> str:
    """A kernel variant's label ("gemv-32u-true-...") shortened to its file, "+ln" for fused norms."""
    base = name.split("-")[0]
    return base + ("+ln" if base == "gemv" and "-true" in name else "")


def time_commands(ctx: Any, commands: list[Command]) -> list[float]:
    """Microseconds of GPU time for each dispatch in `commands` (one submit, then a readback)."""
    with ctx.lock:
        ctx.flush()
        times: list[float] | None = ctx.api.timestamps([c for c in commands if c[0] == "dispatch"])
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
        graph = runner._graphs[("step", 1, None, False)].graph.graph
        cmds = [c for c in graph.commands if c[0] == "dispatch"]
        names = [n for c, n in zip(graph.commands, graph.names, strict=True) if c[0] == "dispatch"]
        runs = [time_commands(model.device.ctx, cmds) for _ in range(repeats)]
        per = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(len(cmds))]
    finally:
        runner.close()
    return {"kernels": _by_kind(names, per), "total_us": sum(per), "dispatches": len(cmds),
            "per_dispatch": [(kernel_kind(n), us) for n, us in zip(names, per, strict=True)]}


def profile_prefill(model: Any, n_tokens: int) -> dict[str, Any]:
    """GPU time per kernel kind of one prompt pass of `n_tokens` as `ModelRunner.prefill` runs it: each chunk's
    replayed graph, its inputs loaded, timed in turn (positions and attention lengths as in the real pass)."""
    ids = [i % model.vocab_size for i in range(n_tokens)]
    runner = model.runner(1, bucketed=False)
    try:
        runner.prefill(0, ids)  # (every chunk's graph captured)
        names: list[str] = []
        times: list[float] = []
        chunks = runner.chunks(0, n_tokens)
        for a, b in chunks:
            g = runner.load_chunk(0, tuple(ids[a:b]), a, "last" if b == n_tokens else "none").graph.graph
            cmds = [c for c in g.commands if c[0] == "dispatch"]
            names += [n for c, n in zip(g.commands, g.names, strict=True) if c[0] == "dispatch"]
            times += time_commands(model.device.ctx, cmds)
    finally:
        runner.close()
    return {"kernels": _by_kind(names, times), "total_us": sum(times), "dispatches": len(times), "tokens": n_tokens,
            "chunks": len(chunks)}


GATE_SECONDS = 0.3  # GPU work before a timed run (see keep_busy)


def keep_busy(device: Any, seconds: float = GATE_SECONDS) -> None:
    """Keep `device`'s GPU busy for `seconds` of wall time, then wait for it (a no-op on software
    adapters). GPU clock governors lower the clock while the GPU idles and raise it under load: on
    the H200 (nvidia-smi every 50 ms, tools/h200/slowdown.py) the SM clock steps down from 1,980 MHz
    every ~200 ms of idling, to ~400 MHz, and is back at 1,980 within ~100-200 ms of steady work.
    A kernel timed right after host work (uploading weights, reading a large output back) runs at
    whatever clock the idling left: the 4-5x "per-process slowdown" of issue 25 (1,980 / 405 =
    4.9). Benchmarks call this before each timed run, so every figure is taken at the clock a
    busy GPU runs at, in any process. The ramp-up takes 0.1 to over 0.3 s (tools/h200/slowdown.py
    --idle: once in four a 0.3 s burst still left 570 MHz), so where NVML reads the clock (an NVIDIA
    GPU, the optional `pynvml` module) the burst goes on until the SM clock is within 10 % of its
    maximum, for at most MAX_GATE_SECONDS."""
    import time

    from ... import ops
    from ...tensor import tensor

    ctx = device.ctx
    if ctx.info.is_software:
        return
    x = ctx.__dict__.get("_busy_operand")
    if x is None:
        import numpy as np

        x = ctx.__dict__["_busy_operand"] = tensor(
            np.random.default_rng(0).standard_normal((1024, 1024), np.float32) * 0.03, device=device)
    t0 = time.perf_counter()
    if "_sm_clock" not in ctx.__dict__:
        ctx.__dict__["_sm_clock"] = _sm_clock(ctx)
    clock = ctx.__dict__["_sm_clock"]
    while True:
        with device.dispatch_scope():
            for _ in range(16):  # ~2 GFLOP each: milliseconds at any clock
                ops.matmul(x, x)
        device.synchronize()
        t = time.perf_counter() - t0
        if t >= MAX_GATE_SECONDS or (t >= seconds and (clock is None or clock())):
            return


MAX_GATE_SECONDS = 2.0


def _sm_clock(ctx: Any) -> Any:
    """A function telling whether the adapter's SM clock is within 10 % of its maximum (NVML, for
    a lone NVIDIA GPU whose name matches the adapter's), else None."""
    if "nvidia" not in ctx.info.name.lower():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() != 1:
            return None
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name.lower() not in ctx.info.name.lower() and ctx.info.name.lower() not in name.lower():
            return None
        top = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
        return lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) >= 0.9 * top
    except Exception:  # no NVML (module, library or driver)
        return None
