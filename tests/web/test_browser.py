"""webtensor in real headless Chromium: Pyodide + the browser's WebGPU (SwiftShader here).

One page session on the shipped GPT-2 runs the op-parity cases, generates through the page's own UI
(typing the prompt, clicking Generate), chats with its plain template, takes a screenshot and has the
browser's shader compiler compile every kernel variant the runtime builds; the tests below check its results
against numpy and against the native model. A second session serves two models:
GPT-2 in int8 (then float32, by the dtype menu), then, picked in the model menu, the real SmolLM2-135M-
Instruct Q4_1 GGUF (98 MB, its blocks uploaded as they are), chatted with in its own template: the page's
tokens equal `webtensor.load_model(same file)`'s on lavapipe and on the CPU. A third session, on one
persistent browser profile, uses the page as a person does: replies streamed token by token, runs stopped
(Stop, Escape, New chat), a blank message, reloads that keep the conversation and move no model bytes, the
model menu switched back and forth (CDP's Network events and the server's count of bytes sent). Short
sessions check the page's error states. Needs Debian's chromium, Node and the npm packages of package.json
(`bash setup.sh --test` installs them); under CI=true a missing piece fails loudly instead of skipping.
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
from conftest import IN_CI  # noqa: E402
from test_web_native import VARIANTS_FILE, assert_every_variant_compiled  # noqa: E402
from tolerance import assert_close  # noqa: E402

pytestmark = pytest.mark.browser

PROMPT = "It is a truth universally acknowledged"
N_NEW = 8
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.9, seed=1234)  # the page's fields, the API's names
LONG = (PROMPT + ", ") * 50  # over any test model's context
CHAT_MESSAGE = "Hello! Who are you?"
# the sampler inside Pyodide (no numpy; Pyodide's libm): seeded draws on fixed logits, a fresh seed
PAGE_SAMPLER = """
import array, json, sys
from webtensor.sampling import SamplingParams, sample, with_seed
logits = array.array("f", [(i * 7919 % 1009) / 84 - 6 for i in range(5000)])  # basic ops: exact anywhere
picks = {f"{k},{p}": [sample(logits, SamplingParams(0.8, k, p, 99), pos) for pos in range(40)]
         for k, p in ((40, 0.9), (None, 0.9), (None, None))}
json.dumps(dict(picks=picks, seed=with_seed(SamplingParams(1.0)).seed, numpy="numpy" in sys.modules))
"""
# a second device in the page with every optional feature withheld (subgroup, shader-f16): GPT-2
# runs there too, greedy and sampled, with the tokens of the native model
PAGE_NO_FEATURES = """
import json
from webtensor.device import Device
from webtensor.models import load_model
dev = await Device.wgpu_async(features=())
m = load_model("/home/pyodide/models/MODEL_ID/float32", dev, "float32", reader="pure")
ids = m.encode(PROMPT)
json.dumps(dict(features=sorted(dev.ctx.api.features), greedy=m.generate(ids, N_NEW, temperature=0),
                sampled=m.generate(ids, N_NEW, **SAMPLED), distinct=dev is not await Device.wgpu_async()))
"""
# every kernel variant the runtime builds (tests/data/kernel_variants.txt), made as the page's device makes it and
# compiled by the browser's shader compiler in one call
PAGE_KERNELS = """
import json, time
from webtensor.web import app, selftest
t0 = time.perf_counter()
got = selftest.check_kernels(app._state["device"], selftest.parse_variants(VARIANTS))
json.dumps(dict(got, s=time.perf_counter() - t0))
"""
# bad inputs typed into the page: (name, the fields, the page's message: the label on screen and what was typed;
# LIMIT: the tokens box's limit for the model, CTX: the prompt's fit)
BAD = [
    ("tokens-zero", dict(maxNewTokens=0), "tokens must be a whole number from 1 to LIMIT, got '0'"),
    ("tokens-over-the-box", dict(maxNewTokens=5000), "tokens must be a whole number from 1 to LIMIT, got '5000'"),
    ("temperature-negative", dict(temperature=-1), "temperature must be a number >= 0 (0 = greedy), got '-1'"),
    ("temperature-1e400", dict(temperature="1e400"), "temperature must be a number >= 0 (0 = greedy), got '1e400'"),
    ("temperature-blank", dict(temperature=""), "temperature is empty: enter a number >= 0 (0 = greedy)"),
    ("top-k-negative", dict(topK=-3), "top-k must be a whole number >= 0 (0 or blank = off), got '-3'"),
    ("top-k-fraction", dict(topK=2.5), "top-k must be a whole number >= 0 (0 or blank = off), got '2.5'"),
    ("top-p-zero", dict(topP=0), "top-p must be a number in (0, 1] (1 or blank = off), got '0'"),
    ("top-p-over-one", dict(topP=1.5), "top-p must be a number in (0, 1] (1 or blank = off), got '1.5'"),
    ("seed-negative", dict(seed=-1), "seed must be a whole number >= 0 (blank = random), got '-1'"),
    ("seed-text", dict(seed="abc"), "seed must be a whole number >= 0 (blank = random), got 'abc'"),
    ("prompt-too-long", dict(prompt=LONG), "CTX"),
]
ARTIFACTS = Path(os.environ.get("WEBTENSOR_ARTIFACTS", Path(__file__).resolve().parents[2] / "out"))


def _need_browser() -> None:
    from webtensor.web.headless import SetupError, find_chromium, find_node, find_node_modules

    try:
        find_chromium(), find_node(), find_node_modules()
    except SetupError as e:
        if IN_CI:
            pytest.fail(f"CI=true but the browser tests cannot run: {e}")
        pytest.skip(str(e))


def _served(model_dir: Path) -> list[Path]:
    """The page server's --model list for `model_dir` (the shipped model is always served)."""
    from webtensor.web.server import default_model_dir

    return [] if model_dir == default_model_dir() else [model_dir]


