#!/usr/bin/env bash
# Issue 28 item 5 on the H200: does Dawn (npm `webgpu`, Dawn for Node) offer subgroup matrices
# (Vulkan cooperative matrices, i.e. tensor cores) there, and what does a 16x16 f16 tile give?
# The GPU machine has no node and no network, so the lead readies a git-ignored folder here first:
#   mkdir -p .gpu-dawn && (cd .gpu-dawn && npm pack webgpu@0.6.2 && tar xzf webgpu-*.tgz --strip-components=1)
#   xz -T2 -c "$(command -v node)" > .gpu-dawn/node.xz          # node 20 (x86-64 Linux)
# (the package's dist/linux-x64/dawn.node may be kept as dawn.node.xz; it is unpacked back in place).
# Run (carry [".gl", ".whl", ".gpu-dawn"]): source .gl/env.sh && bash tools/h200/subgroup_matrix.sh
# LOCAL=1 runs it on this machine's node and adapter (lavapipe: the feature is absent there).
set -euo pipefail
cd "$(dirname "$0")/../.."
dawn=.gpu-dawn
out=${OUT:-/tmp/subgroup-matrix}
mkdir -p "$out"
if [[ -n "${LOCAL:-}" ]]; then
  node_bin=$(command -v node)
else
  node_bin=$out/node
  xz -dc "$dawn/node.xz" > "$node_bin" && chmod +x "$node_bin"
fi
if [[ -f $dawn/dawn.node.xz && ! -f $dawn/dist/linux-x64/dawn.node ]]; then
  mkdir -p "$dawn/dist/linux-x64" && xz -dc "$dawn/dawn.node.xz" > "$dawn/dist/linux-x64/dawn.node"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || true
for n in 2048 4096 8192; do
  "$node_bin" tools/h200/subgroup_matrix_probe.mjs "$PWD/$dawn/index.js" "$n" 2>&1 | tee -a "$out/probe.txt"
  [[ -n "${LOCAL:-}" ]] && break
done
