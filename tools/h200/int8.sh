#!/bin/bash
# H200: GPT-2 decode and prefill in int8 (q8_0) beside float16 and float32, one run.
source .gl/env.sh || exit 1
B="python3 -m webtensor.cli bench --device wgpu --decode 128 --repeats 5"
for m in gpt2 gpt2-xl; do
  for d in ${DTYPES:-int8 float16 float32}; do
    [ $m = gpt2-xl ] && [ $d = float32 ] && continue
    echo "== $m $d"
    timeout 150 $B --model $m --dtype $d --prompts 128,1023 --json $OUT/$m-$d.json 2>&1 | grep -v "it/s\]" | tail -2
  done
done
