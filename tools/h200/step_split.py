"""H200: is the decode step bound by the host (encoding) or the GPU? (`source .gl/env.sh && python3
tools/h200/step_split.py`). For random GPT-2s, the captured greedy decode graph's commands are
(a) encoded and submitted K times without waiting (host µs a step), (b) run K times in one
submit with GPU timestamps at the start of the first pass and the end of the last (GPU µs a
step), beside (c) the decode loop's wall time a step. Output: one line per model."""

import statistics
import struct
import sys
import time

import webtensor as wt
from webtensor.models.gpt2 import GPT2, GPT2Config

K = 50


def graph_of(m, ids):
    """The recorded commands of the model's greedy one-row decode step (a runner's captured step graph)."""
    from webtensor.runtime.runner import RunRow

    runner = m.runner(1)
    runner.prefill(0, ids)
    runner.collect(runner.launch([RunRow(0, (ids[-1],), len(ids))]))  # (captures the step)
    return runner, runner._graphs[("step", 1, None, False)].graph.graph


def gpu_time(api, cmds):
    """GPU µs of `cmds` in one submit: timestamps at the first pass's start and the last's end."""
    wgpu = api._wgpu
    dev = api.device
    qs = dev.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    out = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    enc = dev.create_command_encoder()
    groups, cur = [], []
    for c in cmds:  # runs of dispatches between copies
        if c[0] == "dispatch":
            cur.append(c)
        else:
            if cur:
                groups.append(("pass", cur))
                cur = []
            groups.append(("copy", c))
    if cur:
        groups.append(("pass", cur))
    passes = [i for i, g in enumerate(groups) if g[0] == "pass"]
    for i, (kind, body) in enumerate(groups):
        if kind == "copy":
            _, src, soff, dst, doff, n = body
            enc.copy_buffer_to_buffer(src, soff, dst, doff, n)
            continue
        tw = {"query_set": qs}
        if i == passes[0]:
            tw["beginning_of_pass_write_index"] = 0
        if i == passes[-1]:
            tw["end_of_pass_write_index"] = 1
        p = enc.begin_compute_pass(timestamp_writes=tw) if len(tw) > 1 else enc.begin_compute_pass()
        for _, pipe, bg, uoff, x, y, z in body:
            p.set_pipeline(pipe[0])
            p.set_bind_group(0, bg, [uoff])
            p.dispatch_workgroups(x, y, z)
        p.end()
    enc.resolve_query_set(qs, 0, 2, out, 0)
    dev.queue.submit([enc.finish()])
    t = struct.unpack("<2Q", bytes(dev.queue.read_buffer(out)))
    return (t[1] - t[0]) / 1e3


def main():
    dev = wt.Device.wgpu()
    api = dev.backend.ctx.api
    cases = [(12, 768, 12, 50257), (12, 64, 1, 256), (48, 1600, 25, 50257)]
    for dtype in sys.argv[1:] or ("float16", "float32", "int8"):
        for L, C, H, V in cases:
            m = GPT2.random(GPT2Config(n_layer=L, n_embd=C, n_head=H, vocab_size=V), device=dev, dtype=dtype)
            ids = list(range(8))
            g = m.generate_ids(ids, 129, stop_at_eos=False)
            next(g)
            t0 = time.perf_counter()
            n = sum(1 for _ in g)
            wall = (time.perf_counter() - t0) / n * 1e6
            runner, gr = graph_of(m, ids)
            cmds = gr.commands
            nd = sum(1 for c in cmds if c[0] == "dispatch")
            hosts, gpus = [], []
            for _ in range(5):
                dev.synchronize()
                t0 = time.perf_counter()
                api.submit_async(cmds * K)
                hosts.append((time.perf_counter() - t0) / K * 1e6)
                dev.synchronize()
                gpus.append(gpu_time(api, cmds * K) / K)
            print(f"{dtype} L{L} C{C} V{V}: {nd} dispatches; wall {wall:.1f} us/step, host encode+submit "
                  f"{statistics.median(hosts):.1f} us/step, GPU {statistics.median(gpus):.1f} us/step", flush=True)
            runner.close()
            del m, gr, cmds, runner


if __name__ == "__main__":
    main()
