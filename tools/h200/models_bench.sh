#!/bin/bash
# H200, one device call (~8 minutes, 9 at most): the Llama family's figures beside GPT-2's, webtensor (WebGPU)
# beside HF transformers, the hand-written torch step with CUDA graphs, and llama.cpp CUDA (llama-bench) on GGUF
# files of the same weights:
#   - SmolLM2-135M, random weights of its shape in the published file's types (Q4_1 matrices, a Q8_0 tied
#     embedding: tools/random_checkpoint.py --gguf; the real 98 MB file exceeds the 64 MiB a device call carries);
#     the speed does not depend on the values;
#   - the same weights in float16 (the checkpoint directory; llama-bench gets an F16 GGUF written from it);
#   - GPT-2 124M float16 (random weights, as the earlier H200 figures), for continuity.
# SmolLM2 at prefills of 128 / 1,024 / 4,096 tokens, GPT-2 at 128 / 1,023; 128 decode tokens.
#
# Prepare, in the repository root here (once):
#   ../shared/tools/gpu-prep gguf==0.19.0      (wgpu's wheels and the gguf package the GGUF writer needs)
#   ../shared/tools/llamacpp-build prep        (llama.cpp's source for the CUDA build, into .lcpp/)
# Run: carry [".gl", ".whl", ".lcpp"], command: bash tools/h200/models_bench.sh
#
# Order: llama.cpp's CUDA build starts in the background on cores 0-11 (~5 min) while webtensor runs on cores 12-15
# (GPU work; the build is CPU work): (1) each model in 3 fresh processes (min / median / max), (2) each beside HF
# and the torch step (--compare, one process). After the build, (3) each model in one more process beside
# llama-bench on its GGUF, the machine to itself. Every step is under a timeout cut to what is left of BUDGET
# seconds. $OUT gets 9 JSON reports (<model>-procs, -compare, -lcpp) and models_bench.log; a table is printed last.
#
# A trial here without the GPU parts: LOCAL=1 DEVICE=lavapipe N_LAYER=2 LLAMA_BENCH=/path/to/llama-bench \
#   SMOL_PROMPTS=16,32 GPT2_PROMPTS=16 DECODE=8 PY=.venv/bin/python bash tools/h200/models_bench.sh
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} DECODE=${DECODE:-128} REPEATS=${REPEATS:-3} BUDGET=${BUDGET:-530}
SMOL_PROMPTS=${SMOL_PROMPTS:-128,1024,4096} GPT2_PROMPTS=${GPT2_PROMPTS:-128,1023}
W=${W:-/tmp/wt-models}
log_to "$OUT/models_bench.log"
pin_cores
gpu_info name,clocks.sm,clocks.mem,driver_version
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

# llama.cpp, built beside the measurements (or the binary given)
lcpp_build_start

stamp "models: random SmolLM2-135M (float16 + its Q4_1/Q8_0 GGUF), random GPT-2 124M (float16)"
NL=(); [ -n "${N_LAYER:-}" ] && NL=(--n-layer "$N_LAYER")
"${PIN[@]}" $PY tools/random_checkpoint.py $W/smollm2 --preset smollm2-135m --dtype float16 "${NL[@]}" \
  --gguf $W/smollm2.q4_1.gguf --gguf-type q4_1 --gguf-embedding-type q8_0 || exit 1
"${PIN[@]}" $PY tools/random_checkpoint.py $W/gpt2 --preset gpt2 --dtype float16 "${NL[@]}" || exit 1

B=($PY -m webtensor.cli bench --device "$DEVICE" --decode "$DECODE" --repeats "$REPEATS")
MODELS=(smollm2-q4_1 smollm2-f16 gpt2-f16)
declare -A ARGS=([smollm2-q4_1]="-m $W/smollm2.q4_1.gguf --prompts $SMOL_PROMPTS"
                 [smollm2-f16]="-m $W/smollm2 --dtype float16 --prompts $SMOL_PROMPTS"
                 [gpt2-f16]="-m $W/gpt2 --dtype float16 --prompts $GPT2_PROMPTS")

for m in "${MODELS[@]}"; do bench_step "$m-procs" 100 "${PIN[@]}" "${B[@]}" ${ARGS[$m]} --processes 3; done
for m in "${MODELS[@]}"; do bench_step "$m-compare" 110 "${PIN[@]}" "${B[@]}" ${ARGS[$m]} --processes 1 --compare; done

lcpp_build_wait 400
stamp "llama.cpp built"
for m in "${MODELS[@]}"; do [ -x "$LB" ] && bench_step "$m-lcpp" 90 "${B[@]}" ${ARGS[$m]} --processes 1 --llama-bench "$LB"; done

bench_summary
stamp "done"
