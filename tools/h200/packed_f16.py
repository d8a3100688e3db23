"""H200: float16 GEMV weights read as u32 pairs vs vec4<f16>, decode tok/s, interleaved
(`source .gl/env.sh && python3 tools/h200/packed_f16.py`; $OUT/packed_f16.json)."""

import json
import os
import sys

import webtensor as wt
from webtensor.models.gpt2 import GPT2
from webtensor.models.gpt2.config import GPT2Config

sys.path.insert(0, os.path.dirname(__file__))
from sweep import decode_tok_s  # noqa: E402


def main():
    dev = wt.Device.wgpu()
    res = {"adapter": dev.describe()}
    for name, cfg in (("124m", GPT2Config()), ("xl", GPT2Config(n_embd=1600, n_layer=48, n_head=25))):
        m = GPT2.random(cfg, device=dev, dtype="float16")
        for rnd in range(2):
            for packed in (True, False):
                dev.kernel_policy = dev.kernel_policy.replace(gemv_packed_f16=packed)
                m._workspaces.clear()
                tps = decode_tok_s(m)
                res.setdefault(f"{name}/packed={packed}", []).append(tps)
                print(name, "round", rnd, "packed", packed, round(tps, 1), flush=True)
        del m
    with open(f"{os.environ['OUT']}/packed_f16.json", "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
