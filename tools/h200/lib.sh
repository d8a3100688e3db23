# The steps the H200 scripts share, sourced by each (`source "$(dirname "$0")/lib.sh"`, from the repository root):
#
#   on sourcing: T0 (the script's start), the environment (LOCAL=1: this checkout's src on PYTHONPATH; else the
#                device's .gl/env.sh), OUT (a fresh folder unless given), PY (python3 unless given), LB (llama-bench:
#                LLAMA_BENCH, or the one lcpp_build_start builds);
#   stamp MSG             "== <seconds since T0>s: MSG"
#   left / cap SECONDS    the seconds left of BUDGET; SECONDS cut to what is left (5 at least): a step's timeout
#   log_to FILE           everything after it also into FILE
#   pin_cores             PIN (cores 12-15, the measurements) and BUILD_PIN (cores 0-11, llama.cpp's build) on a
#                         machine of 16 cores or more; empty (no pinning) elsewhere
#   gpu_info FIELDS [FILE]  nvidia-smi's FIELDS (also into FILE) where there is a GPU
#   lcpp_build_start      without LLAMA_BENCH, llama.cpp's CUDA build (.lcpp/build-cuda.sh) in the background on
#                         BUILD_PIN's cores, its pid BUILD
#   lcpp_build_wait LIMIT  wait for that build (at most LIMIT seconds, cut by cap); its log's end where it failed
#   bench_step NAME LIMIT CMD...  CMD --json $OUT/NAME.json under a timeout, its last BENCH_TAIL (14) lines shown
#   bench_summary         the table of every $OUT/*.json (tools/bench_table.py)
#   wait_health LIMIT URL [PID]  until URL/health answers (while PID lives: not another process's on the port)
#   stop_server           the server SERVER stopped (TERM, then KILL after 20 s)
#   url_text URL          the body of a GET of URL
# BUDGET (the script's seconds, from T0) is set by each script.

T0=$(date +%s)
if [ -z "${LOCAL:-}" ]; then source .gl/env.sh || exit 1; else export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"; fi
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
LB=${LLAMA_BENCH:-/tmp/lcb/bin/llama-bench}

stamp() { echo "== $(( $(date +%s) - T0 ))s: $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); [ "$l" -lt 5 ] && l=5; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
log_to() { exec > >(tee -a "$1") 2>&1; }

pin_cores() {
  PIN=(); BUILD_PIN=()
  if command -v taskset >/dev/null && [ "$(nproc)" -ge 16 ]; then PIN=(taskset -c 12-15); BUILD_PIN=(taskset -c 0-11); fi
}

gpu_info() {
  command -v nvidia-smi >/dev/null || return 0
  if [ -n "${2:-}" ]; then nvidia-smi --query-gpu="$1" --format=csv | tee "$2"; else nvidia-smi --query-gpu="$1" --format=csv; fi
}

lcpp_build_start() {
  [ -z "${LLAMA_BENCH:-}" ] || return 0
  stamp "llama.cpp CUDA build started (background, ${BUILD_PIN[*]:-all cores})"
  ( "${BUILD_PIN[@]}" bash .lcpp/build-cuda.sh > /tmp/lcb.out 2>&1; echo $? > /tmp/lcb.rc ) &
  BUILD=$!
}

lcpp_build_wait() {
  [ -n "${BUILD:-}" ] || return 0
  stamp "waiting for the llama.cpp build"
  local wait; wait=$(cap "$1")
  while kill -0 "$BUILD" 2>/dev/null && [ "$wait" -gt 0 ]; do sleep 2; wait=$((wait - 2)); done
  if [ "$(cat /tmp/lcb.rc 2>/dev/null)" != 0 ]; then
    stamp "llama.cpp build failed or unfinished"; tail -20 /tmp/lcb.out; tail -20 /tmp/lcb-build.log 2>/dev/null
  fi
  return 0
}

bench_step() {
  local name=$1 limit=$2; shift 2; stamp "$name"
  timeout "$(cap "$limit")" "$@" --json "$OUT/$name.json" 2>&1 | grep -v "it/s\]" | grep -v "^  " | tail -"${BENCH_TAIL:-14}"
}

bench_summary() {
  stamp "summary"
  # shellcheck disable=SC2046
  $PY tools/bench_table.py $(ls "$OUT"/*.json 2>/dev/null | sort)
}

wait_health() {
  local limit=$1; shift
  timeout "$limit" $PY - "$@" <<'EOF'
import os, sys, time, urllib.request
while True:
    if len(sys.argv) > 2:  # (this server's: not another process's on the port)
        os.kill(int(sys.argv[2]), 0)
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).read()
        break
    except OSError:
        time.sleep(0.5)
EOF
}

SERVER=
stop_server() {
  [ -n "$SERVER" ] || return 0
  kill -TERM "$SERVER" 2>/dev/null
  for _ in $(seq 40); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$SERVER" 2>/dev/null; SERVER=
}

url_text() { $PY -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