def _source(model_dir: Path) -> Path | None:
    """`model_dir` as `webtensor.load_model` takes it (None: the shipped model)."""
    return _served(model_dir)[0] if _served(model_dir) else None


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
    fields = dict(topK=SAMPLED["top_k"], topP=SAMPLED["top_p"], seed=SAMPLED["seed"])
    ok = dict(prompt=PROMPT, maxNewTokens=N_NEW, temperature=SAMPLED["temperature"], truncate=False, **fields)
    no_features = (PAGE_NO_FEATURES.replace("PROMPT", repr(PROMPT)).replace("N_NEW", str(N_NEW))
                   .replace("MODEL_ID", _model_id(model_dir))
                   .replace("**SAMPLED", ", ".join(f"{k}={v!r}" for k, v in SAMPLED.items())))
    tasks = [
        dict(type="parity", cases=json.dumps([c for c, _ in CASES])),
        dict(type="generate_ui", prompt=PROMPT, maxNewTokens=N_NEW, temperature=0),
        dict(type="screenshot", path=str(shot)),
        # after a good run: each bad input is refused as an error, the run's figures cleared
        *(dict(type="generate_ui", name=f"bad:{name}", expectFail=True, **{**ok, **bad}) for name, bad, _ in BAD),
        dict(type="generate_ui", name="sampled", **ok),
        dict(type="python", name="sampler", code=PAGE_SAMPLER),
        dict(type="python", name="no-features", code=no_features),
        dict(type="generate_ui", name="truncated", **{**ok, "prompt": LONG, "truncate": True}),
        dict(type="chat_ui", name="chat", message=CHAT_MESSAGE, maxNewTokens=N_NEW, temperature=0),
        dict(type="python", name="kernels", code=PAGE_KERNELS.replace("VARIANTS", repr(VARIANTS_FILE.read_text()))),
    ]
    out = run_page(tasks, _served(model_dir), timeout_s=180)
    if out.get("error"):
        console = "\n".join(out.get("console", [])[-20:])
        pytest.fail(f"the browser session failed: {out['error']}\n{console}")
    print("\nbrowser tasks (ms): " + ", ".join(f"{t.get('name') or t['type']} {t['ms']}" for t in out["tasks"]))
    return {t.get("name") or t["type"]: t for t in out["tasks"]} | {"boot": out["boot"], "ms": out["ms"]}


@pytest.fixture(scope="module")
def native(model_dir):
    return wt.load_model(_source(model_dir), wt.Device.cpu(), "float32")


def _model_id(model_dir: Path) -> str:
    from webtensor.web.server import served_model

    return served_model(_source(model_dir)).id


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
        assert_close(arr, want, what=case["name"])  # (fixed inputs, whole rows: no cancellation)


def test_greedy_tokens_match_native(session, native):
    gen = session["generate_ui"]
    assert "error" not in gen, gen.get("error")
    res = gen["result"]
    ref = native
    ids = ref.encode(PROMPT)
    assert res["prompt_ids"] == ids  # the pure-Python BPE in the page == tokenizers natively
    want = ref.generate(ids, N_NEW, temperature=0)
    assert res["token_ids"] == want
    assert gen["generated"] == ref.decode(want)  # the text streamed into the page
    assert "tokens/s" in gen["speed"]
    print(f"\nbrowser greedy: {res['new_tokens']} tokens, {res['tokens_per_s']:.2f} tokens/s decode; "
          f"text: {gen['generated']!r}")


def _engine_tokens(model, ids: list[int], n: int, seed: int, **kw) -> list[int]:
    """The server's engine, stepped as its scheduler steps it: the prompt, then one token a step."""
    from webtensor.serve.engine import ModelEngine, Row, Sampling

    engine, s = ModelEngine(model, max_batch=1), Sampling(seed=seed, **kw)
    out = engine.step([Row(0, tuple(ids), 0, s)])
    while len(out) < n and out[-1] not in model.eos_ids:
        out += engine.step([Row(0, (out[-1],), len(ids) + len(out) - 1, s)])
    return out


