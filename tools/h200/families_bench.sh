#!/bin/bash
# H200, one device call (~8 minutes at most): the issue-31 dense families' bench presets (gemma-2-2b, gemma-3-1b,
# phi-3.5-mini; `webtensor.models.registry.presets`) on WebGPU beside HF transformers (--compare) and llama.cpp CUDA
# (llama-bench) on GGUF files of the same weights. Random weights of each preset's shape (tools/random_checkpoint.py,
# float16), cut to N_LAYER layers (default 8: the full models' weights would not be written and read three times
# within one call; every program runs the same cut, and the per-layer cost is what differs between them). The
# windows (Gemma 2: 4,096 on every other layer; Gemma 3: 512 on five of six layers), Gemma 2's soft-caps and Phi-3.5's
# longrope are all in the measured path; prompts of 128 and 1,024 tokens (Gemma 3's local layers slide at 1,024),
# 128 decode tokens.
#
# Prepare, in the repository root here (once), as for tools/h200/models_bench.sh:
#   ../shared/tools/gpu-prep gguf==0.19.0      (wgpu's wheels and the gguf package the GGUF writer needs)
#   ../shared/tools/llamacpp-build prep        (llama.cpp's source for the CUDA build, into .lcpp/)
# Run: carry [".gl", ".whl", ".lcpp"], command: bash tools/h200/families_bench.sh
#
# Order: llama.cpp's CUDA build in the background on cores 0-11 while the checkpoints are written and webtensor runs
# on cores 12-15; (1) each preset beside HF transformers (--compare), (2) after the build, each beside llama-bench on
# its GGUF. Every step is under a timeout cut to what is left of BUDGET seconds. $OUT gets a JSON report per step and
# families_bench.log; a table is printed last.
#
# A trial here without the GPU parts (any subset of the presets, small prompts):
#   LOCAL=1 DEVICE=lavapipe N_LAYER=1 PRESETS=gemma-3-1b PROMPTS=16 DECODE=4 PY=/work/main/.venv/bin/python \
#     bash tools/h200/families_bench.sh
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} DECODE=${DECODE:-128} BUDGET=${BUDGET:-470} N_LAYER=${N_LAYER:-8}
PRESETS=${PRESETS:-gemma-2-2b gemma-3-1b phi-3.5-mini} PROMPTS=${PROMPTS:-128,1024}
W=${W:-/tmp/wt-families}
log_to "$OUT/families_bench.log"
pin_cores
gpu_info name,clocks.sm,clocks.mem,driver_version

[ -z "${LLAMA_BENCH:-}" ] && [ -z "${LOCAL:-}" ] && lcpp_build_start

for m in $PRESETS; do
  stamp "checkpoint $m ($N_LAYER layers, float16, random weights)"
  timeout "$(cap 120)" "${PIN[@]}" $PY tools/random_checkpoint.py "$W/$m" --preset "$m" --dtype float16 \
    --n-layer "$N_LAYER" || { stamp "checkpoint $m failed"; exit 1; }
done

B=($PY -m webtensor.cli bench --device "$DEVICE" --dtype float16 --decode "$DECODE" --prompts "$PROMPTS"
   --processes 1 --repeats 2)
for m in $PRESETS; do bench_step "$m-compare" 100 "${PIN[@]}" "${B[@]}" -m "$W/$m" --compare; done

lcpp_build_wait 300
for m in $PRESETS; do [ -x "$LB" ] && bench_step "$m-lcpp" 80 "${B[@]}" -m "$W/$m" --llama-bench "$LB"; done

bench_summary
stamp "done"
