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
from webtensor.tensor import _tensor_without_numpy, from_buffer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
KERNELS = Path(wt.__file__).parent / "backends" / "wgpu" / "kernels"


INCLUDES = {"common.wgsl", "epilogue.wgsl", "argreduce.wgsl", "q8_dequant.wgsl"}  # shared pieces: no bindings


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

    from webtensor.models.gpt2 import GPT2
    from webtensor.web.gpt2_web import WebGPT2

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
    assert "webtensor/web/gpu_helper.js" in names
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