def test_sampled_tokens_match_native_and_server(session, native, model_dir, gpu):
    """temperature 0.8, top-k 40, top-p 0.9, seed 1234 typed into the page: the native model's
    tokens for that seed (CPU device and WebGPU on lavapipe), and the server engine's."""
    gen = session["sampled"]
    assert "error" not in gen, gen.get("error")
    res = gen["result"]
    ids = native.encode(PROMPT)
    kw = {k: SAMPLED[k] for k in ("temperature", "top_k", "top_p")}
    want = native.generate(ids, N_NEW, seed=SAMPLED["seed"], **kw)
    assert res["token_ids"] == want
    assert _engine_tokens(native, ids, N_NEW, SAMPLED["seed"], **kw)[: len(want)] == want
    on_gpu = wt.load_model(_source(model_dir), gpu, "float32")
    assert on_gpu.generate(ids, N_NEW, seed=SAMPLED["seed"], **kw) == want
    assert want != native.generate(ids, N_NEW, temperature=0)  # really sampled
    assert gen["generated"] == native.decode(want) and res["seed"] == SAMPLED["seed"]
    assert (res["temperature"], res["top_k"], res["top_p"]) == (0.8, 40, 0.9)
    assert not gen["errorShown"] and gen["errorText"] == "" and "tokens/s" in gen["speed"]  # the error is gone


def test_page_sampler_matches_numpy_path(session):
    """The pure-Python sampler in Pyodide picks what the numpy path picks natively."""
    from webtensor.sampling import SamplingParams, sample

    res = json.loads(session["sampler"]["results"])
    assert res["numpy"] is False and isinstance(res["seed"], int) and 0 <= res["seed"] < 2**64
    logits = np.array([(i * 7919 % 1009) / 84 - 6 for i in range(5000)], np.float32)  # ties: each value ~5 times
    assert len(res["picks"]) == 3
    for k, p in ((40, 0.9), (None, 0.9), (None, None)):
        want = [sample(logits, SamplingParams(0.8, k, p, 99), pos) for pos in range(40)]
        assert res["picks"][f"{k},{p}"] == want, (k, p)
        assert len(set(want)) > 5


def test_truncated_prompt_matches_native(session, native):
    gen = session["truncated"]
    assert "error" not in gen, gen.get("error")
    res = gen["result"]
    ids = native.encode(LONG)
    kept = native.n_ctx - N_NEW
    assert res["prompt_ids"] == ids and res["truncated_tokens"] == len(ids) - kept > 0
    assert res["prompt_tokens"] == kept and f"truncated to its last {kept} tokens" in gen["speed"]
    kw = {k: SAMPLED[k] for k in ("temperature", "top_k", "top_p")}
    assert res["token_ids"] == native.generate(ids, N_NEW, seed=SAMPLED["seed"], truncate_prompt=True, **kw)


def test_page_chat_with_the_plain_template(session, native):
    """GPT-2 has no chat template: the page's chat renders the plain one ("User: ...\\nAssistant:") and the
    reply is the native model's greedy tokens for it (up to a stop string: the next turn's start)."""
    t = session["chat"]
    assert "error" not in t, t.get("error")
    res = t["result"]
    conv = [{"role": "user", "content": CHAT_MESSAGE}]
    assert res["prompt"] == f"User: {CHAT_MESSAGE}\nAssistant:" == native.apply_chat_template(conv)
    ids = native.apply_chat_template(conv, tokenize=True)
    assert res["prompt_ids"] == ids
    want = native.generate(ids, N_NEW)
    assert res["token_ids"] == want[: len(res["token_ids"])] and (res["ended"] == "stop") == (len(want) > len(
        res["token_ids"]))
    assert res["text"] == native.decode(res["token_ids"]).split("\nUser:")[0] and "\nUser:" not in res["text"]
    assert t["turns"] == [dict(role="user", text=CHAT_MESSAGE), dict(role="assistant", text=res["text"])]
    assert t["messages"] == [*conv, {"role": "assistant", "content": res["text"].strip()}]


@pytest.mark.parametrize("name, fields, message", BAD, ids=[b[0] for b in BAD])
def test_page_refuses_bad_fields_naming_the_labels(session, native, name, fields, message):
    """Each bad field typed into the page is refused with one line naming its label on screen and what was typed
    (1e400 included: the boxes are text, so nothing is emptied before the check); nothing is generated and no
    figures stay from the run before."""
    gen = session[f"bad:{name}"]
    assert "error" not in gen, gen.get("error")  # the driver saw the run fail, as expected
    limit = min(1000, native.n_ctx - 1)
    if message == "CTX":
        n = len(native.encode(LONG))
        message = (f"prompt of {n} tokens + {N_NEW} new tokens = {n + N_NEW} exceeds the model's context of "
                   f'{native.n_ctx} positions; shorten the prompt, lower tokens, or tick "truncate prompt" to keep '
                   "the prompt's last tokens")
    assert gen["phase"] == "failed" and gen["errorShown"]
    assert gen["errorText"] == message.replace("LIMIT", str(limit))
    assert not any(api in gen["errorText"] for api in ("max_new_tokens", "top_k", "top_p", "None", "--"))
    assert gen["runError"]["type"] in ("SamplingError", "ContextLengthError")
    # shown as an error, not as output, and no figures left from the run before
    assert gen["output"] == "" and gen["generated"] is None and gen["result"] is None
    assert gen["speed"] == "–"


