#!/bin/bash
# H200, one device call (~6.5 minutes, 7 at most): the prompt pass as replayed graphs (issue 28 item 3).
#  (1) wall time of a prompt pass (logits read back) against its GPU time (timestamps of the replayed chunk
#      graphs' dispatches), and the same chunks run eagerly (op by op: the host cost the replay removes), at
#      128 / 1,024 / 4,096 tokens for SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B's shapes cut to 8 layers
#      (random float16 weights; tools/h200/prefill_replay.py wall);
#  (2) `webtensor serve` (random SmolLM2-135M float16, 64 slots): 63 greedy streams decoding, then a 4,096-token
#      prompt (three times; twice for the comparisons); the streams' inter-event gaps (p50 / p99) before and while
#      the prompt is read, and its time to first token (prefill_replay.py itl), under the device policy's chunk
#      and budget (512 / 512), and with small (64) and big (2,048) chunks for the comparison.
# Steps run in order of importance (SmolLM2 and 1B walls, the policy's ITL, the 8B wall, the comparisons), each
# under a timeout cut to what is left of BUDGET seconds.
# $OUT gets wall-<model>.jsonl, itl-<label>.jsonl, server-<label>.log, prefill_replay.log; the tables last.
#
#   bash tools/h200/prefill_replay.sh            (device run: carry .gl and .whl)
# A local trial (tiny widths, GPU kernels on lavapipe; the shipped model served on the CPU device):
#   LOCAL=1 TINY=1 PROMPTS=16,64 SERVE_DEVICE=cpu SERVE_MODEL= STREAMS=4 LONG=200 VOCAB=4096 CTX=256 BUDGET=900 \
#     PY=/work/main/.venv/bin/python bash tools/h200/prefill_replay.sh
set -u
T0=$(date +%s)
if [ -z "${LOCAL:-}" ]; then source .gl/env.sh || exit 1; else export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"; fi
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
BUDGET=${BUDGET:-410} PROMPTS=${PROMPTS:-128,1024,4096} PORT=${PORT:-8178}
SERVE_DEVICE=${SERVE_DEVICE:-wgpu} STREAMS=${STREAMS:-63} LONG=${LONG:-4096} VOCAB=${VOCAB:-49152}
CTX=${CTX:-4352} W=${W:-/tmp/wt-prefill}
LOG=$OUT/prefill_replay.log
exec > >(tee -a "$LOG") 2>&1
stamp() { echo "== $(( $(date +%s) - T0 ))s: $*"; }
cap() { local left=$(( BUDGET - ($(date +%s) - T0) )); [ "$left" -lt 5 ] && left=5; [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv
TINY_ARG=(); [ -n "${TINY:-}" ] && TINY_ARG=(--tiny)

# (1) wall vs GPU time, each model in its own process
wall() { local name=$1 limit=$2; shift 2; stamp "wall: $name"
         timeout "$(cap "$limit")" $PY tools/h200/prefill_replay.py wall --prompts "$PROMPTS" "${TINY_ARG[@]}" "$@" \
           > "$OUT/wall-$name.jsonl" 2> "$OUT/wall-$name.err"; tail -3 "$OUT/wall-$name.err" | grep -v "^$"
         grep -v '^{' "$OUT/wall-$name.jsonl"; }
# (2) ITL of 63 streams while a 4,096-token prompt is read
SERVE_MODEL=${SERVE_MODEL-random}
M=()
if [ "$SERVE_MODEL" = random ]; then
  stamp "random SmolLM2-135M checkpoint (float16)"
  [ -f "$W/smollm2/tokenizer.json" ] || timeout "$(cap 60)" $PY tools/random_checkpoint.py "$W/smollm2" \
    --preset smollm2-135m --dtype float16 > /dev/null || exit 1
  M=(--model "$W/smollm2" --dtype float16)
elif [ -n "$SERVE_MODEL" ]; then M=(--model "$SERVE_MODEL"); fi
URL=http://127.0.0.1:$PORT
serve_itl() {  # label, rounds, then the server's extra options
  local label=$1 rounds=$2; shift 2; stamp "serve: $label $*"
  timeout "$(cap 150)" $PY -m webtensor.cli serve --device "$SERVE_DEVICE" "${M[@]}" --max-batch 64 --ctx-size "$CTX" \
    --host 127.0.0.1 --port "$PORT" --grace 2 "$@" > "$OUT/server-$label.log" 2>&1 &
  local server=$!
  if timeout "$(cap 90)" $PY -c "
import sys, time, urllib.request
while True:
    try:
        urllib.request.urlopen('$URL/health', timeout=2).read(); break
    except OSError:
        time.sleep(0.5)"; then
    timeout "$(cap 120)" $PY tools/h200/prefill_replay.py itl --url "$URL" --streams "$STREAMS" --long "$LONG" \
      --vocab "$VOCAB" --tokens $(( CTX - 24 )) --rounds "$rounds" --label "$label" > "$OUT/itl-$label.jsonl" \
      2> "$OUT/itl-$label.err"
    tail -2 "$OUT/itl-$label.err"; grep -v '^{' "$OUT/itl-$label.jsonl"
  else echo "the server did not come up"; tail -5 "$OUT/server-$label.log"; fi
  kill -TERM "$server" 2>/dev/null; for _ in $(seq 20); do kill -0 "$server" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$server" 2>/dev/null; wait "$server" 2>/dev/null
}
# in order of what matters most, each under what is left of BUDGET
wall smollm2-135m 60 --model smollm2-135m
wall llama-3.2-1b 80 --model llama-3.2-1b
serve_itl policy 3
wall llama-3.1-8b-8l 120 --model llama-3.1-8b --layers 8 --repeats 2
serve_itl chunk64 2 --prefill-chunk 64 --prefill-budget 64
serve_itl chunk2048 2 --prefill-chunk 2048 --prefill-budget 2048

stamp "summary"
echo "wall time of a prompt pass against its GPU time (ratio: wall / GPU; whole: the replay in one submit;"
echo "eager: the same chunks op by op)"
printf "%14s %6s %6s %5s %8s %9s %6s %6s %9s %6s %8s\n" model tokens chunks disp "GPU ms" "replay ms" ratio whole \
  "eager ms" ratio tok/s
for f in "$OUT"/wall-*.jsonl; do grep -v '^{' "$f" | grep -v "^#" | tail -n +2; done
echo "inter-event gaps of $STREAMS decoding streams, before and while a $LONG-token prompt is read (ms)"
printf "%22s %7s %6s %8s %8s %8s %8s %9s\n" server streams long "p50 bef" "p99 bef" "p50 dur" "p99 dur" "TTFT ms"
for f in "$OUT"/itl-*.jsonl; do grep -v '^{' "$f"; done
stamp "done"
