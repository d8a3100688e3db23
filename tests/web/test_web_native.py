"""The browser path's pieces, checked natively (no browser): kernel declarations, the
numpy-free tensor constructors, the numpy-free GPT-2 driver against GPT2, and the page server."""

from __future__ import annotations

import array
import json
import struct
import sys
import urllib.error
import urllib.request
import zipfile
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest

import webtensor as wt
from webtensor import quant
from webtensor.tensor import _tensor_without_numpy, from_buffer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
KERNELS = Path(wt.__file__).parent / "backends" / "wgpu" / "kernels"


# shared pieces: no entry point, or bindings declared for their includers
INCLUDES = {"common.wgsl", "epilogue.wgsl", "argreduce.wgsl", "gemv_norm.wgsl", "quant_linear_io.wgsl",
            "quant_dequant.wgsl", *(f"quant_{t.lower()}.wgsl" for t in quant.TYPES)}


@pytest.mark.parametrize("flags", [{}, {"SG": "8u", "VEC4": "true"}])
def test_every_kernel_matches_its_declaration(flags):
    """Every kernel file has a declaration in signatures.py that matches its struct P and its
    bindings (inputs `read`, outputs `read_write`: what lets the browser bind one buffer to two
    inputs and a dummy to an unused one, with no rewriting), in each preprocessor variant."""
    from webtensor.backends.wgpu.context import kernel_source
    from webtensor.backends.wgpu.signatures import SIGNATURES

    files = {f.stem for f in KERNELS.glob("*.wgsl") if f.name not in INCLUDES}
    assert files == set(SIGNATURES), files ^ set(SIGNATURES)
    for stem in sorted(files):
        code = kernel_source(stem, flags)
        SIGNATURES[stem].check_wgsl(code)
        assert code.count("read_write") == sum(b.writes for b in SIGNATURES[stem].bindings), stem


def test_a_declaration_that_disagrees_is_refused():
    from webtensor.backends.wgpu.context import kernel_source
    from webtensor.backends.wgpu.signatures import Signature

    code = kernel_source("softmax")
    with pytest.raises(wt.GPUError, match="differ from the shader's struct P"):
        Signature("softmax", "rows cols x_off x_ld", "x -> o").check_wgsl(code)
    with pytest.raises(wt.GPUError, match="bindings"):
        Signature("softmax", "rows cols x_off x_ld o_off=0", "x o -> y").check_wgsl(code)
    sig = Signature("softmax", "rows cols x_off x_ld o_off=0", "x -> o")
    with pytest.raises(wt.GPUError, match="no parameter"):
        sig.pack(dict(rows=1, cols=2, x_off=0, x_ld=2, bogus=1))
    packed = sig.pack(dict(rows=1, cols=2, x_off=3, x_ld=2))
    assert struct.unpack("<5I", packed[:20]) == (1, 2, 3, 2, 0)
    fsig = Signature("layer_norm", "rows eps:f32", "x -> o")
    assert struct.unpack("<If", fsig.pack(dict(rows=2, eps=1))[:8]) == (2, 1.0)  # an int packs as f32


def test_numpy_free_tensor(gpu):
    t = _tensor_without_numpy([[1.5, 2.0], [3.0, 4.0]], gpu, None)
    assert t.shape == (2, 2) and t.dtype is wt.float32
    assert struct.unpack("<4f", t.tobytes()) == (1.5, 2.0, 3.0, 4.0)
    i = _tensor_without_numpy(array.array("i", [3, -1, 7]), gpu, None)
    assert i.dtype is wt.int32 and struct.unpack("<3i", i.tobytes()) == (3, -1, 7)
    s = _tensor_without_numpy(2.5, gpu, None)
    assert s.shape == () and struct.unpack("<f", s.tobytes()) == (2.5,)
    with pytest.raises(wt.ShapeError):
        _tensor_without_numpy([[1.0], [2.0, 3.0]], gpu, None)
    with pytest.raises(TypeError):
        _tensor_without_numpy(b"1234", gpu, None)
    c = _tensor_without_numpy([[1.5, 2.0]], wt.Device.cpu(), None)  # (the CPU backend is numpy itself)
    assert c.numpy().tolist() == [[1.5, 2.0]]


@pytest.mark.parametrize("where", ["cpu", "wgpu"])
def test_from_buffer(where, gpu):
    dev = wt.Device.cpu() if where == "cpu" else gpu
    data = array.array("f", range(6))
    t = wt.Tensor.from_buffer(data, (2, 3), "float32", dev)
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(wt.ShapeError):
        from_buffer(data, (4, 2), "float32", dev)


