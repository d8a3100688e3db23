#!/bin/bash
# H200: `webtensor serve` (GPT-2 124M fp16 on WebGPU, 64 slots) under bench-serve at 1/8/32/64
# concurrent 128-token streams, then HF transformers' batched generate (CUDA, fp16) of the same
# prompts for the side-by-side figure; a check that 16 concurrent greedy streams get what they get
# alone; then, as time allows, the engine step alone (one forward of B rows) and
# the single-stream decode of `webtensor bench`. Writes under $OUT;
# stops by itself (every step under `timeout`, the whole under ~7 minutes). Files (7): gpu.txt,
# engine_step.txt, server.log, exact.txt, serve.json, metrics.txt, hf.json. HF=0 stops after the server;
# EP=on|off|auto is the server's --engine-process (the engine in its own process); ROUNDS: requests
# per client at each level (default 1).
#
#   bash tools/h200/serve.sh            (device run: carry .gl and .whl)
# MODEL: a checkpoint dir, empty for the shipped model, or random:PRESET (default random:gpt2: a
# random-weight checkpoint written by tools/random_checkpoint.py; N_LAYER cuts its layers).
#   LOCAL=1 DEVICE=cpu MODEL= DTYPE=float32 MAX_BATCH=4 LEVELS=1,2 TOKENS=8 HF_DEVICE=cpu HF_DTYPE=float32 \
#     PY=.venv/bin/python bash tools/h200/serve.sh       (a small local trial on the shipped model)
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} MODEL=${MODEL-random:gpt2} DTYPE=${DTYPE:-float16} MAX_BATCH=${MAX_BATCH:-64}
LEVELS=${LEVELS:-1,8,32,64} TOKENS=${TOKENS:-128} PORT=${PORT:-8177}
HF_DEVICE=${HF_DEVICE:-cuda} HF_DTYPE=${HF_DTYPE:-float16}
if [[ "$MODEL" == random:* ]]; then  # no GPT-2 in the image's cache: a random-weight checkpoint of the preset
  DIR=/tmp/webtensor-${MODEL#random:}-random
  [ -f "$DIR/tokenizer.json" ] || $PY tools/random_checkpoint.py "$DIR" --preset "${MODEL#random:}" ${N_LAYER:+--n-layer $N_LAYER} || exit 1
  MODEL=$DIR
fi
M=(); [ -n "$MODEL" ] && M=(--model "$MODEL")
URL=http://127.0.0.1:$PORT
BUDGET=${BUDGET:-430}  # seconds for the whole script (from its start): each step's timeout is cut to what is left
gpu_info name,clocks.sm,clocks.mem "$OUT/gpu.txt"

stamp "server"
timeout $(cap 330) $PY -m webtensor.cli serve --device "$DEVICE" "${M[@]}" --dtype "$DTYPE" --max-batch "$MAX_BATCH" \
  --host 127.0.0.1 --port "$PORT" --grace 5 --engine-process "${EP:-auto}" > "$OUT/server${EP:+-$EP}.log" 2>&1 &
SERVER=$!
trap stop_server EXIT
if ! wait_health "$(cap 150)" "$URL" "$SERVER"; then echo "the server did not come up"; tail -20 "$OUT/server.log"; exit 1; fi
stamp "server up"

stamp "warm-up (graphs for the step widths)"
timeout $(cap 90) $PY -m webtensor.cli bench-serve --url "$URL" --concurrency "$LEVELS" --max-tokens 16 2>&1 \
  | tr '\r' '\n' | grep -v "concurrency [0-9]*:"

stamp "alone vs together (16 greedy streams of 32 tokens)"
timeout $(cap 90) $PY - "$URL" <<'EOF' 2>&1 | tee "$OUT/exact.txt"
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url = sys.argv[1]
model = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]
def run(i):
    body = json.dumps({"model": model, "prompt": f"Story {i}:" + " and" * (i % 7), "max_tokens": 32,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]
alone = [run(i) for i in range(16)]
with ThreadPoolExecutor(16) as ex:
    together = list(ex.map(run, range(16)))
same = sum(a == b for a, b in zip(alone, together))
print(f"{same} of 16 streams identical alone and together")
EOF

stamp "bench-serve"
echo "health: $(url_text "$URL/health")"
timeout $(cap 240) $PY -m webtensor.cli bench-serve --url "$URL" --concurrency "$LEVELS" --max-tokens "$TOKENS" \
  --rounds "${ROUNDS:-1}" --json "$OUT/serve${EP:+-$EP}.json" 2>&1 | tr '\r' '\n' | grep -v "concurrency [0-9]*:"
echo "health: $(url_text "$URL/health")"
url_text "$URL/metrics" > "$OUT/metrics.txt"
stop_server
trap - EXIT
stamp "server stopped"

[ "${HF:-1}" = 0 ] && { stamp "done (HF=0: no HF, no engine step)"; exit 0; }
stamp "HF transformers batched generate ($HF_DEVICE, $HF_DTYPE)"
timeout $(cap 150) $PY -m webtensor.cli bench-serve --hf-only "${M[@]}" --concurrency "$LEVELS" --max-tokens "$TOKENS" \
  --hf-device "$HF_DEVICE" --hf-dtype "$HF_DTYPE" --json "$OUT/hf.json" 2>&1 | tr '\r' '\n' | grep -v "Loading weights"
stamp "engine step alone (one forward of B rows)"
timeout $(cap 120) $PY tools/engine_step.py --device "$DEVICE" "${M[@]}" --dtype "$DTYPE" --rows "$LEVELS" 2>&1 \
  | grep -v Warn | tee "$OUT/engine_step.txt"

stamp "single-stream decode (webtensor bench: compare with BENCHMARKS' earlier figures)"
timeout $(cap 120) $PY -m webtensor.cli bench --device "$DEVICE" "${M[@]}" --dtype "$DTYPE" --prompts "${PROMPT:-128}" \
  --decode "$TOKENS" --repeats 3 2>&1 | grep -v "it/s\]" | tail -4 | tee -a "$OUT/engine_step.txt"

stamp "done"
