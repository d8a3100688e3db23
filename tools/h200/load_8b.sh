#!/bin/bash
# H200, one device call (~5.5 minutes, 6 at most): issue 30 item 4's figures: the load of an 8B Q4_K_M GGUF file,
# webtensor (WebGPU, streamed from the file's map) beside llama.cpp (CUDA, -ngl 99, its mmap), each in fresh
# processes: seconds to load and the process's peak resident memory, with the file in the page cache (warm) and
# evicted from it first (cold: posix_fadvise DONTNEED of the file, no root needed).
#   - the file: Llama-3.1-8B's shapes, all 32 layers, llama.cpp's Q4_K_M mix, random blocks with sane scales
#     (tools/random_gguf.py, ~4.9 GB, written here: a device call carries 64 MiB);
#   - webtensor: tools/load_memory.py (load_model's seconds; peak RSS beside the RSS once loaded: the transient
#     must stay within 1.2x the largest tensor, 0.43 GB here);
#   - llama.cpp: llama-bench -ngl 99 -p 0 -n 1 -r 1 -v: its own "load time" (llama_perf: from the model's open to
#     the end of its first eval, so a warm-up decode counts in it) and the process's wall time and peak RSS.
#
# Prepare, in the repository root here (once):
#   ../shared/tools/gpu-prep gguf==0.19.0      (wgpu's wheels and the gguf package the GGUF writer needs)
#   ../shared/tools/llamacpp-build prep        (llama.cpp's source for the CUDA build, into .lcpp/)
# Run: carry [".gl", ".whl", ".lcpp"], command: bash tools/h200/load_8b.sh
#
# Order: llama.cpp's CUDA build starts in the background on cores 0-11 (~4.5 min) while the file is written and
# webtensor loads it on cores 12-15 (once warm, once cold: "during the build", a first look, memory bandwidth
# shared with the compilers). After the build, the machine to itself: llama.cpp and webtensor alternate, warm then
# cold, REPEATS times (the side-by-side figures; a round starts only with 45 s of BUDGET left). Every step is under
# a timeout cut to what is left of BUDGET seconds. $OUT
# gets one JSON a run (wt-*, lcpp-*), load_8b.log and summary.json; a table is printed last.
#
# A trial here: LOCAL=1 DEVICE=lavapipe N_LAYER=2 LLAMA_BENCH=/path/to/llama-bench NGL=0 PY=.venv/bin/python \
#   bash tools/h200/load_8b.sh      (without LLAMA_BENCH, LOCAL=1 skips llama.cpp)
set -u
source "$(dirname "$0")/lib.sh"
DEVICE=${DEVICE:-wgpu} REPEATS=${REPEATS:-2} BUDGET=${BUDGET:-340} NGL=${NGL:-99}
W=${W:-/tmp/wt-load}
GGUF=$W/llama-3.1-8b.q4_k_m.gguf
mkdir -p "$W"
log_to "$OUT/load_8b.log"
pin_cores
gpu_info name,memory.total,driver_version
free -g | head -2

# llama.cpp, built beside the first measurements (or the binary given; LOCAL=1 without one: none)
[ -z "${LLAMA_BENCH:-}" ] && [ -z "${LOCAL:-}" ] && lcpp_build_start

stamp "the file: random Llama-3.1-8B-shaped Q4_K_M${N_LAYER:+ ($N_LAYER layers)}"
timeout "$(cap 120)" "${PIN[@]}" $PY tools/random_gguf.py "$GGUF" --preset llama-3.1-8b ${N_LAYER:+--n-layer $N_LAYER} \
  || exit 1
ls -l "$GGUF"

# page cache: warm = read once now; cold = the file's clean pages evicted (written back first)
cache() { $PY - "$GGUF" "$1" <<'EOF'
import os, sys
path, mode = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
try:
    if mode == "cold":
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    else:
        while os.read(fd, 64 << 20):
            pass
finally:
    os.close(fd)
EOF
}