def test_web_gpt2_matches_native_greedy(gpu, tmp_path):
    from gpt2_fixtures import make_checkpoint
    from webtensor.web.gpt2_web import WebGPT2

    from webtensor.models.gpt2 import GPT2

    d = make_checkpoint(tmp_path / "m", vocab_size=300, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    ref = GPT2.from_pretrained(d, device=wt.Device.cpu())
    ids = ref.encode("Once upon a time, a model")
    want = ref.generate(ids, 12, temperature=0, stop_at_eos=False)
    model = WebGPT2.load(d, gpu)
    assert model.generate(ids, 12, stop_at_eos=False) == want
    assert model.last_stats.new_tokens == 12 and model.last_stats.tokens_per_s > 0
    a = model.generate(ids, 6, temperature=0.9, top_k=20, seed=3, stop_at_eos=False)
    assert a == model.generate(ids, 6, temperature=0.9, top_k=20, seed=3, stop_at_eos=False)
    with pytest.raises(wt.ContextLengthError):
        model.generate(ids, 64)


def test_web_gpt2_int8_from_the_served_gguf(gpu, tmp_path):
    """The page's int8 loader (the served q8_0 GGUF, its blocks straight to the device, no numpy)
    gives the native int8 model's tokens, greedy and sampled; float16 where the device has it."""
    from gpt2_fixtures import make_checkpoint
    from webtensor.web.gpt2_web import WebGPT2

    from webtensor.formats.gguf_writer import write_gguf
    from webtensor.models.gpt2 import GPT2

    d = make_checkpoint(tmp_path / "m", vocab_size=300, n_embd=96, n_layer=2, n_head=2, n_positions=64)
    page = tmp_path / "page"
    page.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (page / f).write_bytes((d / f).read_bytes())
    write_gguf(d, page / "model.q8_0.gguf")
    ref = GPT2.from_pretrained(d, device=gpu, dtype="int8")
    ids = ref.encode("Once upon a time, a model")
    model = WebGPT2.load(page, gpu, dtype="int8")
    assert model.dtype == "int8" and type(model.wte).__name__ == "QuantGpu" and model.wte.qtype == "Q8_0"
    assert model.weight_bytes < 0.4 * WebGPT2.load(d, gpu).weight_bytes  # matrices at 34/32 bytes, not 4
    want = ref.generate(ids, 12, temperature=0, stop_at_eos=False)
    assert model.generate(ids, 12, stop_at_eos=False) == want
    assert want == GPT2.from_pretrained(d, device=wt.Device.cpu(), dtype="int8").generate(
        ids, 12, temperature=0, stop_at_eos=False)
    kw = dict(temperature=0.9, top_k=20, seed=3, stop_at_eos=False)
    assert model.generate(ids, 8, **kw) == ref.generate(ids, 8, **kw)
    if gpu.has_f16:
        m16 = WebGPT2.load(d, gpu, dtype="float16")
        assert m16.wte.dtype is wt.float16 and m16.wpe.dtype is wt.float32
        assert m16.generate(ids, 8, stop_at_eos=False) == GPT2.from_pretrained(d, device=gpu, dtype="float16").generate(
            ids, 8, temperature=0, stop_at_eos=False)
    with pytest.raises(wt.CheckpointError, match="exactly one .gguf"):
        WebGPT2.load(d, gpu, dtype="int8")
    with pytest.raises(wt.CheckpointError, match="not 'int4'"):
        WebGPT2.load(d, gpu, dtype="int4")
    f32 = tmp_path / "f32"
    f32.mkdir()
    for f in ("config.json", "tokenizer.json"):
        (f32 / f).write_bytes((d / f).read_bytes())
    write_gguf(d, f32 / "model.gguf", "f32")
    with pytest.raises(wt.CheckpointError, match="is F32; the page's int8 model reads Q8_0"):
        WebGPT2.load(f32, gpu, dtype="int8")


def test_server_serves_int8(server):
    """?dtype=int8: config + tokenizer + the q8_0 GGUF (no safetensors), about a quarter of the bytes."""
    from webtensor.formats.gguf_pure import GGUFFile

    man = json.loads(_get(server + "model/manifest.json")[1])
    assert man["dtype"] == "float32" and man["dtypes"] == ["float32", "float16", "int8"]
    q8 = json.loads(_get(server + "model/manifest.json?dtype=int8")[1])
    names = [f["name"] for f in q8["files"]]
    assert q8["dtype"] == "int8" and "model.q8_0.gguf" in names and not any(n.endswith(".safetensors") for n in names)
    assert q8["float32_bytes"] == sum(f["size"] for f in man["files"])
    status, body, _ = _get(server + "model/model.q8_0.gguf")
    assert status == 200 and len(body) == next(f["size"] for f in q8["files"] if f["name"] == "model.q8_0.gguf")
    f = GGUFFile.from_bytes(body)
    assert f.tensors["token_embd.weight"].type_name == "Q8_0" and f.tensors["position_embd.weight"].type_name == "F32"
    f32 = next(f["size"] for f in man["files"] if f["name"] == "model.safetensors")
    assert len(body) < 0.45 * f32
    status, body, _ = _get(server + "model/manifest.json?dtype=int4")
    assert status == 404 and b"unknown dtype 'int4'" in body


def test_server_int8_of_a_bad_checkpoint_says_why(tmp_path):
    from gpt2_fixtures import make_checkpoint

    from webtensor.web.server import WebApp

    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.js").write_text("// stand-in")
    (pyo / "pyodide.asm.wasm").write_bytes(b"\0asm")
    d = make_checkpoint(tmp_path / "m", vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:2000])
    app = WebApp(d, pyo)
    assert app.manifest("float32")["files"]  # the float page still gets its files (and says what is wrong)
    for _ in range(2):  # written once: the error is kept
        with pytest.raises(web_setup_error(), match="int8 \\(q8_0\\) weights could not be written"):
            app.manifest("int8")
    with pytest.raises(wt.UsageError, match="dtype"):
        WebApp(d, pyo, dtype="int4")


