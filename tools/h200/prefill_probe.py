"""H200: where a prefill's wall time goes (`source .gl/env.sh && python3 tools/h200/prefill_probe.py`).
Times `generate_ids(ids, 1)` (what `bench` calls a prefill) at 128 and 1,023 tokens for GPT-2 124M
fp16/fp32 random weights, then a cProfile of five calls each, top entries by cumulative and own time."""

import cProfile
import pstats
import statistics
import sys
import time

import webtensor as wt
from webtensor.models.gpt2 import GPT2, GPT2Config


def main():
    dev = wt.Device.wgpu()
    dtypes = sys.argv[1:] or ["float16", "float32"]
    for dtype in dtypes:
        m = GPT2.random(GPT2Config(), device=dev, dtype=dtype)
        for T in (128, 1023):
            ids = [(7 * i) % 50257 for i in range(T)]

            def f(ids=ids, m=m):
                return next(m.generate_ids(ids, 1, stop_at_eos=False))
            f()
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                f()
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"== {dtype} T={T}: ms", [round(t, 1) for t in times], "median", round(statistics.median(times), 1),
                  flush=True)
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(5):
                f()
            pr.disable()
            st = pstats.Stats(pr)
            st.sort_stats("tottime").print_stats(12)
        del m


if __name__ == "__main__":
    main()
