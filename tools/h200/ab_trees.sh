#!/bin/bash
# H200, one device call (~4 minutes): an A/B of source trees on the same random weights, interleaved process
# by process so that all see the same machine: TREES (default "base new") names them; "new" is the working
# tree's src, any other NAME the tree in .ab_NAME/src (untracked, written before the call with
# `rm -rf .ab_NAME && mkdir .ab_NAME && git archive REV src | tar -x -C .ab_NAME`). Models: SmolLM2-135M shapes as the published Q4_1 file stores them (Q4_1 matrices, a Q8_0
# embedding) and in float16, GPT-2 124M float16. Each (tree, model) runs ROUNDS times, one fresh process each.
#
# Run: carry [".gl", ".whl"], command: bash tools/h200/ab_trees.sh
# Out: $OUT/ab.log (every run's table and a summary table), $OUT/ab-json.tar.gz (the reports).
set -u
T0=$(date +%s)
source .gl/env.sh || exit 1
OUT=${OUT:-$(mktemp -d)}
TREES=${TREES:-base new} ROUNDS=${ROUNDS:-2} DECODE=${DECODE:-128} REPEATS=${REPEATS:-3} PROMPTS=${PROMPTS:-128,1024}
W=/tmp/ab-models J=/tmp/ab-json
mkdir -p "$J"
exec > >(tee -a "$OUT/ab.log") 2>&1
for tree in $TREES; do
  [ "$tree" = new ] || [ -d ".ab_$tree/src" ] || { echo "no .ab_$tree/src: write it first (see the header)"; exit 1; }
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv,noheader
python3 tools/random_checkpoint.py $W/smollm2 --preset smollm2-135m --dtype float16 \
  --gguf $W/smollm2.q4_1.gguf --gguf-type q4_1 --gguf-embedding-type q8_0 || exit 1
python3 tools/random_checkpoint.py $W/gpt2 --preset gpt2 --dtype float16 || exit 1
declare -A ARGS=([smollm2-q4_1]="-m $W/smollm2.q4_1.gguf --prompts $PROMPTS"
                 [smollm2-f16]="-m $W/smollm2 --dtype float16 --prompts $PROMPTS"
                 [gpt2-f16]="-m $W/gpt2 --dtype float16 --prompts 128,1023")
for r in $(seq "$ROUNDS"); do
  for m in smollm2-q4_1 smollm2-f16 gpt2-f16; do
    for tree in $TREES; do
      src=$PWD/src; [ "$tree" = new ] || src=$PWD/.ab_$tree/src
      echo "== $(( $(date +%s) - T0 ))s: round $r, $m, $tree"
      PYTHONPATH="$src:/tmp/site" timeout 120 python3 -m webtensor.cli bench ${ARGS[$m]} -d wgpu --decode "$DECODE" \
        --repeats "$REPEATS" --processes 1 --json "$J/$tree-$m-$r.json" 2>&1 | grep -E "^(engine|webtensor) "
    done
  done
done
python3 tools/bench_table.py $(ls "$J"/*.json | sort)
tar czf "$OUT/ab-json.tar.gz" -C "$J" .
echo "== $(( $(date +%s) - T0 ))s: done"
