#!/bin/bash
# H200, one device call (9 minutes at most): issue 30 item 5, an 8B model on one GPU. Llama-3.1-8B's shapes, all
# 32 layers, as a Q4_K_M GGUF of random blocks (tools/random_gguf.py: no float checkpoint, no llama-quantize;
# ~4.9 GB), served by `webtensor serve` (paged KV cache, float16) to 64 concurrent streams of 2,048-token contexts
# (bench-serve: prompts of PROMPT tokens, each its own, then TOKENS new tokens), first with the default KV pool
# (64 whole contexts: 16 GiB), then with --kv-memory 4GiB (32,768 positions: 16 whole contexts), where admission by
# blocks and preemption must serve all 64 with none failing. A table last; under $OUT: gguf.log, server-*.log,
# bench-*.json, health-*.json, metrics-*.txt, gpu.txt.
#
#   bash tools/h200/serve_8b.sh            (device run: carry .gl and .whl)
# A local trial with a tiny model of the same kind (the same steps, small sizes):
#   LOCAL=1 DEVICE=lavapipe N_LAYER=2 SET="hidden_size=256 intermediate_size=512 vocab_size=4096 \
#     num_attention_heads=4 num_key_value_heads=2 head_dim=64" STREAMS=6 PROMPT=40 TOKENS=24 CTX=64 \
#     KV_SMALL=256KiB PY=/work/main/.venv/bin/python bash tools/h200/serve_8b.sh
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} STREAMS=${STREAMS:-64} PROMPT=${PROMPT:-256} TOKENS=${TOKENS:-1792} CTX=${CTX:-2048}
KV_SMALL=${KV_SMALL:-4GiB} BUDGET=${BUDGET:-530} GGUF=${GGUF:-/tmp/webtensor-8b.q4_k_m.gguf}
PORT=${PORT:-$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URL=http://127.0.0.1:$PORT
gpu_info name,memory.total,clocks.sm "$OUT/gpu.txt"

stamp "the model: Llama-3.1-8B's shapes${N_LAYER:+ cut to $N_LAYER layers}, Q4_K_M of random blocks"
SETS=(); [ -n "${SET:-}" ] && SETS=(--set $SET)
timeout "$(cap 150)" $PY tools/random_gguf.py "$GGUF" --preset llama-3.1-8b ${N_LAYER:+--n-layer $N_LAYER} "${SETS[@]}" \
  2>&1 | tee "$OUT/gguf.log" || exit 1

trap stop_server EXIT

run() {  # run NAME [serve args...]: a server, warm-up, the 64 streams, its health and metrics
  local name=$1; shift
  stamp "server ($name): $*"
  timeout "$(cap 400)" $PY -m webtensor.cli serve --device "$DEVICE" -m "$GGUF" --ctx-size "$CTX" --max-batch "$STREAMS" \
    --host 127.0.0.1 --port "$PORT" --grace 5 "$@" > "$OUT/server-$name.log" 2>&1 &
  SERVER=$!
  if ! wait_health "$(cap 180)" "$URL" "$SERVER"; then echo "the server did not come up"; tail -20 "$OUT/server-$name.log"; stop_server; return 1; fi
  head -3 "$OUT/server-$name.log"
  stamp "warm-up ($name)"
  timeout "$(cap 60)" $PY -m webtensor.cli bench-serve --url "$URL" --concurrency 1,"$STREAMS" --max-tokens 8 2>&1 \
    | tr '\r' '\n' | grep -v "concurrency [0-9]*:" | tail -3
  stamp "$STREAMS streams of $PROMPT + $TOKENS tokens ($name)"
  timeout "$(cap 300)" $PY -m webtensor.cli bench-serve --url "$URL" --concurrency "$STREAMS" --prompt-tokens "$PROMPT" \
    --max-tokens "$TOKENS" --json "$OUT/bench-$name.json" 2>&1 | tr '\r' '\n' | grep -v "concurrency [0-9]*:"
  url_text "$URL/health" > "$OUT/health-$name.json"
  url_text "$URL/metrics" > "$OUT/metrics-$name.txt"
  cat "$OUT/health-$name.json"
  stop_server
}

run default
run "kv-$KV_SMALL" --kv-memory "$KV_SMALL"

stamp "summary"
$PY - "$OUT" "$STREAMS" "$PROMPT" "$TOKENS" <<'EOF'
import json, re, sys
from pathlib import Path
out, streams, prompt, tokens = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"{'pool':>14} {'positions':>10} {'streams':>7} {'done':>5} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} "
      f"{'ITL p50':>8} {'p99':>8} {'preempt':>7} {'failed':>6}")
for health in sorted(out.glob("health-*.json")):
    name = health.stem.removeprefix("health-")
    kv = json.loads(health.read_text()).get("kv") or {}
    metrics = (out / f"metrics-{name}.txt").read_text()
    def metric(pattern: str) -> float:
        return sum(float(m.group(1)) for m in re.finditer(pattern + r"\S* ([0-9.e+]+)\n", metrics))
    failed = metric(r'webtensor:request_success_total\{finished_reason="error"\}')
    bench = out / f"bench-{name}.json"
    lv = json.loads(bench.read_text())["levels"][0] if bench.exists() else None
    done = lv["requests"] if lv and lv["tokens"] == lv["requests"] * tokens else "cut"
    row = (f"{lv['tok_s']:8.1f} {lv['ttft_p50_ms']:7.0f}ms {lv['ttft_p99_ms']:6.0f}ms {lv['itl_p50_ms']:6.1f}ms "
           f"{lv['itl_p99_ms']:6.1f}ms" if lv else f"{'(no bench result)':>44}")
    print(f"{name:>14} {kv.get('blocks', 0) * kv.get('block_size', 0):10,d} {streams:7d} {done!s:>5} {row} "
          f"{kv.get('preemptions', 0):7d} {failed:6.0f}")
print(f"(contexts of {prompt} + {tokens} tokens; KV {kv.get('dtype')}; done: requests that got all their tokens)")
EOF
stamp "done"
