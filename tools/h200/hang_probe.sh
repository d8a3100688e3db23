#!/bin/bash
# H200: which kernel policy hangs a quantized model's 128-token prompt (a GPU hang seen 2026-12-05: the submit of
# SmolLM2 Q4_1's prefill never finished, dot4 and f32 alike). Each probe: a fresh process, 25 s at most.
source .gl/env.sh || exit 1
M=/tmp/wt-qmodels/smollm2-q4_1.gguf
[ -f $M ] || python3 tools/random_checkpoint.py /tmp/wt-qmodels/smollm2-q4_1 --preset smollm2-135m --dtype float16 \
  --gguf $M --gguf-type q4_1 --gguf-embedding-type q8_0 | tail -1
probe() {
  local n=$1; shift
  local t0=$SECONDS
  WEBTENSOR_POLICY="$*" timeout -s KILL ${LIMIT:-25} python3 -c "
import webtensor as wt, numpy as np, sys
m = wt.load_model('$M', 'wgpu', kv_dtype='${KV:-float16}' if '${KV:-}' else None)
l = m.logits(list(range(100, 100 + $n)))
print('ok', l.shape, float(np.abs(l).max()))" 2>&1 | tail -1
  echo "   ^ n=$n policy='$*' KV=${KV:-default} $((SECONDS - t0))s"
}
for pol in "${@:-engine=0}"; do probe "${N:-128}" $pol; done
