#!/bin/bash
# A/B on the H200: this tree vs the baseline tree (.baseline/src) in one run; kernel variants.
source .gl/env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
B="python3 -m webtensor.cli bench --device wgpu --decode 128 --repeats 5"
run() { name=$1; shift; echo "== $name"; timeout 200 "$@" --json $OUT/$name.json 2>&1 | grep -v "it/s\]" | grep -v "^  " | tail -6; }
for i in 1; do
run new-124m-fp32 $B --model gpt2 --dtype float32 --prompts 128,1023 --compare --profile
PYTHONPATH=$PWD/.baseline/src:/tmp/site run base-124m-fp32 $B --model gpt2 --dtype float32 --prompts 128,1023
run new-124m-fp16 $B --model gpt2 --dtype float16 --prompts 128,1023 --compare --profile
PYTHONPATH=$PWD/.baseline/src:/tmp/site run base-124m-fp16 $B --model gpt2 --dtype float16 --prompts 128,1023
run new-xl-fp16 $B --model gpt2-xl --dtype float16 --prompts 1023
PYTHONPATH=$PWD/.baseline/src:/tmp/site run base-xl-fp16 $B --model gpt2-xl --dtype float16 --prompts 1023
done
timeout 120 python3 -m webtensor.bench.matmul_bench --m 1,128,1023 --dtypes float32,float16 --variants engine,tiled64,gemv --reps 5 --json $OUT/matmul.json 2>&1 | tail -40