def test_page_runs_without_optional_features(session, native):
    """Every kernel builds and runs on a browser device without `subgroup` and `shader-f16`."""
    t = session["no-features"]
    assert "error" not in t, t.get("error")
    got = json.loads(t["results"])
    assert not {"subgroup", "shader-f16"} & set(got["features"]) and got["distinct"]
    ids = native.encode(PROMPT)
    assert got["greedy"] == native.generate(ids, N_NEW, temperature=0)
    assert got["sampled"] == native.generate(ids, N_NEW, **SAMPLED)


def test_every_kernel_variant_compiles_in_the_browser(session):
    """The browser's shader compiler (Chromium's Tint, which refuses WGSL that naga accepts, e.g. `a * b & c`
    without parentheses) gets every kernel variant the runtime builds (tests/data/kernel_variants.txt: every kernel,
    every `// #if` branch, every quantized type), each made as the page's device makes it (its enable directives,
    its declaration checked): it refuses none. Left out are only the variants that need a feature the browser's
    device lacks (SwiftShader: shader-f16), which the runtime cannot build there either."""
    t = session["kernels"]
    assert "error" not in t, t.get("error")
    got = json.loads(t["results"])
    assert_every_variant_compiled(got)
    lacks = ", ".join(sorted(set(got["skipped"].values())))
    print(f"\n{got['compiled']} kernel variants compiled by {got['adapter']} ({', '.join(got['features'])}) in "
          f"{got['s']:.1f} s; {len(got['skipped'])} need what it lacks ({lacks})")


def test_screenshot_saved(session):
    path = Path(session["screenshot"]["path"])
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
    print(f"\nscreenshot of the page after generation: {path}")


# -- two models: GPT-2 opened at ?dtype=int8 (the served q8_0 GGUF), switched to float32 by the dtype menu,
# then the real SmolLM2 Q4_1 GGUF picked in the model menu and chatted with -----------------------------------
PAGE_INT8_STATE = """
import json, sys
from webtensor.web import app
w = app._state["model"].weights
json.dumps(dict(dtype=app._state["dtype"], wte=type(w.wte).__name__, attn=type(w.blocks[0].attn_w).__name__,
                numpy="numpy" in sys.modules))
"""
PAGE_SMOL_STATE = """
import json, sys
from webtensor.web import app
m = app._state["model"]
a, f = m.weights.attns[0], m.weights.mlps[0]
mats = [getattr(a, n) for n in ("qkv", "q", "o") if getattr(a, n, None) is not None] + \
    [getattr(f, n) for n in ("gate_up", "gate", "down") if getattr(f, n, None) is not None]
json.dumps(dict(matrices=sorted({f"{type(w).__name__} {w.qtype}" for w in mats}),
                embed=f"{type(m.weights.embed).__name__} {m.weights.embed.qtype}", numpy="numpy" in sys.modules,
                jinja2="jinja2" in sys.modules, speedups="markupsafe._speedups" in sys.modules,
                native_escape="markupsafe._native" in sys.modules))
"""
SMOL_CHAT = ["What is the capital of France?", "Describe it in one word."]
SMOL_N = (8, 4)  # tokens a turn: the first answer in full (its EOS), a sampled second turn (SwiftShader: ~2 s a token)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from smollm2 import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture(scope="module")
def two_models(model_dir, smollm2) -> dict:
    _need_browser()
    from webtensor.web.headless import run_page

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    sampled = dict(temperature=SAMPLED["temperature"], topK=SAMPLED["top_k"], topP=SAMPLED["top_p"],
                   seed=SAMPLED["seed"])
    tasks = [
        dict(type="generate_ui", name="greedy", prompt=PROMPT, maxNewTokens=N_NEW, temperature=0),
        dict(type="generate_ui", name="sampled", prompt=PROMPT, maxNewTokens=N_NEW, **sampled),
        dict(type="python", name="state", code=PAGE_INT8_STATE),
        dict(type="dtype", name="to-float32", dtype="float32"),
        dict(type="generate_ui", name="greedy-float32", prompt=PROMPT, maxNewTokens=N_NEW, temperature=0),
        dict(type="model", name="to-smollm2", model=smollm2.stem),
        dict(type="chat_ui", name="smol-1", message=SMOL_CHAT[0], maxNewTokens=SMOL_N[0], temperature=0),
        dict(type="chat_ui", name="smol-2", message=SMOL_CHAT[1], maxNewTokens=SMOL_N[1], **sampled),
        dict(type="python", name="smol-state", code=PAGE_SMOL_STATE),
        dict(type="screenshot", name="smol-shot", path=str(ARTIFACTS.resolve() / "browser_smollm2_chat.png")),
        dict(type="new_chat", name="new-chat"),
    ]
    out = run_page(tasks, [smollm2, *_served(model_dir)], timeout_s=420,
                   query=f"?model={_model_id(model_dir)}&dtype=int8")
    if out.get("error"):
        pytest.fail(f"the browser session failed: {out['error']}\n" + "\n".join(out.get("console", [])[-20:]))
    print("\nbrowser tasks (ms): " + ", ".join(f"{t['name']} {t['ms']}" for t in out["tasks"]))
    return {t["name"]: t for t in out["tasks"]} | {"boot": out["boot"]}


