"""What one compute dispatch costs on a WebGPU device when it does (almost) nothing.

`python -m webtensor.bench.dispatch_cost [--n 1000] [--json PATH]` (native wgpu-py only). Each variant
records `n` dispatches of a tiny kernel and times them twice: on the GPU (timestamp queries around the
passes, where the adapter has `timestamp-query`) and on the wall clock (encode + submit + wait):

- `empty/one-pass`:       a kernel that binds nothing and does nothing, n dispatches in one compute pass
- `empty/own-pass`:       the same, each dispatch in its own compute pass (one command buffer)
- `chain/one-pass`:       each dispatch reads and writes one storage buffer (a true dependency: the
                          implementation must put a barrier between them), one pass
- `chain/own-pass`:       the same, a pass each
- `independent/one-pass`: each dispatch writes a buffer of its own (no dependency between them)
- `wide-chain/one-pass`:  like chain, but 132 workgroups of 256 threads each (fills a big GPU)
- `chain/submit-each`:    one submit per dispatch

Per-dispatch figures are (time of n dispatches) / n. This is what bounds a decode step made of many
small dependent kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time
from typing import Any

EMPTY = "@compute @workgroup_size(64) fn main() {}"
CHAIN = """
@group(0) @binding(0) var<storage, read_write> buf: array<u32>;
@compute @workgroup_size(WG) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x == 0u) { buf[0] = buf[0] + 1u; }
}
"""


def _timed(dev: Any, wgpu: Any, record: Any, n_passes: int, reps: int) -> tuple[float, float | None]:
    """(wall µs, GPU µs or None) of `record(encoder, query_set)`: medians over `reps` submits."""
    has_ts = "timestamp-query" in dev.features
    walls, gpus = [], []
    for _ in range(reps + 1):  # the first is a warm-up
        qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n_passes) if has_ts else None
        t0 = time.perf_counter()
        enc = dev.create_command_encoder()
        record(enc, qs)
        out = None
        if qs is not None:
            usage = wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
            out = dev.create_buffer(size=16 * n_passes, usage=usage)
            enc.resolve_query_set(qs, 0, 2 * n_passes, out, 0)
        dev.queue.submit([enc.finish()])
        raw = bytes(dev.queue.read_buffer(out)) if out is not None else None
        if raw is None:
            probe = dev.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
            dev.queue.read_buffer(probe)
        walls.append((time.perf_counter() - t0) * 1e6)
        if raw is not None:
            ts = struct.unpack(f"<{2 * n_passes}Q", raw)
            gpus.append((ts[-1] - ts[0]) / 1e3)
    walls, gpus = walls[1:], gpus[1:]
    return statistics.median(walls), (statistics.median(gpus) if gpus else None)


def measure(n: int = 1000, reps: int = 5) -> dict[str, Any]:
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    feats = [f for f in ("timestamp-query",) if f in adapter.features]
    dev = adapter.request_device_sync(required_features=feats)

    def pipeline(code: str) -> Any:
        return dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=code),
                                                                   "entry_point": "main"})

    empty = pipeline(EMPTY)
    chain = pipeline(CHAIN.replace("WG", "64"))
    wide = pipeline(CHAIN.replace("WG", "256"))
    bufs = [dev.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE) for _ in range(n)]
    bg = [dev.create_bind_group(layout=chain.get_bind_group_layout(0),
                                entries=[{"binding": 0, "resource": {"buffer": b, "offset": 0, "size": 256}}])
          for b in bufs]
    bg_wide = dev.create_bind_group(layout=wide.get_bind_group_layout(0),
                                    entries=[{"binding": 0, "resource": {"buffer": bufs[0], "offset": 0, "size": 256}}])

    def ts(qs: Any, i: int, last: int) -> Any:
        if qs is None:
            return None
        return {"query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * last + 1}

    def one_pass(pipe: Any, groups: list[Any], wgs: int = 1) -> Any:
        def rec(enc: Any, qs: Any) -> None:
            p = enc.begin_compute_pass(timestamp_writes=ts(qs, 0, 0))
            p.set_pipeline(pipe)
            for i in range(n):
                if groups:
                    p.set_bind_group(0, groups[i % len(groups)])
                p.dispatch_workgroups(wgs)
            p.end()
        return rec

    def own_pass(pipe: Any, groups: list[Any]) -> Any:
        def rec(enc: Any, qs: Any) -> None:
            for i in range(n):
                w = None if qs is None else {"query_set": qs, "beginning_of_pass_write_index": 2 * i,
                                             "end_of_pass_write_index": 2 * i + 1}
                p = enc.begin_compute_pass(timestamp_writes=w)
                p.set_pipeline(pipe)
                if groups:
                    p.set_bind_group(0, groups[0])
                p.dispatch_workgroups(1)
                p.end()
        return rec

    results: dict[str, Any] = {"adapter": str(adapter.info.get("device")), "backend": adapter.info.get("backend_type"),
                               "n": n}
    variants = [
        ("empty/one-pass", one_pass(empty, []), 1),
        ("empty/own-pass", own_pass(empty, []), n),
        ("chain/one-pass", one_pass(chain, bg[:1]), 1),
        ("chain/own-pass", own_pass(chain, bg[:1]), n),
        ("independent/one-pass", one_pass(chain, bg), 1),
        ("wide-chain/one-pass", one_pass(wide, [bg_wide], 132), 1),
    ]
    for name, rec, passes in variants:
        wall, gpu = _timed(dev, wgpu, rec, passes, reps)
        results[name] = {"wall_us_per_dispatch": wall / n, "gpu_us_per_dispatch": None if gpu is None else gpu / n}
    # one submit per dispatch
    t0 = time.perf_counter()
    for _ in range(n):
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(chain)
        p.set_bind_group(0, bg[0])
        p.dispatch_workgroups(1)
        p.end()
        dev.queue.submit([enc.finish()])
    dev.queue.read_buffer(dev.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC))
    results["chain/submit-each"] = {"wall_us_per_dispatch": (time.perf_counter() - t0) * 1e6 / n,
                                    "gpu_us_per_dispatch": None}
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m webtensor.bench.dispatch_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args(argv)
    r = measure(a.n, a.reps)
    print(f"{r['adapter']} ({r['backend']}), {r['n']} dispatches a variant; µs per dispatch:")
    for k, v in r.items():
        if isinstance(v, dict):
            g = v["gpu_us_per_dispatch"]
            print(f"  {k:24s} wall {v['wall_us_per_dispatch']:8.2f}   gpu {'-' if g is None else f'{g:8.2f}'}")
    if a.json_path:
        with open(a.json_path, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
