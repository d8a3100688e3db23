#!/bin/bash
# H200, one device call (~8 minutes, 9 at most): decode of the quantized models of issue 28's first table,
# webtensor with int8 activations (the integer-dot GEMV, the GPU default) beside its f32 GEMV
# (WEBTENSOR_POLICY=gemv_quant_dot4=0) in fresh processes, then beside llama.cpp CUDA (llama-bench) on the same
# GGUF files. Random weights of the published shapes (tools/random_checkpoint.py: the speed does not depend on the
# values; the K-quant files, tools/random_gguf.py, are random blocks of llama.cpp's Q4_K_M mix, which llama.cpp reads
# as it reads its own):
#   smollm2-q4_1   SmolLM2-135M, Q4_1 matrices and a Q8_0 tied embedding (the published file's types)
#   qwen-q8_0      Qwen2.5-0.5B, Q8_0
#   llama1b-q4km   Llama-3.2-1B, Q4_K_M
#   llama8b-q4km   Llama-3.1-8B's shapes, 8 of its 32 layers, Q4_K_M (its real per-layer matrices and head)
#   llama1b-q5km, llama1b-q3km, llama1b-q2k, llama1b-iq4nl, llama1b-iq4xs   Llama-3.2-1B in the other mixes
#                  (issue 31 item 4; only where MODELS names them)
# Decode of 128 tokens after prompts of 128 (PROMPTS), REPEATS medians a process.
#
# Prepare, in the repository root here (once):
#   ../shared/tools/gpu-prep gguf==0.19.0      (wgpu's wheels and the gguf package the GGUF writer needs)
#   ../shared/tools/llamacpp-build prep        (llama.cpp's source for the CUDA build, into .lcpp/)
# Run: carry [".gl", ".whl", ".lcpp"], command: bash tools/h200/quant_models.sh
#
# Order: llama.cpp's CUDA build in the background on cores 0-11 (~4.5 min) while the files are written and
# webtensor runs on cores 12-15: (1) each model, ROUNDS times, dot4 then f32, one fresh process each; (2) after
# the build, each model in one more process beside llama-bench. Every step is under a timeout cut to what is left
# of BUDGET seconds. $OUT gets the JSON reports (<model>-<variant>-<round>, <model>-lcpp) and quant_models.log; a
# table is printed last, then each model's decode as GB/s of the weights a step reads (tools/h200/decode_gbs.py),
# webtensor's and llama.cpp's.
#
# A trial here without the GPU parts: LOCAL=1 DEVICE=lavapipe N_LAYER=2 MODELS="smollm2-q4_1 llama1b-q4km"
#   PROMPTS=16 DECODE=8 REPEATS=1 LLAMA_BENCH=/path/to/llama-bench PY=.venv/bin/python bash tools/h200/quant_models.sh
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} DECODE=${DECODE:-128} REPEATS=${REPEATS:-3} BUDGET=${BUDGET:-530} ROUNDS=${ROUNDS:-1}
PROMPTS=${PROMPTS:-128}
MODELS=${MODELS:-smollm2-q4_1 qwen-q8_0 llama1b-q4km llama8b-q4km}
W=${W:-/tmp/wt-qmodels}
log_to "$OUT/quant_models.log"
BENCH_TAIL=8
pin_cores
gpu_info name,clocks.sm,clocks.mem,driver_version

lcpp_build_start

# name -> (preset, GGUF matrices, GGUF embedding, layers)
declare -A PRESET=([smollm2-q4_1]=smollm2-135m [qwen-q8_0]=qwen2.5-0.5b [llama1b-q4km]=llama-3.2-1b
                   [llama8b-q4km]=llama-3.1-8b)
declare -A GTYPE=([smollm2-q4_1]=q4_1 [qwen-q8_0]=q8_0 [llama1b-q4km]=q4_k_m [llama8b-q4km]=q4_k_m)
declare -A ETYPE=([smollm2-q4_1]=q8_0 [qwen-q8_0]=q8_0 [llama1b-q4km]=q4_k_m [llama8b-q4km]=q4_k_m)
# issue 31's mixes on Llama-3.2-1B (not in the default MODELS: MODELS="llama1b-q4km llama1b-q5km llama1b-q3km ...")
for mix in q5_k_m q3_k_m q2_k iq4_nl iq4_xs; do
  m=llama1b-${mix//_/}; PRESET[$m]=llama-3.2-1b; GTYPE[$m]=$mix; ETYPE[$m]=$mix
done
declare -A LAYERS=([llama8b-q4km]=8)
for m in $MODELS; do
  nl=${N_LAYER:-${LAYERS[$m]:-}}
  stamp "writing $m (${PRESET[$m]}${nl:+, $nl layers}, ${GTYPE[$m]})"
  if [ "${GTYPE[$m]}" = "${ETYPE[$m]}" ] && [[ " q4_k_m q5_k_m q3_k_m q2_k iq4_nl iq4_xs " == *" ${GTYPE[$m]} "* ]]; then
    # (llama.cpp's mixes: random blocks written directly, no float checkpoint, seconds)
    "${PIN[@]}" $PY tools/random_gguf.py "$W/$m.gguf" --preset "${PRESET[$m]}" --mix "${GTYPE[$m]}" \
      ${nl:+--n-layer "$nl"} | tail -1 || exit 1
  else
    "${PIN[@]}" $PY tools/random_checkpoint.py "$W/$m" --preset "${PRESET[$m]}" --dtype float16 ${nl:+--n-layer "$nl"} \
      --gguf "$W/$m.gguf" --gguf-type "${GTYPE[$m]}" --gguf-embedding-type "${ETYPE[$m]}" | tail -1 || exit 1
    rm -f "$W/$m/model.safetensors"  # (only the GGUF file is measured; the float16 copy is disk and page cache)
  fi
done

B=($PY -m webtensor.cli bench --device "$DEVICE" --decode "$DECODE" --repeats "$REPEATS" --prompts "$PROMPTS")
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    bench_step "$m-dot4-$r" 90 "${PIN[@]}" "${B[@]}" -m "$W/$m.gguf" --processes 1
    WEBTENSOR_POLICY=gemv_quant_dot4=0 bench_step "$m-f32-$r" 90 "${PIN[@]}" "${B[@]}" -m "$W/$m.gguf" --processes 1
  done
done

lcpp_build_wait 400
for m in $MODELS; do [ -x "$LB" ] && bench_step "$m-lcpp" 90 "${B[@]}" -m "$W/$m.gguf" --processes 1 --llama-bench "$LB"; done

bench_summary
for m in $MODELS; do ls "$OUT/$m"-*.json >/dev/null 2>&1 && $PY tools/h200/decode_gbs.py "$W/$m.gguf" "$OUT/$m"-*.json; done
stamp "done"
