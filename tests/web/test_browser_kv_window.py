"""The page's path with the KV blocks behind a sliding window given back (docs/design-kv.md, "Sliding windows"): a
Mistral whose every layer slides (window 32, random weights: tests/window_fixtures.py) booted by the page (Pyodide,
no numpy) on the browser's WebGPU generates 120 tokens past a 40-token prompt with the runner's own blocks given
back behind the window (its pool's high-water mark within the window's bound, its first table entries unset) and
gives the native model's greedy tokens on lavapipe. Needs what tests/web/test_browser.py needs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_browser import _need_browser  # noqa: E402
from window_fixtures import N_CTX, WINDOW, example_raw, load, prompt, write_checkpoint  # noqa: E402

from webtensor.runtime.blocks import window_blocks  # noqa: E402

pytestmark = pytest.mark.browser

PAGE_RUN = """
import json, sys
from webtensor.web import app
from webtensor.runtime.generate import generate
from webtensor.runtime.runner import ModelRunner
m = app._state["model"]
r = ModelRunner(m, 1, bucketed=False)
tokens = list(generate(r, IDS, NEW, True, None))
json.dumps(dict(window=m.spec.kv_window, n_ctx=m.n_ctx, tokens=tokens, peak=r.blocks.peak, first=r._owned[0][:4],
                step_rows=r.step_rows, numpy="numpy" in sys.modules))
"""


def test_the_page_gives_back_the_blocks_behind_the_window(tmp_path, gpu):
    _need_browser()
    from webtensor.web.headless import run_page
    from webtensor.web.server import served_model

    d = write_checkpoint(tmp_path / "mistral", example_raw(sliding_window=WINDOW, max_position_embeddings=N_CTX))
    ids, new = prompt(40), 120  # (160 positions: five windows; the first four blocks given back)
    code = PAGE_RUN.replace("IDS", repr(ids)).replace("NEW", str(new))
    out = run_page([dict(type="python", name="run", code=code)], [d], timeout_s=400,
                   query=f"?model={served_model(d).id}&dtype=float32")
    if out.get("error"):
        pytest.fail(f"the browser session failed: {out['error']}\n" + "\n".join(out.get("console", [])[-20:]))
    task = out["tasks"][0]
    assert "error" not in task, task.get("error")
    got = json.loads(task["results"])
    assert got["window"] == WINDOW and got["n_ctx"] >= len(ids) + new and not got["numpy"]
    assert got["peak"] <= window_blocks(WINDOW, got["step_rows"], 16) and got["first"] == [-1] * 4
    assert got["tokens"] == load(d, gpu).generate(ids, new, stop_at_eos=False)
