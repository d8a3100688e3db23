"""H200: where a decode step's time goes (`source .gl/env.sh && python3 tools/h200/step_probe.py`,
$OUT set). Decode tok/s of random GPT-2s of varying depth and width: the slope over layers at
GPT-2's width is a layer's cost; at width 64 (negligible bytes) it is the fixed cost of a layer's
dispatches. Results: $OUT/step_probe.json and one line per case."""

import json
import os
import sys

import webtensor as wt
from webtensor.models.gpt2 import GPT2
from webtensor.models.gpt2.config import GPT2Config

sys.path.insert(0, os.path.dirname(__file__))
from harness import decode_tok_s  # noqa: E402


def main():
    dev = wt.Device.wgpu()
    res = {}
    cases = [(1, 768, 12, 50257), (6, 768, 12, 50257), (12, 768, 12, 50257), (12, 768, 12, 256),
             (1, 64, 1, 256), (12, 64, 1, 256), (24, 64, 1, 256), (48, 1600, 25, 50257)]
    for dtype in ("float16", "float32", "int8"):
        for L, C, H, V in cases:
            if L == 48 and dtype == "float32":
                continue
            m = GPT2.random(GPT2Config(n_layer=L, n_embd=C, n_head=H, vocab_size=V), device=dev, dtype=dtype)
            tps = decode_tok_s(m)
            res[f"{dtype}/L{L}/C{C}/V{V}"] = {"tok_s": tps, "us_step": 1e6 / tps}
            print(dtype, L, C, V, f"{tps:.0f} tok/s {1e6 / tps:.1f} us/step", flush=True)
            del m
    with open(f"{os.environ['OUT']}/step_probe.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
