"""The page's decode speed in headless Chromium (SwiftShader): greedy runs of 64 tokens through the
UI, in one page session, for each dtype in turn (the dtype menu reloads the model between runs, so
the dtypes alternate and share the machine's noise; an 8-token run after each load is not
counted); the median tokens/s per dtype and the ratio
to the first.

    python tools/page_speed.py [--dtype float32,int8] [--q8-nr 1,2] [--runs 3] [--tokens 64]

--q8-nr runs int8 once per value of gemv_quant's outputs a thread (the kernel policy's gemv_quant_nr, set in the
page's Python before each int8 load; default: the page's own value).

(PYTHONPATH selects the tree; WEBTENSOR_PYODIDE_DIR the Pyodide folder.)"""

import argparse
import statistics

from webtensor.web.headless import run_page

PROMPT = "It is a truth universally acknowledged"

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--dtype", default="float32", help="comma-separated dtypes (float32, float16, int8)")
p.add_argument("--runs", type=int, default=3, help="runs per dtype")
p.add_argument("--q8-nr", default="",
               help="comma-separated gemv_quant_nr values for int8 (the page's devices' kernel policy; "
                    "default: as shipped)")
p.add_argument("--tokens", type=int, default=64)
a = p.parse_args()
dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
nrs = [int(x) for x in a.q8_nr.split(",") if x.strip()]
variants = [(d, nr) for d in dtypes for nr in (nrs if d == "int8" and nrs else [None])]  # (dtype, NR)


def label(d: str, nr: int | None) -> str:
    return d if nr is None else f"{d} NR={nr}"


SET_NR = ("import webtensor as wt\n"
          "for d in list(wt.Device._wgpu_cache.values()):\n"
          "    d.kernel_policy = d.kernel_policy.replace(gemv_quant_nr={})\n'ok'")
tasks = []
for i in range(a.runs):
    for j, (d, nr) in enumerate(variants):
        if nr is not None:
            tasks.append(dict(type="python", name=f"NR={nr}", code=SET_NR.format(nr)))
        if i or j or nr is not None:  # the page opens in the first dtype
            tasks.append(dict(type="dtype", name=f"load {label(d, nr)}", dtype=d))
        tasks.append(dict(type="generate_ui", name=f"{label(d, nr)} warm-up", prompt=PROMPT, maxNewTokens=8,
                          temperature=0))
        tasks.append(dict(type="generate_ui", name=f"{label(d, nr)} run{i}", prompt=PROMPT, maxNewTokens=a.tokens,
                          temperature=0))
out = run_page(tasks, [], timeout_s=120 + 60 * a.runs * len(variants), query=f"?dtype={dtypes[0]}")
print(f"adapter: {((out.get('boot') or {}).get('info') or {}).get('adapter')}")
speeds: dict[str, list[float]] = {label(*v): [] for v in variants}
for t in out["tasks"]:
    if t.get("error"):
        print(t.get("name"), "FAILED", t["error"][:300])
    elif t["type"] == "dtype":
        print(t["name"], "|", t.get("weights"))
    elif t["type"] == "generate_ui" and "warm-up" not in t["name"]:
        speeds[t["name"].rsplit(" run", 1)[0]].append((t.get("result") or {}).get("tokens_per_s", 0.0))
        print(t.get("name"), t.get("speed"))
first = label(*variants[0])
base = statistics.median(speeds[first]) if speeds[first] else 0.0
for name, v in speeds.items():
    if v:
        med = statistics.median(v)
        ratio = f", {med / base:.2f}x {first}" if base and name != first else ""
        print(f"{name}: median {med:.2f} tokens/s over {len(v)} runs ({', '.join(f'{s:.2f}' for s in v)}){ratio}")
