"""The page's decode speed in headless Chromium (SwiftShader): three greedy runs of 64 tokens
through the UI. `python tools/page_speed.py` (PYTHONPATH selects the tree; WEBTENSOR_PYODIDE_DIR the
Pyodide folder)."""

from webtensor.web.headless import run_page
from webtensor.web.server import default_model_dir

PROMPT = "It is a truth universally acknowledged"
tasks = [dict(type="generate_ui", name=f"run{i}", prompt=PROMPT, maxNewTokens=64, temperature=0) for i in range(3)]
out = run_page(tasks, default_model_dir(), timeout_s=300)
for t in out["tasks"]:
    r = t.get("result", {})
    print(t.get("name"), t.get("speed"), r.get("tokens_per_s"), r.get("new_tokens"), t.get("error"))
