"""webtensor in real headless Chromium: Pyodide + the browser's WebGPU (SwiftShader here).

One page session runs the op-parity cases, generates greedily through the page's own UI (typing
the prompt, clicking Generate) and takes a screenshot; the tests below check its results against
numpy and against the native GPT-2. Two short sessions check the page's error states. Needs
Debian's chromium, Node and the npm packages of package.json (`bash setup.sh --test` installs
them); under CI=true a missing piece fails loudly instead of skipping.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import webtensor as wt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import IN_CI, rel_err  # noqa: E402

pytestmark = pytest.mark.browser

PROMPT = "It is a truth universally acknowledged"
N_NEW = 8
ARTIFACTS = Path(os.environ.get("WEBTENSOR_ARTIFACTS", Path(__file__).resolve().parents[2] / "out"))


def _need_browser() -> None:
    from webtensor.web.headless import SetupError, find_chromium, find_node, find_node_modules

    try:
        find_chromium(), find_node(), find_node_modules()
    except SetupError as e:
        if IN_CI:
            pytest.fail(f"CI=true but the browser tests cannot run: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The shipped model; while it is not there yet, a small random checkpoint."""
    from webtensor.web.server import default_model_dir

    shipped = default_model_dir()
    if (shipped / "config.json").is_file() and any(shipped.glob("*.safetensors")):
        return shipped
    from gpt2_fixtures import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("web-gpt2"), vocab_size=400, n_embd=64, n_layer=2,
                           n_head=4, n_positions=96)


# -- op cases: inputs and expected values made natively with numpy ---------------------------------
def _spec(a: np.ndarray) -> dict:
    dtype = "int32" if a.dtype.kind == "i" else "float32"
    a = np.ascontiguousarray(a.astype(dtype))
    return dict(shape=list(a.shape), dtype=dtype, b64=base64.b64encode(a.tobytes()).decode())


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    T, H, D = q.shape
    S = k.shape[0]
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
    mask = np.arange(S)[None, :] > (np.arange(T)[:, None] + S - T)
    s = np.where(mask[None], -np.inf, s)
    return np.einsum("hts,shd->thd", _softmax(s), v)


def _cases() -> list[tuple[dict, np.ndarray]]:
    rng = np.random.default_rng(7)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    f64 = np.float64
    out = []

    def case(name: str, op: str, inputs: list[np.ndarray], want: np.ndarray, args=None, kwargs=None) -> None:
        c = dict(name=name, op=op, inputs=[_spec(a) for a in inputs])
        if args is not None:
            c["args"] = args
        if kwargs is not None:
            c["kwargs"] = kwargs
        out.append((c, want))

    a, b = r(5, 33), r(33, 17)
    case("matmul", "matmul", [a, b], a.astype(f64) @ b)
    a, b = r(3, 4, 24), r(24, 20)
    case("matmul batched rows", "matmul", [a, b], a.astype(f64) @ b)
    x, w, bias, res = r(1, 64), r(64, 48), r(48), r(1, 48)
    case("linear gemv bias gelu", "linear", [x, w, bias], _gelu(x.astype(f64) @ w + bias),
         args=[{"input": 0}, {"input": 1}, {"input": 2}, "gelu"])
    x, w, bias, res = r(6, 40), r(40, 24), r(24), r(6, 24)
    case("linear bias residual", "linear", [x, w, bias, res], x.astype(f64) @ w + bias + res,
         args=[{"input": 0}, {"input": 1}, {"input": 2}], kwargs={"residual": {"input": 3}})
    a, b = r(4, 1, 8), r(3, 1)
    case("add broadcast", "add", [a, b], a.astype(f64) + b)
    a, b = r(2, 3, 4), r(4)
    case("mul broadcast", "mul", [a, b], a.astype(f64) * b)
    a = r(7, 9)
    case("add same tensor twice", "add", [a], a.astype(f64) * 2, args=[{"input": 0}, {"input": 0}])
    x, w, bias = r(6, 40), r(40), r(40)
    xd = x.astype(f64)
    ln = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * w + bias
    case("layer_norm", "layer_norm", [x, w, bias], ln)
    x = r(3, 50) * 3
    case("gelu", "gelu", [x], _gelu(x.astype(f64)))
    x = r(5, 37) * 4
    case("softmax", "softmax", [x], _softmax(x.astype(f64)))
    q, k, v = r(4, 2, 8), r(6, 2, 8), r(6, 2, 8)
    case("attention causal", "attention", [q, k, v], _attention(q.astype(f64), k.astype(f64), v.astype(f64)))
    table, ids = r(20, 12), np.array([3, 0, 19, 7, 7, 1, 12], np.int32)
    case("embedding", "embedding", [table, ids], table.astype(f64)[ids])
    x = r(3, 29)
    case("argmax", "argmax", [x], x.argmax(-1).astype(np.int32))
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def session(model_dir) -> dict:
    """One headless-Chromium session: parity cases, greedy generation through the UI, screenshot."""
    _need_browser()
    from webtensor.web.headless import run_page

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = (ARTIFACTS / "browser_gpt2_page.png").resolve()
    shot.unlink(missing_ok=True)
    tasks = [
        dict(type="parity", cases=json.dumps([c for c, _ in CASES])),
        dict(type="generate_ui", prompt=PROMPT, maxNewTokens=N_NEW, temperature=0),
        dict(type="screenshot", path=str(shot)),
    ]
    out = run_page(tasks, model_dir, timeout_s=150)
    if out.get("error"):
        console = "\n".join(out.get("console", [])[-20:])
        pytest.fail(f"the browser session failed: {out['error']}\n{console}")
    return {t["type"]: t for t in out["tasks"]} | {"boot": out["boot"], "ms": out["ms"]}


