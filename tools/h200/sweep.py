"""H200 sweeps in one run (`source .gl/env.sh && python3 tools/h200/sweep.py`, $OUT set): prefill
with the matmul engine / prefill attention switched on and off, and GEMV lanes for decode.
Results: $OUT/sweep.json and one line per case on stdout."""

import json
import os
import statistics
import sys
import time

import webtensor as wt
from webtensor.backends.wgpu import ops as gops
from webtensor.models.gpt2 import GPT2
from webtensor.models.gpt2.config import GPT2Config

sys.path.insert(0, os.path.dirname(__file__))
from harness import median_time  # noqa: E402


def decode_tok_s(m, n=128):
    ids = list(range(8))

    def run():
        g = m.generate_ids(ids, n + 1, stop_at_eos=False)
        next(g)
        t0 = time.perf_counter()
        for _ in g:
            pass
        return time.perf_counter() - t0

    run()
    return n / statistics.median(run() for _ in range(3))


def main():
    dev = wt.Device.wgpu()
    res = {"adapter": dev.describe()}
    orig_lanes = gops.gemv_lanes
    for dtype in ("float32", "float16"):
        m = GPT2.random(GPT2Config(), device=dev, dtype=dtype)  # GPT-2 124M shapes
        for eng in (True, False):
            for pre in (True, False):
                dev.kernel_policy = dev.kernel_policy.replace(engine=eng, prefill=pre)
                for T in (128, 1023):
                    ids = [i % 50257 for i in range(T)]
                    s = median_time(lambda ids=ids, m=m: next(m.generate_ids(ids, 1, stop_at_eos=False)))
                    res[f"prefill/{dtype}/engine={eng}/prefill={pre}/T={T}"] = T / s
                    print(dtype, eng, pre, T, round(T / s), flush=True)
        dev.kernel_policy = dev.kernel_policy.replace(engine=True, prefill=True)
        for lanes in (0, 32, 64, 128, 256):
            for lnl in (32, 64, 128):
                if lanes == 0 and lnl != 32:
                    continue

                def forced(ctx, K, ln=False, lanes=lanes, lnl=lnl):
                    return orig_lanes(ctx, K, ln) if lanes == 0 else (lnl if ln else lanes)
                gops.gemv_lanes = forced
                m._workspaces.clear()  # new graphs with the new kernels
                tps = res[f"decode/{dtype}/lanes={lanes or 'auto'}/ln_lanes={lnl}"] = decode_tok_s(m)
                print(dtype, "lanes", lanes, "ln", lnl, round(tps), flush=True)
        gops.gemv_lanes = orig_lanes
        if dev.ctx.has_subgroups:
            saved, dev.ctx.subgroup_size = dev.ctx.subgroup_size, 32  # NVIDIA's warp
            m._workspaces.clear()
            tps = res[f"decode/{dtype}/subgroup32"] = decode_tok_s(m)
            print(dtype, "subgroup 32", round(tps), flush=True)
            dev.ctx.subgroup_size = saved
        del m
    with open(f"{os.environ['OUT']}/sweep.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
