#!/bin/bash
# H200, the session's last run (~7 min): matmul-engine split-K A/B kernels, the serving
# run (64 streams, HF beside), then webtensor beside HF and the CUDA-graph torch step.
source .gl/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
echo "== mm_fix"; timeout 75 python3 tools/h200/mm_fix.py 2>&1 | grep -v "it/s" | tail -22
echo "== serve"; BUDGET=130 LEVELS=1,64 timeout 140 bash tools/h200/serve.sh 2>&1 | tail -25
B="python3 -m webtensor.cli bench --device wgpu --decode 128 --repeats 3 --prompts 128,1023 --compare"
echo "== anchor 124m fp16"; timeout 100 $B --model gpt2 --dtype float16 --json $OUT/final-124m-fp16.json 2>&1 | grep -v "it/s\]" | tail -8
echo "== anchor xl fp16"; timeout 120 $B --model gpt2-xl --dtype float16 --json $OUT/final-xl-fp16.json 2>&1 | grep -v "it/s\]" | tail -8