def test_page_boots_on_webgpu(session):
    info = session["boot"]["info"]
    assert session["boot"]["phase"] == "ready", session["boot"]
    assert info["backend"] == "WebGPU (browser)"
    assert info["adapter"] and info["adapter"] != "unknown adapter"
    print(f"\nadapter: {info['adapter']}; page ready in {session['ms']['boot']} ms")


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c, _ in CASES])
def test_op_parity_in_browser(session, index):
    case, want = CASES[index]
    got = session["parity"]["results"][index]
    assert got["name"] == case["name"]
    assert "error" not in got, got.get("error")
    assert tuple(got["shape"]) == want.shape
    arr = np.frombuffer(base64.b64decode(got["b64"]), dtype=got["dtype"]).reshape(want.shape)
    if want.dtype == np.int32:
        np.testing.assert_array_equal(arr, want)
    else:
        assert rel_err(arr, want) <= 1e-5, f"{case['name']}: rel err {rel_err(arr, want):.2e}"


def test_greedy_tokens_match_native(session, model_dir):
    from webtensor.models.gpt2 import GPT2
    from webtensor.web.server import default_model_dir

    gen = session["generate_ui"]
    assert "error" not in gen, gen.get("error")
    res = gen["result"]
    shipped = model_dir == default_model_dir()
    ref = GPT2.from_pretrained(None if shipped else model_dir, device=wt.Device.cpu())
    ids = ref.encode(PROMPT)
    assert res["prompt_ids"] == ids  # the pure-Python BPE in the page == tokenizers natively
    want = ref.generate(ids, N_NEW, temperature=0)
    assert res["token_ids"] == want
    assert gen["generated"] == ref.decode(want)  # the text streamed into the page
    assert "tokens/s" in gen["speed"]
    print(f"\nbrowser greedy: {res['new_tokens']} tokens, {res['tokens_per_s']:.2f} tokens/s decode; "
          f"text: {gen['generated']!r}")


def test_screenshot_saved(session):
    path = Path(session["screenshot"]["path"])
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    print(f"\nscreenshot of the page after generation: {path}")


def _error_page(model_dir: Path, **options) -> dict:
    _need_browser()
    from webtensor.web.headless import run_page

    out = run_page([], model_dir, timeout_s=60, expectError=True, **options)
    assert not out.get("error"), out.get("error")
    return out["boot"]


def test_page_says_no_webgpu(model_dir):
    boot = _error_page(model_dir, hideWebgpu=True)
    assert boot["phase"] == "error"
    assert boot["error"]["title"] == "No WebGPU in this browser."
    assert "navigator.gpu" in boot["error"]["detail"]


def test_page_says_no_adapter(model_dir):
    boot = _error_page(model_dir, webgpu=False)
    assert boot["phase"] == "error"
    assert boot["error"]["title"] == "No WebGPU in this browser."
    assert "no adapter" in boot["error"]["detail"]


def test_page_says_model_failed(model_dir, tmp_path):
    bad = tmp_path / "bad-model"
    bad.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(model_dir / f, bad / f)
    (bad / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:5000])
    boot = _error_page(bad)
    assert boot["phase"] == "error"
    assert boot["error"]["title"] == "Model failed to load."
    assert "safetensors" in boot["error"]["detail"]
