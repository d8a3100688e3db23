"""The page's decode speed in headless Chromium (SwiftShader): greedy runs of 64 tokens through the
UI, in one page session, for each dtype in turn (the dtype menu reloads the model between runs, so
the dtypes alternate and share the machine's noise; an 8-token run after each load is not
counted); the median tokens/s per dtype and the ratio
to the first.

    python tools/page_speed.py [--dtype float32,int8] [--runs 3] [--tokens 64]

(PYTHONPATH selects the tree; WEBTENSOR_PYODIDE_DIR the Pyodide folder.)"""

import argparse
import statistics

from webtensor.web.headless import run_page
from webtensor.web.server import default_model_dir

PROMPT = "It is a truth universally acknowledged"

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--dtype", default="float32", help="comma-separated dtypes (float32, float16, int8)")
p.add_argument("--runs", type=int, default=3, help="runs per dtype")
p.add_argument("--tokens", type=int, default=64)
a = p.parse_args()
dtypes = [d.strip() for d in a.dtype.split(",") if d.strip()]
tasks = []
for i in range(a.runs):
    for j, d in enumerate(dtypes):
        if i or j:  # the page opens in the first dtype
            tasks.append(dict(type="dtype", name=f"load {d}", dtype=d))
        tasks.append(dict(type="generate_ui", name=f"{d} warm-up", prompt=PROMPT, maxNewTokens=8, temperature=0))
        tasks.append(dict(type="generate_ui", name=f"{d} run{i}", prompt=PROMPT, maxNewTokens=a.tokens,
                          temperature=0))
out = run_page(tasks, default_model_dir(), timeout_s=120 + 60 * a.runs * len(dtypes), query=f"?dtype={dtypes[0]}")
print(f"adapter: {((out.get('boot') or {}).get('info') or {}).get('adapter')}")
speeds: dict[str, list[float]] = {d: [] for d in dtypes}
for t in out["tasks"]:
    if t.get("error"):
        print(t.get("name"), "FAILED", t["error"][:300])
    elif t["type"] == "dtype":
        print(t["name"], "|", t.get("weights"))
    elif "warm-up" not in t["name"]:
        r = t.get("result") or {}
        speeds[r.get("dtype", "?")] = speeds.get(r.get("dtype", "?"), []) + [r.get("tokens_per_s", 0.0)]
        print(t.get("name"), t.get("speed"))
base = statistics.median(speeds[dtypes[0]]) if speeds.get(dtypes[0]) else 0.0
for d in dtypes:
    if speeds.get(d):
        med = statistics.median(speeds[d])
        ratio = f", {med / base:.2f}x {dtypes[0]}" if base and d != dtypes[0] else ""
        print(f"{d}: median {med:.2f} tokens/s over {len(speeds[d])} runs "
              f"({', '.join(f'{s:.2f}' for s in speeds[d])}){ratio}")
