"""A family beyond GPT-2 and Llama in the page: the conformance suite's Gemma 2 example (random weights written by
transformers: sliding windows on alternate layers, soft-capped attention scores and logits, GeGLU, (1 + w) norms)
served by `webtensor web`, booted by the page with it (Pyodide, the pure-Python readers, no numpy) and run on the
browser's WebGPU: its greedy tokens are transformers' and the native model's on lavapipe. Needs what
tests/web/test_browser.py needs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import webtensor as wt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from test_browser import _need_browser  # noqa: E402
from test_conformance import IDS, NEW, _Example  # noqa: E402

pytestmark = pytest.mark.browser

PAGE_RUN = """
import json, sys
from webtensor.web import app
m = app._state["model"]
json.dumps(dict(architecture=m.spec.architecture, greedy=m.generate(IDS, NEW, stop_at_eos=False),
                numpy="numpy" in sys.modules))
"""


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> _Example:
    return _Example("gemma", "gemma2", tmp_path_factory.mktemp("web-gemma2"))


def test_page_runs_a_gemma2_checkpoint(gemma2, gpu):
    _need_browser()
    from webtensor.web.headless import run_page
    from webtensor.web.server import served_model

    model_id = served_model(gemma2.hf_dir).id
    code = PAGE_RUN.replace("IDS", repr(IDS[:6])).replace("NEW", str(NEW))
    out = run_page([dict(type="python", name="run", code=code)], [gemma2.hf_dir], timeout_s=300,
                   query=f"?model={model_id}&dtype=float32")
    if out.get("error"):
        pytest.fail(f"the browser session failed: {out['error']}\n" + "\n".join(out.get("console", [])[-20:]))
    boot = out["boot"]
    assert boot["phase"] == "ready" and boot["model"]["architecture"] == "gemma2", boot
    task = out["tasks"][0]
    assert "error" not in task, task.get("error")
    got = json.loads(task["results"])
    assert got == dict(architecture="gemma2", greedy=gemma2.hf_greedy, numpy=False)
    assert wt.load_model(gemma2.hf_dir, gpu).generate(IDS[:6], NEW, stop_at_eos=False) == gemma2.hf_greedy