# one fresh process under a timeout: its wall time and peak RSS (RUSAGE_CHILDREN), its output kept; JSON to $1
measure() { local out=$1 limit=$2; shift 2; $PY - "$out" "$limit" "$@" <<'EOF'
import json, re, resource, subprocess, sys, time
out, limit, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
t0 = time.perf_counter()
try:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    rc, text = r.returncode, r.stdout + r.stderr
except subprocess.TimeoutExpired as e:
    rc, text = 124, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
fig = {"cmd": cmd, "rc": rc, "wall_s": time.perf_counter() - t0,
       "peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
m = re.findall(r"load time =\s*([\d.]+) ms", text)  # llama.cpp's llama_perf_context_print
if m:
    fig["lcpp_load_s"] = float(m[0]) / 1e3
with open(out.replace(".json", ".txt"), "w") as f:
    f.write(text)
try:
    with open(out.replace(".json", ".wt.json")) as f:  # tools/load_memory.py's figures
        fig["webtensor"] = json.load(f)
except OSError:
    pass
json.dump(fig, open(out, "w"), indent=1)
line = [l for l in text.splitlines() if " on " in l and "peak RSS" in l]
print(f"  rc {rc}, wall {fig['wall_s']:.2f} s, peak RSS {fig['peak_rss'] / 2**30:.2f} GiB"
      + (f", llama.cpp load time {fig['lcpp_load_s']:.2f} s" if "lcpp_load_s" in fig else "")
      + (f"\n  {line[-1]}" if line else "") + ("" if rc == 0 else "\n" + text[-1500:]))
EOF
}
wt() { local tag=$1 temp=$2; cache "$temp"; stamp "webtensor $tag ($temp)"
       measure "$OUT/wt-$tag-$temp.json" "$(cap 90)" "${PIN[@]}" $PY tools/load_memory.py "$GGUF" --device "$DEVICE" \
         --json "$OUT/wt-$tag-$temp.wt.json"; }
lcpp() { local tag=$1 temp=$2; cache "$temp"; stamp "llama.cpp $tag ($temp)"
         measure "$OUT/lcpp-$tag-$temp.json" "$(cap 90)" "$LB" -m "$GGUF" -ngl "$NGL" -p 0 -n 1 -r 1 -v; }

wt build warm; wt build cold

lcpp_build_wait 400
if [ -x "$LB" ]; then
  stamp "side by side, the machine to itself"
  for i in $(seq "$REPEATS"); do for temp in warm cold; do
    if [ "$(left)" -lt 45 ]; then stamp "out of time: the side-by-side stops here"; break 2; fi
    lcpp "$i" "$temp"; wt "$i" "$temp"
  done; done
else
  stamp "no llama-bench ($LB): webtensor only"
fi

stamp "summary"
$PY - "$OUT" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows: dict[tuple[str, str], list[dict]] = {}
for p in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(p)
    if name.endswith(".wt.json") or name == "summary.json":
        continue
    who, tag, temp = name[:-5].split("-")
    fig = json.load(open(p))
    if fig["rc"] == 0:
        rows.setdefault((who if not tag.startswith("build") else who + " (during the build)", temp), []).append(fig)
summary = {}
print(f"{'who':<28}{'cache':<7}{'runs':>5}{'load s':>9}{'wall s':>9}{'peak RSS GiB':>14}{'transient/largest':>19}")
for (who, temp), figs in sorted(rows.items()):
    load = [f["webtensor"]["load_seconds"] if "webtensor" in f else f.get("lcpp_load_s", float("nan")) for f in figs]
    wall = [f["wall_s"] for f in figs]
    rss = [f["peak_rss"] / 2**30 for f in figs]
    tr = [f["webtensor"]["transient_over_largest"] for f in figs if "webtensor" in f]
    s = {"runs": len(figs), "load_s": statistics.median(load), "wall_s": statistics.median(wall),
         "peak_rss_gib": max(rss), "transient_over_largest": max(tr) if tr else None}
    summary[f"{who}/{temp}"] = s
    print(f"{who:<28}{temp:<7}{s['runs']:>5}{s['load_s']:>9.2f}{s['wall_s']:>9.2f}{s['peak_rss_gib']:>14.2f}"
          f"{'' if s['transient_over_largest'] is None else format(s['transient_over_largest'], '.2f'):>19}")
for temp in ("warm", "cold"):
    a, b = summary.get(f"wt/{temp}"), summary.get(f"lcpp/{temp}")
    if a and b:
        print(f"{temp}: webtensor load / llama.cpp load time {a['load_s'] / b['load_s']:.2f}x (target <= 1.5x); "
              f"process wall {a['wall_s'] / b['wall_s']:.2f}x; peak RSS {a['peak_rss_gib'] / b['peak_rss_gib']:.2f}x")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
stamp "done"