def test_page_loads_int8_with_a_smaller_download(two_models, smollm2, model_dir):
    boot = two_models["boot"]
    m = boot["model"]
    assert boot["phase"] == "ready" and boot["dtype"] == "int8" and m["dtype"] == "int8"
    assert boot["models"] == [smollm2.stem, *([_model_id(model_dir)] if _served(model_dir) else []),
                              "webtensor-shipped"]  # the menu: the models the server serves
    assert boot["modelMenu"] == _model_id(model_dir) and boot["dtypes"] == ["float32", "float16", "int8"]
    assert m["files"] == ["model.q8_0.gguf"]  # the GGUF alone: weights, tokenizer and all
    assert m["download_bytes"] < 0.5 * m["float32_bytes"]
    assert boot["weights"].startswith("int8 (q8_0") and "downloaded" in boot["weights"]
    assert f"{m['download_bytes'] / m['float32_bytes']:.2f}x float32" in boot["weights"]
    assert boot["mode"] == "complete" and not m["chat_template"]  # GPT-2: no template of its own
    state = json.loads(two_models["state"]["results"])
    assert state == dict(dtype="int8", wte="QuantGpu", attn="QuantGpu", numpy=False)
    print(f"\nint8 page: {boot['weights']}")


def test_page_int8_tokens_match_native_int8(two_models, model_dir, gpu):
    """Greedy and seeded sampling in the page's int8 == the native int8 model on the same weights
    (quantized at load from the safetensors), on the CPU device and on lavapipe."""
    greedy, sampled = two_models["greedy"], two_models["sampled"]
    for t in (greedy, sampled):
        assert "error" not in t, t.get("error")
        assert t["result"]["dtype"] == "int8"
    for dev in (wt.Device.cpu(), gpu):
        ref = wt.load_model(_source(model_dir), dev, "q8_0")
        ids = ref.encode(PROMPT)
        assert greedy["result"]["prompt_ids"] == ids  # the GGUF's tokenizer == tokenizer.json's
        assert greedy["result"]["token_ids"] == ref.generate(ids, N_NEW, temperature=0), dev.describe()
        assert sampled["result"]["token_ids"] == ref.generate(ids, N_NEW, **SAMPLED), dev.describe()
    assert greedy["generated"] == ref.decode(greedy["result"]["token_ids"])


def test_page_dtype_menu_reloads_the_model(two_models, native):
    switched = two_models["to-float32"]
    assert switched["dtype"] == "float32" and switched["model"]["dtype"] == "float32"
    assert "model.safetensors" in switched["model"]["files"] and switched["weights"].startswith("float32")
    gen = two_models["greedy-float32"]
    assert gen["result"]["dtype"] == "float32"
    ids = native.encode(PROMPT)
    assert gen["result"]["token_ids"] == native.generate(ids, N_NEW, temperature=0)