def web_setup_error() -> type:
    from webtensor.web.server import SetupError

    return SetupError


@pytest.fixture()
def server(tmp_path):
    from gpt2_fixtures import make_checkpoint

    from webtensor.web.server import serve_in_thread

    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.js").write_text("// stand-in")
    (pyo / "pyodide.asm.wasm").write_bytes(b"\0asm")
    model = make_checkpoint(tmp_path / "m", vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    srv, url = serve_in_thread(model_dir=model, pyodide_dir=pyo)
    yield url
    srv.shutdown()
    srv.server_close()


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), ""


def test_server_routes(server):
    status, body, ctype = _get(server)
    assert status == 200 and b"webtensor" in body and ctype.startswith("text/html")
    for name in ("app.js", "gpu_helper.js", "pyodide/pyodide.js"):
        assert _get(server + name)[0] == 200, name
    assert _get(server + "pyodide/pyodide.asm.wasm")[2] == "application/wasm"
    status, body, _ = _get(server + "webtensor.zip")
    names = zipfile.ZipFile(BytesIO(body)).namelist()
    assert "webtensor/__init__.py" in names and "webtensor/backends/wgpu/kernels/matmul.wgsl" in names
    assert "webtensor/backends/wgpu/gpu_helper.js" in names
    assert not any("/shipped/" in n or "__pycache__" in n for n in names)
    man = json.loads(_get(server + "model/manifest.json")[1])
    assert {f["name"] for f in man["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert _get(server + "model/model.safetensors")[0] == 200
    for bad in ("pyodide/../../etc/passwd", "pyodide/%2e%2e/x", "model/../config.json", "etc/passwd",
                "web/server.py"):
        assert _get(server + bad)[0] == 404, bad


def test_server_needs_pyodide(tmp_path, monkeypatch):
    from webtensor.web import server as web_server

    monkeypatch.delenv("WEBTENSOR_PYODIDE_DIR", raising=False)
    monkeypatch.setattr(web_server, "PACKAGE_DIR", tmp_path / "nowhere" / "src" / "webtensor")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(web_server.SetupError, match="setup.sh --web"):
        web_server.find_pyodide()


def test_cli_has_web_command(capsys):
    from webtensor.cli import main

    with pytest.raises(SystemExit) as e:
        main(["web", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--no-open" in out and "127.0.0.1" in out


# -- the page's inputs: checked as `webtensor generate` checks its flags ----------------------------
PAGE_BAD = [  # (the form's field, the text typed, the CLI flag)
    ("max_new_tokens", "0", "-n"), ("max_new_tokens", "many", "-n"), ("max_new_tokens", "", "-n"),
    ("temperature", "-1", "-t"), ("temperature", "nan", "-t"), ("temperature", "hot", "-t"),
    ("top_k", "-3", "--top-k"), ("top_k", "2.5", "--top-k"), ("top_p", "0", "--top-p"),
    ("top_p", "1.01", "--top-p"), ("seed", "-1", "--seed"), ("seed", "abc", "--seed"),
]
GOOD_FIELDS = dict(max_new_tokens="5", temperature="0.8", top_k="40", top_p="0.9", seed="7")


@pytest.fixture(scope="module")
def page_model(tmp_path_factory, gpu):
    from gpt2_fixtures import make_checkpoint
    from webtensor.web.gpt2_web import WebGPT2

    d = make_checkpoint(tmp_path_factory.mktemp("page"), vocab_size=300, n_embd=32, n_layer=1, n_head=2,
                        n_positions=32)
    return d, WebGPT2.load(d, gpu)


def _cli_error(capsys, model_dir, prompt: str, argv: list[str]) -> str:
    import re

    from webtensor.cli import main

    capsys.readouterr()
    assert main(["generate", prompt, "--model", str(model_dir), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    err = re.sub(r" \(see `webtensor generate --help`\)$", "", err)
    return re.sub(r"^webtensor: error: (argument [^ ]+: )?", "", err)


@pytest.mark.parametrize("field, text, flag", PAGE_BAD, ids=[f"{f}={t!r}" for f, t, _ in PAGE_BAD])
def test_page_fields_refused_with_the_cli_message(page_model, capsys, field, text, flag):
    from webtensor.web.app import check_request

    d, model = page_model
    with pytest.raises(wt.SamplingError) as e:
        check_request(model, "Once upon a time", **{**GOOD_FIELDS, field: text})
    assert str(e.value) == _cli_error(capsys, d, "Once upon a time", [flag, text])


def test_page_prompt_over_the_context(page_model, capsys):
    from webtensor.web.app import check_request

    d, model = page_model
    prompt = "Once upon a time, " * 10
    with pytest.raises(wt.ContextLengthError) as e:
        check_request(model, prompt, **GOOD_FIELDS, truncate_prompt=False)
    assert str(e.value) == _cli_error(capsys, d, prompt, ["-n", "5"])
    req = check_request(model, prompt, **GOOD_FIELDS, truncate_prompt=True)  # as --truncate-prompt
    assert req["run_ids"] == req["ids"][-(32 - 5):] and len(req["ids"]) > 27
    with pytest.raises(wt.SamplingError, match="not valid UTF-8") as e:
        check_request(model, "bad \udcff byte", **GOOD_FIELDS)
    assert str(e.value) == _cli_error(capsys, d, "bad \udcff byte", [])


def test_page_blank_optional_fields_are_off(page_model):
    from webtensor.web.app import check_request

    _, model = page_model
    req = check_request(model, "Hello", "4", "1", top_k="", top_p=" ", seed="")
    assert (req["max_new_tokens"], req["temperature"], req["top_k"], req["top_p"], req["seed"]) == (4, 1.0, None,
                                                                                                   None, None)
    req = check_request(model, "Hello", 4, 0.5, top_k=0, top_p=1, seed=3)  # numbers (from JavaScript) pass too
    assert (req["top_k"], req["top_p"], req["seed"]) == (None, 1.0, 3)


def test_page_generate_entry_point(page_model):
    """app.generate with the form's text: the driver's tokens for those parameters, the seed reported."""
    import asyncio

    from webtensor.web import app

    _, model = page_model
    app._state.update(device=model.device, model=model)
    try:
        prompt = "Once upon a time, " * 10
        res = json.loads(asyncio.run(app.generate(prompt, "5", "0.8", "7", None, "40", "0.9", True)))
        ids = model.tokenizer.encode(prompt)
        assert res["prompt_ids"] == ids and res["truncated_tokens"] == len(ids) - 27
        assert res["token_ids"] == model.generate(ids[-27:], 5, temperature=0.8, top_k=40, top_p=0.9, seed=7)
        assert res["seed"] == 7 and res["prompt_tokens"] == 27
        fresh = json.loads(asyncio.run(app.generate("Hello", "3", "1.0", "", None, "", "")))
        assert isinstance(fresh["seed"], int) and fresh["top_k"] is None and fresh["top_p"] is None
    finally:
        app._state.update(device=None, model=None)
