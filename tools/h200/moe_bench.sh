#!/bin/bash
# H200, one device call (<= 8 minutes): the mixture-of-experts family's decode and prefill beside llama.cpp CUDA
# (llama-bench) on the same GGUF file: a Qwen3-30B-A3B-shaped model (the `qwen3-30b-a3b` preset: 128 experts of
# width 768, 8 a token, hidden 2,048, 32 / 4 heads of 128) cut to N_LAYER layers (default 2), random weights
# (the speed does not depend on the values) written as GGUF with q4_0 matrices — the stacked ffn_*_exps too —
# and a q8_0 embedding / head (webtensor's writer quantizes the 32-value types; Q4_K_M's K-quants are read
# but not written: q4_0 has Q4_K's 4.5 bits a weight). webtensor reads the experts quantized, routes on the
# device and runs each token through its 8 experts (ops.expert_linear); llama.cpp runs MUL_MAT_ID.
# Prefills of 128 / 512 tokens, 64 decode tokens.
#
# Prepare, in the repository root here (once):
#   ../shared/tools/gpu-prep gguf==0.19.0      (wgpu's wheels and the gguf package the GGUF writer needs)
#   ../shared/tools/llamacpp-build prep        (llama.cpp's source for the CUDA build, into .lcpp/)
# Run: carry [".gl", ".whl", ".lcpp"], command: bash tools/h200/moe_bench.sh
#
# Order: llama.cpp's CUDA build starts in the background on cores 0-11 (~5 min) while the random checkpoint is
# written and webtensor runs on cores 12-15; after the build, llama-bench beside webtensor once more on the
# machine to itself. Every step is under a timeout cut to what is left of BUDGET seconds. $OUT gets the JSON
# reports (moe-procs, moe-lcpp) and moe_bench.log; a table is printed last.
#
# A trial here without the GPU parts (a smaller shape, no llama.cpp):
#   LOCAL=1 NO_LCPP=1 DEVICE=lavapipe N_LAYER=1 PROMPTS=16 DECODE=4 PY=/work/main/.venv/bin/python \
#   SET="hidden_size=256 moe_intermediate_size=64 num_experts=16 vocab_size=2048 num_attention_heads=4 \
#   num_key_value_heads=2 head_dim=64" bash tools/h200/moe_bench.sh
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} DECODE=${DECODE:-64} REPEATS=${REPEATS:-3} BUDGET=${BUDGET:-450}
PROMPTS=${PROMPTS:-128,512} N_LAYER=${N_LAYER:-2} SET=${SET:-}
W=${W:-/tmp/wt-moe}
log_to "$OUT/moe_bench.log"
pin_cores
gpu_info name,clocks.sm,clocks.mem,driver_version

[ -z "${LLAMA_BENCH:-}" ] && [ -z "${NO_LCPP:-}" ] && lcpp_build_start

stamp "model: random qwen3-30b-a3b, $N_LAYER layers, GGUF q4_0 (embedding / head q8_0)"
SETS=(); for s in $SET; do SETS+=(--set "$s"); done
"${PIN[@]}" timeout "$(cap 200)" $PY tools/random_checkpoint.py $W/qwen3moe --preset qwen3-30b-a3b --dtype float16 \
  --n-layer "$N_LAYER" "${SETS[@]}" --gguf $W/qwen3moe.q4_0.gguf --gguf-type q4_0 --gguf-embedding-type q8_0 || exit 1
rm -rf $W/qwen3moe  # (the float16 directory: only the GGUF file is measured)

B=($PY -m webtensor.cli bench --device "$DEVICE" --decode "$DECODE" --repeats "$REPEATS" -m $W/qwen3moe.q4_0.gguf
   --prompts "$PROMPTS")
bench_step moe-procs 120 "${PIN[@]}" "${B[@]}" --processes 2

lcpp_build_wait 330
[ -x "$LB" ] && [ -z "${NO_LCPP:-}" ] && bench_step moe-lcpp 120 "${B[@]}" --processes 1 --llama-bench "$LB"

bench_summary
stamp "done"