def test_page_model_menu_loads_smollm2(two_models, smollm2):
    """Picked in the model menu, the 98 MB GGUF is downloaded as it is and loaded as stored: its Q4_1 and
    Q8_0 blocks on the GPU (no float copy), the tokenizer and chat template from its metadata, without numpy."""
    t = two_models["to-smollm2"]
    m = t["model"]
    assert not t["error"], t["error"]
    assert (m["id"], m["format"], m["dtype"], m["architecture"]) == (smollm2.stem, "gguf", "Q4_1", "llama")
    assert m["files"] == [smollm2.name] and m["download_bytes"] == smollm2.stat().st_size
    assert (m["n_layer"], m["n_embd"], m["n_head"], m["n_kv_head"], m["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert m["chat_template"] and t["mode"] == "chat" and t["dtype"] == "Q4_1"
    assert m["weight_bytes"] < 1.0 * smollm2.stat().st_size  # the blocks as stored: ~0.7 bytes a weight
    assert t["weights"].startswith("Q4_1 (GGUF, as stored): downloaded 93.8 MiB")
    state = json.loads(two_models["smol-state"]["results"])
    assert state == dict(matrices=["QuantGpu Q4_1"], embed="QuantGpu Q8_0", numpy=False, jinja2=True,
                         speedups=False, native_escape=True)
    print(f"\nSmolLM2 in the page: {t['weights']}; loaded in {m['load_s']:.1f} s of Python "
          f"({t['ms'] / 1000:.1f} s with the download)")


@pytest.fixture(scope="module")
def smol_natives(smollm2, gpu) -> list:
    """`webtensor.load_model` of the same file on lavapipe (the default readers: gguf, tokenizers) and on the
    CPU device."""
    return [wt.load_model(smollm2, gpu), wt.load_model(smollm2, "cpu", reader="pure")]


def test_page_smollm2_chat_equals_native(two_models, smol_natives):
    """A two-turn chat typed into the page: the conversation rendered by jinja2 in Pyodide and tokenized by the
    pure-Python BPE equals the native rendering and ids; the greedy first reply and the seeded second one are the
    native model's tokens for the same conversation (the same calls: each turn reuses the KV cache's prefix), on
    lavapipe and on the CPU device; special tokens never reach the text."""
    turns = [two_models["smol-1"], two_models["smol-2"]]
    for t in turns:
        assert "error" not in t, t.get("error")
    first, second = (t["result"] for t in turns)
    assert first["text"] == "The capital of France is Paris." and first["ended"] == "eos"
    assert first["token_ids"][-1] == 2 and len(first["token_ids"]) == SMOL_N[0]  # <|im_end|>: not shown
    assert second["seed"] == SAMPLED["seed"] and (second["temperature"], second["top_k"]) == (0.8, 40)
    conversation = [{"role": "user", "content": SMOL_CHAT[0]}, {"role": "assistant", "content": first["reply"]},
                    {"role": "user", "content": SMOL_CHAT[1]}]
    assert turns[1]["messages"] == [*conversation, {"role": "assistant", "content": second["reply"]}]
    assert [(d["role"], d["text"]) for d in turns[1]["turns"]] == [
        (m["role"], m["content"]) for m in turns[1]["messages"][:3]] + [("assistant", second["text"])]
    for ref in smol_natives:
        where = ref.device.describe()
        assert first["prompt"] == ref.apply_chat_template(conversation[:1]), where
        assert second["prompt"] == ref.apply_chat_template(conversation), where
        ids = ref.apply_chat_template(conversation[:1], tokenize=True)
        assert first["prompt_ids"] == ids and first["token_ids"] == ref.generate(ids, SMOL_N[0], reuse_prefix=True)
        ids = ref.apply_chat_template(conversation, tokenize=True)
        kw = {k: SAMPLED[k] for k in ("temperature", "top_k", "top_p", "seed")}
        assert second["prompt_ids"] == ids, where
        assert second["token_ids"] == ref.generate(ids, SMOL_N[1], reuse_prefix=True, **kw), where
        assert second["text"] == ref.decode(second["token_ids"]) and "<|" not in second["text"]
    assert second["token_ids"] != smol_natives[0].generate(ids, SMOL_N[1])  # really sampled
    assert two_models["new-chat"]["turns"] == 0
    assert Path(two_models["smol-shot"]["path"]).stat().st_size > 10_000  # the page after the chat, for people
    print(f"\nSmolLM2 chat in the page: {first['text']!r} ({first['tokens_per_s']:.2f} tokens/s decode, prompt of "
          f"{first['prompt_tokens']} + first token {first['prefill_s']:.1f} s); then {second['text']!r}")


def _error_page(model_dir: Path, **options) -> dict:
    _need_browser()
    from webtensor.web.headless import run_page

    out = run_page([], _served(model_dir), timeout_s=60, expectError=True, **options)
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


# -- the page as a person uses it: streaming token by token, Stop, a conversation kept across reloads, model files
# kept by the browser (a warm visit and a switch back move no model bytes), a blank message, the fallback adapter --
STORY = "Tell me a long story about a dragon."
STREAM_N = 16


@pytest.fixture(scope="module")
def second_model(tmp_path_factory) -> Path:
    from gpt2_fixtures import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("second-gpt2"), vocab_size=400, n_embd=64, n_layer=2, n_head=4,
                           n_positions=128)


@pytest.fixture(scope="module")
def visits(model_dir, second_model) -> dict:
    """One browser profile (a disk cache and Cache Storage, as a person's): a cold visit, runs stopped three ways,
    reloads, and the model menu switched back and forth."""
    _need_browser()
    from webtensor.web.headless import run_page

    first, second = _model_id(model_dir), _model_id(second_model)
    long = dict(maxNewTokens=90, temperature=0)
    tasks = [
        dict(type="generate_ui", name="stream", prompt=PROMPT, maxNewTokens=STREAM_N, temperature=0),
        dict(type="chat_ui", name="turn-1", message=CHAT_MESSAGE, maxNewTokens=N_NEW, temperature=0),
        dict(type="stop_ui", name="stop-button", mode="chat", text=STORY, after=3, how="button", **long),
        dict(type="stop_ui", name="stop-escape", mode="complete", text=PROMPT, after=2, how="escape", **long),
        dict(type="blank_message", name="blank", message=" \n\t "),
        dict(type="reload", name="reload"),
        dict(type="model", name="to-second", model=second),
        dict(type="model", name="back", model=first),
        dict(type="model", name="to-second-again", model=second),
        dict(type="model", name="back-again", model=first),
        dict(type="stop_ui", name="stop-new-chat", mode="chat", text=STORY, after=2, how="new_chat", **long),
        dict(type="reload", name="reload-after-new-chat"),
    ]
    out = run_page(tasks, [*_served(model_dir), second_model], timeout_s=300, query=f"?model={first}")
    if out.get("error"):
        pytest.fail(f"the browser session failed: {out['error']}\n" + "\n".join(out.get("console", [])[-20:]))
    print("\nbrowser tasks (ms): " + ", ".join(f"{t['name']} {t['ms']}" for t in out["tasks"]))
    return {t["name"]: t for t in out["tasks"]} | {k: out[k] for k in ("boot", "bootNet", "served")}


def _model_bytes(net: dict) -> int:
    """Bytes the browser received for model files (the manifest aside), headers included."""
    return sum(n for p, n in net["byPath"].items() if p.startswith("/model/") and p != "/model/manifest.json")


def _file_sizes(model_dir: Path) -> dict[str, int]:
    from webtensor.web.server import served_model

    m = served_model(_source(model_dir))
    return {f"/model/{m.id}/{f['name']}": f["size"] for f in m.downloads("float32")}


def test_page_streams_token_by_token(visits, native):
    """A reply is shown token by token: the output changes on screen (DOM updates as the browser delivers them)
    about once a token, not in bursts of growing readbacks; the tokens are the native model's."""
    t = visits["stream"]
    assert "error" not in t, t.get("error")
    res = t["result"]
    ids = native.encode(PROMPT)
    assert res["token_ids"] == native.generate(ids, STREAM_N, temperature=0) and res["new_tokens"] == STREAM_N
    assert t["updates"] >= STREAM_N - 1, t["updates"]  # (ring readbacks of 1, 2, 4, 8: about 5)
    chat = visits["turn-1"]
    assert chat["updates"] >= chat["result"]["new_tokens"] - 1
    print(f"\n{STREAM_N} tokens shown in {t['updates']} updates; {res['tokens_per_s']:.2f} tokens/s decode")


def test_page_stop_keeps_the_partial_reply(visits, native):
    """Stop during a reply ends it at the next token: the partial reply (the native model's first tokens) stays in
    the conversation and in its messages; Stop shows only while a reply runs, New chat and the fields stay usable."""
    t = visits["stop-button"]
    assert "error" not in t, t.get("error")
    res = t["result"]
    assert t["atStop"]["stopShown"] and t["atStop"]["newChatEnabled"] and t["atStop"]["fieldsEnabled"]
    assert res["ended"] == "stopped" and t["phase"] == "stopped"
    assert t["status"] == f"Stopped after {res['new_tokens']} tokens; the text so far is kept."
    # at the next token: the one the GPU was computing when Stop's click was handled, after `stopAt` tokens
    assert t["atStop"]["pieces"] <= t["stopAt"] and res["new_tokens"] == t["stopAt"] + 1 < 90
    first_reply = visits["turn-1"]["result"]["reply"]
    conv = [{"role": "user", "content": CHAT_MESSAGE}, {"role": "assistant", "content": first_reply},
            {"role": "user", "content": STORY}]
    ids = native.apply_chat_template(conv, tokenize=True)
    assert res["prompt_ids"] == ids
    assert res["token_ids"] == native.generate(ids, 90, temperature=0)[: res["new_tokens"]]
    assert t["messages"] == [*conv, {"role": "assistant", "content": res["reply"]}] and res["reply"]
    assert t["turns"][-1] == dict(role="assistant", text=res["text"]) and len(t["turns"]) == 4
    assert not t["stopShown"]
    esc = visits["stop-escape"]  # Escape does what Stop does
    assert "error" not in esc, esc.get("error")
    assert esc["result"]["ended"] == "stopped" and esc["result"]["new_tokens"] == esc["stopAt"] + 1 < 90
    assert esc["output"] == PROMPT + esc["result"]["text"] and esc["result"]["text"]


def test_page_refuses_a_blank_message(visits):
    t = visits["blank"]
    assert "error" not in t, t.get("error")
    assert t["sendDisabled"] and t["sent"] is None and t["runs"] == 0 and t["turns"] == 4  # nothing sent
    assert t["runError"]["message"] == t["errorText"] == "Message is empty: type something to send"


def test_page_keeps_the_conversation_across_reloads(visits):
    """A reload shows the model's conversation again (localStorage, per model), the stopped reply included; another
    model has its own; New chat (here during a reply: it stops it first) forgets it, reloads included."""
    kept = visits["stop-button"]["messages"]
    state = visits["reload"]["state"]
    assert state["phase"] == "ready" and state["messages"] == kept and state["mode"] == "chat"
    assert state["turns"] == [dict(role=m["role"], text=m["content"]) for m in kept]
    assert visits["to-second"]["phase"] == "ready"
    cleared = visits["stop-new-chat"]
    assert "error" not in cleared, cleared.get("error")
    assert cleared["result"]["ended"] == "stopped" and cleared["turns"] == [] and cleared["messages"] == []
    after = visits["reload-after-new-chat"]["state"]
    assert after["messages"] == [] and after["turns"] == []


def test_page_warm_visits_move_no_model_bytes(visits, model_dir, second_model):
    """Model files come from the browser's Cache Storage once downloaded: a reload and every switch back in the model
    menu receive no model bytes (CDP's Network events) and the server sends each file once; the cold load's bytes
    are the files' sizes, its download shown in percent."""
    cold, sizes = visits["bootNet"], _file_sizes(model_dir)
    boot = visits["boot"]
    assert boot["model"]["downloaded_bytes"] == boot["model"]["download_bytes"] == sum(sizes.values())
    assert set(boot["model"]["sources"].values()) == {"network"} and "downloaded" in boot["weights"]
    assert _model_bytes(cold) >= sum(sizes.values())
    assert boot["download"]["percent"] == 100 and boot["download"]["received"] == boot["download"]["total"] > 0
    reload = visits["reload"]
    assert _model_bytes(reload["net"]) == 0 and reload["net"]["bytes"] < 20_000  # headers, the manifest
    assert set(reload["state"]["model"]["sources"].values()) == {"cache"}
    assert reload["state"]["model"]["downloaded_bytes"] == 0
    assert "from this browser's cache" in reload["state"]["weights"]
    assert _model_bytes(visits["to-second"]["net"]) >= sum(_file_sizes(second_model).values())  # its cold load
    for name in ("back", "to-second-again", "back-again"):
        t = visits[name]
        assert _model_bytes(t["net"]) == 0 and t["model"]["downloaded_bytes"] == 0, name
        assert t["speed"] == "–", name  # the Speed line starts afresh with each model
    sent = {p: n for p, n in visits["served"].items() if p.startswith("/model/") and p != "/model/manifest.json"}
    assert sent == sizes | _file_sizes(second_model)  # each model file sent once in the whole session
    print(f"\nbytes received: cold visit {cold['bytes']:,}, warm reload {reload['net']['bytes']:,} "
          f"(model files {_model_bytes(reload['net'])}); switching back {visits['back']['net']['bytes']:,}")


def test_page_says_the_adapter_is_a_software_fallback(visits):
    """Headless Chromium's SwiftShader is a fallback adapter (`isFallbackAdapter`): the page says so, and that a
    Pyodide with numpy would let it use webtensor's CPU device (npm's Pyodide has none: WebGPU it is, the device
    menu's CPU entry off)."""
    boot = visits["boot"]
    assert boot["info"]["fallback"] is True and boot["info"]["software"] is True
    name = boot["info"]["adapter"].removesuffix(" (fallback adapter)")
    assert boot["noteShown"] and f"software fallback adapter here ({name})" in boot["note"]
    assert "A Pyodide with numpy" in boot["note"]
    assert boot["device"] == "webgpu" and boot["devices"] == [dict(value="webgpu", disabled=False),
                                                               dict(value="cpu", disabled=True)]
    assert boot["model"]["device"] == "webgpu" and boot["weights"].endswith("on the GPU")


def test_page_refuses_the_cpu_device_without_numpy(model_dir):
    boot = _error_page(model_dir, query="?device=cpu")
    assert boot["phase"] == "error" and boot["error"]["title"] == "Model failed to load."
    assert boot["error"]["detail"].startswith("the CPU device needs numpy, which this server's Pyodide does not have")


PYODIDE_WITH_NUMPY = os.environ.get("WEBTENSOR_PYODIDE_NUMPY")  # a Pyodide distribution holding numpy's wheel


@pytest.mark.skipif(not PYODIDE_WITH_NUMPY, reason="WEBTENSOR_PYODIDE_NUMPY (a Pyodide distribution with numpy, "
                                                   "e.g. Pyodide's full release) is not set")
def test_page_on_the_cpu_device_where_pyodide_has_numpy(model_dir, native):
    """With a Pyodide that has numpy, the page on a software fallback adapter runs the model on webtensor's CPU device
    by default: the native model's tokens, streamed token by token, stopped at the next token; the device menu
    switches to WebGPU (the same tokens)."""
    _need_browser()
    from webtensor.web.headless import run_page

    tasks = [dict(type="generate_ui", name="cpu", prompt=PROMPT, maxNewTokens=STREAM_N, temperature=0),
             dict(type="stop_ui", name="stop", mode="complete", text=PROMPT, maxNewTokens=90, after=3, how="button"),
             dict(type="device", name="to-webgpu", device="webgpu"),
             dict(type="generate_ui", name="webgpu", prompt=PROMPT, maxNewTokens=STREAM_N, temperature=0)]
    out = run_page(tasks, _served(model_dir), timeout_s=300, pyodide_dir=PYODIDE_WITH_NUMPY)
    assert not out.get("error"), out.get("error")
    boot, t = out["boot"], {t["name"]: t for t in out["tasks"]}
    assert boot["device"] == "cpu" and boot["model"]["device"] == "cpu" and "CPU device" in boot["note"]
    want = native.generate(native.encode(PROMPT), STREAM_N, temperature=0)
    assert t["cpu"]["result"]["token_ids"] == want and t["cpu"]["result"]["adapter"] == "CPU (numpy)"
    assert t["cpu"]["updates"] >= STREAM_N - 1
    assert t["stop"]["result"]["ended"] == "stopped" and t["stop"]["result"]["new_tokens"] == t["stop"]["stopAt"] + 1
    assert t["to-webgpu"]["model"]["device"] == "webgpu" and t["webgpu"]["result"]["token_ids"] == want
    print(f"\nCPU device in the page: {t['cpu']['result']['tokens_per_s']:.1f} tokens/s; WebGPU (SwiftShader): "
          f"{t['webgpu']['result']['tokens_per_s']:.1f}")
