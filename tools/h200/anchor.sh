#!/bin/bash
# H200: webtensor beside both anchors in one run per row: HF transformers and the hand-written torch
# step with CUDA graphs (webtensor bench --compare), GPT-2 124M fp16 and fp32, 1.5B (xl) fp16; random
# weights (the speed does not depend on them). JSON: $OUT/anchor-*.json.
# About 4 minutes; at most 7.7 if every timeout hits.
source .gl/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# the CUDA-graph step against the eager step and HF on CUDA (tests/bench/test_torch_step.py, ~30 s)
python3 -c "import pytest, hypothesis" 2>/dev/null && timeout 60 python3 -m pytest -q -p no:cacheprovider \
    tests/bench/test_torch_step.py -k cuda 2>&1 | tail -4
B="python3 -m webtensor.cli bench --device wgpu --decode 128 --repeats 5 --prompts 128,1023 --compare"
run() { name=$1; limit=$2; shift 2; echo "== $name"
        timeout $limit $B "$@" --json $OUT/anchor-$name.json 2>&1 | grep -v "it/s\]" | tail -12; }
run 124m-fp16 110 --model gpt2 --dtype float16
run 124m-fp32 110 --model gpt2 --dtype float32
run xl-fp16 180 --model gpt2-xl --dtype float16
