"""The browser path's pieces, checked natively (no browser): kernel declarations, the numpy-free tensor
constructors, the page's Python (`web/app.py`: loading, completion, chat) run without numpy against
`webtensor.load_model`, and the page server (`webtensor web`: its models, manifest, files and safety rules)."""

from __future__ import annotations

import array
import json
import re
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
from webtensor.errors import ChatTemplateError
from webtensor.tensor import _tensor_without_numpy, from_buffer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
KERNELS = Path(wt.__file__).parent / "backends" / "wgpu" / "kernels"


# shared pieces: no entry point, or bindings declared for their includers
INCLUDES = {"common.wgsl", "epilogue.wgsl", "argreduce.wgsl", "gemv_norm.wgsl", "quant_linear_io.wgsl",
            "matmul_engine_core.wgsl",
            "cached_attention_lanes.wgsl", "cached_attention_main.wgsl", "cached_attention_params.wgsl",
            "attention_tiled_main.wgsl", "attention_flash_main.wgsl", "attention_cache_rows.wgsl", "kv_pages.wgsl",
            "quant_dequant.wgsl", "q8_act.wgsl", "quant_k4_scales.wgsl", "quant_k2_units.wgsl",
            *(f"quant_{t.lower()}.wgsl" for t in quant.TYPES),
            "expert_gemv_main.wgsl", "expert_gemm_main.wgsl"}


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


# -- the kernel variants the runtime builds (tests/data/kernel_variants.txt, tools/kernel_variants.py): what the
# browser test compiles with Chromium's compiler (test_browser.py's session), checked complete here -----------------
VARIANTS_FILE = Path(__file__).resolve().parents[1] / "data" / "kernel_variants.txt"
STALE = "tests/data/kernel_variants.txt is stale: rerun `python tools/kernel_variants.py`"


def kernel_variants() -> list[tuple[str, dict[str, str]]]:
    from webtensor.web.selftest import parse_variants

    return parse_variants(VARIANTS_FILE.read_text())


def _guards(lines: list[str]) -> list[set[str]]:
    """For each line of a kernel's source, the defines that must be set for it to be kept (its enclosing `// #if
    NAME` blocks; not those of `// #else` ones)."""
    out, stack = [], []
    for line in lines:
        m = re.match(r"^\s*// #(if|else|endif)\b\s*(\w*)", line)
        if m and m.group(1) == "if":
            stack.append(m.group(2))
        elif m and m.group(1) == "else":
            stack[-1] = ""
        elif m:
            stack.pop()
        out.append(set(stack) - {""})
    return out


def test_kernel_variants_cover_every_kernel_branch_and_type():
    """The list holds every kernel file and nothing else; in each kernel every line an `// #if` / `// #else` can
    drop (its includes' too) is kept by at least one listed variant, but for the branches of a shared include that
    need a define the kernel never takes (the epilogue's CPACK outside matmul_engine: named in neither the kernel's
    own code nor its variants); every kernel that picks a quantized type by a define is listed with each type of
    `quant.TYPES`."""
    from webtensor.backends.wgpu.context import expand_includes, preprocess

    variants = kernel_variants()
    files = {f.stem for f in KERNELS.glob("*.wgsl") if f.name not in INCLUDES}
    listed = {f for f, _ in variants}
    assert listed == files, f"{STALE} (kernels {sorted(files - listed)} missing, {sorted(listed - files)} gone)"
    directive = re.compile(r"^\s*// #(if|else|endif)\b")
    for stem in sorted(files):
        lines = expand_includes(stem).split("\n")
        marked = "\n".join(f"{line} //@{i}" for i, line in enumerate(lines))  # (each line tagged with its number)
        kept: set[str] = set()
        taken: set[str] = set()  # the defines some variant gives
        for f, defines in variants:
            if f == stem:
                kept.update(re.findall(r"//@(\d+)$", preprocess(marked, defines, stem), flags=re.M))
                taken.update(defines)
        own = set(re.findall(r"\w+", re.sub(r"//[^\n]*", "", (KERNELS / f"{stem}.wgsl").read_text())))
        never = [line.strip() for i, (line, need) in enumerate(zip(lines, _guards(lines), strict=True))
                 if str(i) not in kept and not directive.match(line) and need <= taken | own]
        assert not never, f"{STALE}: no listed variant of {stem} keeps {never[:3]}"
        types = taken & set(quant.TYPES)
        assert not types or types == set(quant.TYPES), f"{STALE}: {stem} lacks {sorted(set(quant.TYPES) - types)}"


def assert_every_variant_compiled(got: dict) -> None:
    """A `selftest.check_kernels` report over the whole list: no variant refused, and only those that need a
    feature the device lacks left out."""
    assert got["errors"] == {}, "\n".join(f"{k}:\n  {v}" for k, v in list(got["errors"].items())[:10])
    assert got["compiled"] + len(got["skipped"]) == len(kernel_variants()) and got["compiled"] > 0
    for variant, needs in got["skipped"].items():
        assert not set(needs.split(", ")) & set(got["features"]), (variant, needs)


def test_every_kernel_variant_compiles_natively(gpu):
    """Every listed variant, made as the device makes it (its declaration checked), compiles with naga: the list
    is no stale set of defines (a kernel that now needs another would not compile). The browser's compiler gets
    the same list in test_browser.py."""
    from webtensor.web.selftest import check_kernels

    got = check_kernels(gpu, kernel_variants())
    assert_every_variant_compiled(got)
    assert {"shader-f16", "subgroup"} - set(got["features"]) or not got["skipped"]


def test_check_kernels_reports_what_a_compiler_refuses(gpu, tmp_path):
    """check_kernels names each variant a compiler refuses with its message, and skips (naming the features) those
    the device cannot build: a device without shader-f16 and subgroups."""
    from webtensor.web.selftest import check_kernels

    bare = wt.Device.wgpu(features=())
    got = check_kernels(bare, [("softmax", {"TX": "f32", "TO": "f32"}), ("softmax", {"TX": "f16", "TO": "f32"}),
                               ("softmax", {"TX": "f32"}), ("rms_norm", {"TX": "f32", "TW": "f32", "TO": "f32",
                                                                         "LANES": "0u"})])
    assert got["compiled"] == 3 and got["features"] == sorted(bare.ctx.api.features)
    assert got["skipped"] == {"softmax TO=f32 TX=f16": "shader-f16"}
    assert set(got["errors"]) == {"softmax TX=f32", "rms_norm LANES=0u TO=f32 TW=f32 TX=f32"}
    assert "TO" in got["errors"]["softmax TX=f32"]  # (naga: no definition in scope for identifier `TO`)


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


# -- the page's inputs: the API's rules, refused in the page's words (the labels on screen) ------------------
PAGE_BAD = [  # (the form's field, the text typed, the page's message); the test model's context is 32 positions
    ("max_new_tokens", "0", "tokens must be a whole number from 1 to 31, got '0'"),
    ("max_new_tokens", "5000", "tokens must be a whole number from 1 to 31, got '5000'"),
    ("max_new_tokens", "many", "tokens must be a whole number from 1 to 31, got 'many'"),
    ("max_new_tokens", "", "tokens is empty: enter a whole number from 1 to 31"),
    ("temperature", "-1", "temperature must be a number >= 0 (0 = greedy), got '-1'"),
    ("temperature", "1e400", "temperature must be a number >= 0 (0 = greedy), got '1e400'"),
    ("temperature", "nan", "temperature must be a number >= 0 (0 = greedy), got 'nan'"),
    ("temperature", "hot", "temperature must be a number >= 0 (0 = greedy), got 'hot'"),
    ("temperature", " ", "temperature is empty: enter a number >= 0 (0 = greedy)"),
    ("top_k", "-3", "top-k must be a whole number >= 0 (0 or blank = off), got '-3'"),
    ("top_k", "2.5", "top-k must be a whole number >= 0 (0 or blank = off), got '2.5'"),
    ("top_p", "0", "top-p must be a number in (0, 1] (1 or blank = off), got '0'"),
    ("top_p", "1.01", "top-p must be a number in (0, 1] (1 or blank = off), got '1.01'"),
    ("seed", "-1", "seed must be a whole number >= 0 (blank = random), got '-1'"),
    ("seed", "abc", "seed must be a whole number >= 0 (blank = random), got 'abc'"),
]
GOOD_FIELDS = dict(max_new_tokens="5", temperature="0.8", top_k="40", top_p="0.9", seed="7")
API_NAMES = ("max_new_tokens", "top_k", "top_p", "None", "--")


@pytest.fixture(scope="module")
def page_model(tmp_path_factory, gpu):
    """A small GPT-2 checkpoint and the model the page makes of it (the pure-Python readers)."""
    from gpt2_fixtures import make_checkpoint

    d = make_checkpoint(tmp_path_factory.mktemp("page"), vocab_size=300, n_embd=32, n_layer=1, n_head=2,
                        n_positions=32)
    return d, wt.load_model(d, gpu, "float32", reader="pure")


@pytest.mark.parametrize("field, text, want", PAGE_BAD, ids=[f"{f}={t!r}" for f, t, _ in PAGE_BAD])
def test_page_fields_refused_naming_the_label(page_model, field, text, want):
    """Each bad field is refused with one line that names its label on screen and what was typed (1e400, which a
    number box would have emptied, included), never an API name; in a completion and in a chat turn alike."""
    from webtensor.web.app import check_chat, check_request

    _, model = page_model
    for check, first in ((check_request, "Once upon a time"), (check_chat, [{"role": "user", "content": "Hi"}])):
        with pytest.raises(wt.SamplingError) as e:
            check(model, first, **{**GOOD_FIELDS, field: text})
        assert str(e.value) == want
        assert not any(n in str(e.value) for n in API_NAMES)


def test_page_tokens_limited_by_the_box_and_the_context(page_model, tmp_path):
    """The tokens box takes at most app.MAX_NEW_TOKENS (what the page shows), less where the model's context is
    smaller; load_model reports the limit the page shows."""
    import asyncio

    from webtensor.web import app

    d, model = page_model
    assert app.max_new_tokens_limit(model) == 31
    room = 32 - len(model.encode("Hi"))
    assert app.check_request(model, "Hi", str(room), "0")["max_new_tokens"] == room
    from gpt2_fixtures import make_checkpoint

    long = wt.load_model(make_checkpoint(tmp_path / "long", vocab_size=300, n_embd=32, n_layer=1, n_head=2,
                                         n_positions=2048), model.device, "float32", reader="pure")
    assert app.max_new_tokens_limit(long) == app.MAX_NEW_TOKENS == 1000
    assert app.check_request(long, "Hi", "1000", "0")["max_new_tokens"] == 1000
    with pytest.raises(wt.SamplingError, match="^tokens must be a whole number from 1 to 1000, got '1001'$"):
        app.check_request(long, "Hi", "1001", "0")
    app._state.update(device=model.device)
    try:
        facts = json.loads(asyncio.run(app.load_model(str(d), None, "float32")))
        assert facts["max_new_tokens"] == 31 and facts["n_positions"] == 32
    finally:
        app._state.update(device=None, model=None, dtype=None)


def test_page_prompt_over_the_context(page_model):
    from webtensor.web.app import check_request

    _, model = page_model
    prompt = "Once upon a time, " * 10
    n = len(model.encode(prompt))
    with pytest.raises(wt.ContextLengthError) as e:
        check_request(model, prompt, **GOOD_FIELDS, truncate_prompt=False)
    assert str(e.value) == (f"prompt of {n} tokens + 5 new tokens = {n + 5} exceeds the model's context of 32 "
                            'positions; shorten the prompt, lower tokens, or tick "truncate prompt" to keep the '
                            "prompt's last tokens")
    req = check_request(model, prompt, **GOOD_FIELDS, truncate_prompt=True)  # as --truncate-prompt
    assert req["run_ids"] == req["ids"][-(32 - 5):] and len(req["ids"]) > 27
    with pytest.raises(wt.SamplingError, match="not valid UTF-8"):
        check_request(model, "bad \udcff byte", **GOOD_FIELDS)


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


# -- the page's Python, natively and without numpy, against `webtensor.load_model` -------------------------
PAGE_PYTHON = r"""
import asyncio, json, sys
sys.modules["numpy"] = None  # the page (Pyodide) has no numpy: any import of it fails
from webtensor.device import Device
from webtensor.web import app

app._state["device"] = Device.wgpu()
out = []
for c in json.loads(sys.argv[1]):
    run = lambda call: json.loads(asyncio.run(call))
    info = run(app.load_model(c["path"], None, c["dtype"]))
    greedy = run(app.generate(c["prompt"], str(c["n"]), "0", ""))
    sampled = run(app.generate(c["prompt"], str(c["n"]), "0.8", "7", None, "40", "0.9"))
    turn1 = run(app.chat(json.dumps(c["chat"][:1]), str(c["n"]), "0"))
    turn2 = run(app.chat(json.dumps([*c["chat"][:1], {"role": "assistant", "content": turn1["reply"]},
                                     *c["chat"][1:]]), str(c["n"]), "0.8", "7", None, "40", "0.9"))
    out.append(dict(info=info, greedy=greedy, sampled=sampled, turns=[turn1, turn2]))
print(json.dumps(dict(cases=out, numpy=sys.modules["numpy"] is not None)))
"""
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT = [{"role": "user", "content": "What is the capital of France?"}, {"role": "user", "content": "And of Germany?"}]


def _native_run(model, prompt: str, n: int) -> dict:
    """What PAGE_PYTHON does, on a native model: the same calls in the same order (the chat turns reuse the
    KV cache's prefix, as the page's do)."""
    sampled = dict(temperature=0.8, top_k=40, top_p=0.9, seed=7)
    ids = model.encode(prompt)
    out = dict(prompt_ids=ids, greedy=model.generate(ids, n), sampled=model.generate(ids, n, **sampled), turns=[])
    conv = CHAT[:1]
    for i, kw in enumerate(({}, sampled)):
        ids = model.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        new = model.generate(ids, n, reuse_prefix=True, **kw)
        out["turns"].append(dict(prompt=model.apply_chat_template(conv), prompt_ids=ids, token_ids=new))
        reply = model.decode(new).split("\nUser:")[0].strip()  # (the plain template's stop)
        conv = [*conv, {"role": "assistant", "content": reply}, *CHAT[1 + i:2 + i]]
    return out


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory) -> Path:
    """A small random Llama (GQA) with a ChatML chat template, written as a Q4_1 GGUF file by webtensor's writer."""
    from llama_fixtures import make_llama

    from webtensor.formats.gguf_writer import write_gguf

    root = tmp_path_factory.mktemp("llama")
    d = make_llama(root / "hf", "llama-gqa")
    (d / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    return write_gguf(d, root / "tiny-llama.Q4_1.gguf", "q4_1")


def test_page_python_without_numpy_equals_native(gpu, tmp_path, llama_gguf):
    """The page's entry points (`app.load_model` with the pure-Python readers, `generate`, `chat`) in a process
    where numpy cannot be imported: the shipped GPT-2 in float32 (float16 where the device has it) and in int8
    from the q8_0 GGUF the server writes, and a Llama GGUF in Q4_1 as stored (its own chat template). Greedy and
    seeded tokens of a completion and of a two-turn chat equal `webtensor.load_model`'s natively, on this device
    and the CPU. (The real SmolLM2 file: the browser test.)"""
    import subprocess

    from webtensor.formats.gguf_writer import gguf_bytes
    from webtensor.web.server import default_model_dir

    (tmp_path / "int8").mkdir()
    (tmp_path / "int8" / "model.q8_0.gguf").write_bytes(gguf_bytes(default_model_dir(), "q8_0"))
    cases = [(str(default_model_dir()), "float32", None, "float32"),
             *([(str(default_model_dir()), "float16", None, "float16")] if gpu.has_f16 else []),
             (str(tmp_path / "int8"), "int8", None, "q8_0"), (str(llama_gguf), "Q4_1", llama_gguf, None)]
    page = [dict(path=p, dtype=d, prompt="It is a truth universally acknowledged", n=6, chat=CHAT)
            for p, d, _, _ in cases]
    run = subprocess.run([sys.executable, "-c", PAGE_PYTHON, json.dumps(page)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["numpy"] is False
    for (_, dtype, source, native_dtype), res in zip(cases, got["cases"], strict=True):
        info = res["info"]
        if source is None:  # the shipped GPT-2: no chat template, the plain one
            assert (info["architecture"], info["dtype"], info["chat_template"]) == ("gpt2", dtype, False)
            assert res["turns"][0]["prompt"] == "User: What is the capital of France?\nAssistant:"
        else:
            assert (info["architecture"], info["dtype"], info["chat_template"]) == ("llama", "Q4_1", True)
            assert res["turns"][0]["prompt"] == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" \
                                                "<|im_start|>assistant\n"
        for dev in (gpu, wt.Device.cpu()):
            ref = wt.load_model(source, dev, native_dtype)
            want = _native_run(ref, "It is a truth universally acknowledged", 6)
            where = f"{dtype} on {dev.describe()}"
            assert res["greedy"]["prompt_ids"] == want["prompt_ids"], where
            assert res["greedy"]["token_ids"] == want["greedy"], where
            assert res["sampled"]["token_ids"] == want["sampled"] and want["sampled"] != want["greedy"], where
            for turn, w in zip(res["turns"], want["turns"], strict=True):
                assert (turn["prompt"], turn["prompt_ids"]) == (w["prompt"], w["prompt_ids"]), where
                n = len(turn["token_ids"])  # (fewer where a stop string ended the turn)
                assert turn["token_ids"] == w["token_ids"][:n] and (n == 6 or turn["ended"] != "length"), where


class _Spelled:
    """A stand-in model whose generation spells fixed tokens (one character each): `app._stream`'s stop and EOS
    handling, checked without a model."""

    def __init__(self, text: str, eos: bool = False):
        self.pieces, self.eos_ids, self.asked = list(text) + (["<eos>"] if eos else []), frozenset([len(text)]), 0
        self.tokenizer = self

    def token_bytes(self, i: int) -> bytes:
        return b"" if self.pieces[i] == "<eos>" else self.pieces[i].encode()

    def generate_ids(self, ids, n, **kw):
        for i in range(min(n, len(self.pieces))):
            self.asked += 1
            yield i


@pytest.mark.parametrize("text, stops, n, want, ended, asked", [
    ("Hi there.\nUser: more", ["\nUser:", "\nSystem:"], 30, "Hi there.", "stop", 15),
    ("Hi.\nUsers unite", ["\nUser:"], 30, "Hi.\nUsers unite", "length", 15),  # a partial stop is let go
    ("Hello", ["\nUser:"], 3, "Hel", "length", 3),
    ("Bye", [], 30, "Bye", "eos", 4),
])
def test_page_stream_stops(text, stops, n, want, ended, asked):
    """Streamed text never shows a stop string, even in part; generation ends at it (no token after it is asked
    for), at EOS (not shown) or at the token limit."""
    from webtensor.sampling import SamplingParams
    from webtensor.web import app

    model = _Spelled(text, eos=ended == "eos")
    shown: list[str] = []
    got, why, st = app._stream(model, [1], n, SamplingParams(0.0), lambda p, k, tps: shown.append(p), stops)
    assert (got, why, "".join(shown)) == (want, ended, want)
    assert model.asked == asked == st.new_tokens


@pytest.mark.parametrize("stop_after, n, want, ended", [
    (3, 30, "Hel", "stopped"), (1, 30, "H", "stopped"), (5, 5, "Hello", "length"), (9, 30, "Hello", "eos")])
def test_page_stream_stop_requested(stop_after, n, want, ended):
    """The page's Stop: `stop_requested()` is asked after each token; once it says so, generation ends there (no
    further token asked for), the text so far kept and the run marked "stopped" (a run that ended by itself
    anyway is not)."""
    from webtensor.sampling import SamplingParams
    from webtensor.web import app

    model = _Spelled("Hello", eos=True)
    asked: list[int] = []

    def stop_requested() -> bool:
        asked.append(model.asked)
        return model.asked >= stop_after

    shown: list[str] = []
    got, why, st = app._stream(model, [1], n, SamplingParams(0.0), lambda p, k, tps: shown.append(p),
                               stop_requested=stop_requested)
    assert (got, why, "".join(shown)) == (want, ended, want)
    assert model.asked == st.new_tokens == min(stop_after, n, 6)
    assert asked == list(range(1, min(stop_after, n - 1, 6) + 1))  # after each token but the last one asked for


def test_follow_steps_reads_back_each_token(page_model, monkeypatch):
    """follow_steps=1 (the page while a reply is on screen): every readback of followed greedy steps brings one
    token, with the next step already queued; the tokens are the default ring's (16 steps a readback at most)."""
    from webtensor.runtime.runner import RING_STEPS, ModelRunner

    _, model = page_model
    ids = model.encode("Once upon a time")
    sizes: list[int] = []
    collect = ModelRunner.collect

    def counted(self, h):
        out = collect(self, h)
        sizes.append(len(out.tokens))
        return out

    monkeypatch.setattr(ModelRunner, "collect", counted)
    want = model.generate(ids, 20, stop_at_eos=False)
    assert max(sizes) > 1 and len(sizes) < 19  # the default: readbacks of several steps
    sizes.clear()
    streamed = model.generate_ids(ids, 20, stop_at_eos=False, follow_steps=1)
    got = [next(streamed)]  # the prompt's token
    got.append(next(streamed))
    assert sizes == [1]  # the first followed token is out after one readback of one step
    got += list(streamed)
    assert got == want and sizes == [1] * 19
    for bad in (0, RING_STEPS + 1, 1.5, True):
        with pytest.raises(wt.ArgumentError, match="follow_steps must be an integer in \\[1, 16\\]"):
            model.generate(ids, 3, follow_steps=bad)


def test_page_chat_checks(page_model):
    """A conversation that leaves no room for a reply, an empty one, a blank last message, bad text and a message
    without a role are refused with one line each; the reply gets what the context leaves."""
    from webtensor.web.app import EMPTY_MESSAGE, check_chat

    _, model = page_model
    msgs = [{"role": "user", "content": "Hello"}]
    for blank in ("", "  \n\t"):
        with pytest.raises(wt.SamplingError) as e:
            check_chat(model, [*msgs, {"role": "assistant", "content": "Hi"}, {"role": "user", "content": blank}],
                       "5", "0")
        assert str(e.value) == EMPTY_MESSAGE == "Message is empty: type something to send"
    req = check_chat(model, msgs, "31", "0", seed="3")
    assert req["prompt"] == "User: Hello\nAssistant:" and req["ids"] == model.apply_chat_template(msgs, tokenize=True)
    assert req["max_new_tokens"] == 32 - len(req["ids"]) and req["seed"] == 3  # what the context leaves
    with pytest.raises(wt.ContextLengthError, match=r"the conversation is \d+ tokens, the model's context 32 "
                                                    "positions: press New chat"):
        check_chat(model, [{"role": "user", "content": "Once upon a time, " * 10}], "5", "0")
    with pytest.raises(wt.SamplingError, match="a chat needs a list of messages"):
        check_chat(model, [], "5", "0")
    with pytest.raises(wt.SamplingError, match="not valid UTF-8"):
        check_chat(model, [{"role": "user", "content": "bad \udcff"}], "5", "0")
    with pytest.raises(ChatTemplateError, match="message 0 has no 'role' string"):
        check_chat(model, [{"content": "beep"}], "5", "0")


# -- the server: several models, their manifest and files, and nothing else ---------------------------------
def _pyodide_stand_in(root: Path) -> Path:
    pyo = root / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.js").write_text("// stand-in")
    (pyo / "pyodide.asm.wasm").write_bytes(b"\0asm")
    return pyo


@pytest.fixture()
def served(tmp_path, llama_gguf):
    """A server for a GPT-2 checkpoint directory (with a stray file the page must not reach) and a GGUF file."""
    from gpt2_fixtures import make_checkpoint

    from webtensor.web.server import serve_in_thread

    model = make_checkpoint(tmp_path / "tiny-gpt2", vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    (model / "secret.txt").write_text("not a model file")
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "terse.jinja").write_text("{{ messages[0]['content'] }}")
    srv, url = serve_in_thread(models=[model, llama_gguf], pyodide_dir=_pyodide_stand_in(tmp_path))
    yield url, model, srv.webtensor_app
    srv.shutdown()
    srv.server_close()


def _get(url: str, method: str = "GET", **headers: str) -> tuple[int, bytes, str, dict[str, str]]:
    """(status, body, Content-Type, the headers) of a request with `headers` (If_None_Match= ...)."""
    req = urllib.request.Request(url, method=method, headers={k.replace("_", "-"): v for k, v in headers.items()})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers.get("Content-Type", ""), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), "", dict(e.headers)


def test_server_lists_every_model(served, llama_gguf):
    """The manifest: the models in the order given, then the shipped one; a float checkpoint in float32 /
    float16 / int8 (its files; the int8 GGUF's size once written), a GGUF file as stored (its weight type)."""
    from webtensor.web.server import default_model_dir

    url, model, _ = served
    man = json.loads(_get(url + "model/manifest.json")[1])
    assert [m["id"] for m in man["models"]] == ["tiny-gpt2", "tiny-llama.Q4_1", "webtensor-shipped"]
    assert man["default"] == dict(model="tiny-gpt2", dtype="float32")
    gpt2, llama, shipped = man["models"]
    assert gpt2["format"] == "safetensors" and gpt2["dtypes"] == ["float32", "float16", "int8"]
    names = [f["name"] for f in gpt2["files"]["float32"]]
    assert set(names) == {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors",
                          "additional_chat_templates/terse.jinja"}
    assert all(f["size"] == (model / f["name"]).stat().st_size for f in gpt2["files"]["float32"])
    assert gpt2["files"]["float16"] == gpt2["files"]["float32"]
    assert gpt2["files"]["int8"] == [dict(name="model.q8_0.gguf", size=None, etag=None)]  # not written yet
    gguf_etag = _get(url + "model/tiny-llama.Q4_1/tiny-llama.Q4_1.gguf", method="HEAD")[3]["ETag"]
    assert llama == dict(id="tiny-llama.Q4_1", name="tiny-llama.Q4_1.gguf", format="gguf", stored="Q4_1",
                         dtypes=["Q4_1"], files={"Q4_1": [dict(name=llama_gguf.name, size=llama_gguf.stat().st_size,
                                                               etag=gguf_etag)]})
    assert shipped["name"] == "webtensor shipped GPT-2"
    assert {f["name"] for f in shipped["files"]["float32"]} == {
        p.name for p in default_model_dir().iterdir() if p.suffix in (".json", ".safetensors", ".txt")}
    status, body, _, _ = _get(url + "model/tiny-llama.Q4_1/tiny-llama.Q4_1.gguf")
    assert status == 200 and body == llama_gguf.read_bytes()
    assert _get(url + "model/tiny-gpt2/additional_chat_templates/terse.jinja")[1] == b"{{ messages[0]['content'] }}"


def test_server_serves_int8(served):
    """A float checkpoint's int8: the q8_0 GGUF the server writes once (matrices in Q8_0, ~a quarter of the
    float32 bytes), its size in the manifest after."""
    from webtensor.formats.gguf_pure import GGUFFile

    url, model, _ = served
    status, body, _, _ = _get(url + "model/webtensor-shipped/model.q8_0.gguf")
    assert status == 200
    f = GGUFFile.from_bytes(body)
    assert f.tensors["token_embd.weight"].type_name == "Q8_0" and f.tensors["position_embd.weight"].type_name == "F32"
    shipped = json.loads(_get(url + "model/manifest.json")[1])["models"][-1]
    assert shipped["files"]["int8"] == [dict(name="model.q8_0.gguf", size=len(body), etag=_get(
        url + "model/webtensor-shipped/model.q8_0.gguf", method="HEAD")[3]["ETag"])]
    f32 = next(f["size"] for f in shipped["files"]["float32"] if f["name"] == "model.safetensors")
    assert len(body) < 0.45 * f32
    assert _get(url + "model/webtensor-shipped/model.q8_0.gguf")[1] == body  # kept, not written again


def test_server_reaches_only_served_files(served):
    url, _, _ = served
    assert _get(url + "model/tiny-gpt2/config.json")[0] == 200
    for bad in ("model/tiny-gpt2/secret.txt", "model/tiny-gpt2/../tiny-gpt2/config.json", "model/tiny-gpt2/",
                "model/tiny-gpt2", "model/other/config.json", "model/tiny-llama.Q4_1/model.q8_0.gguf",
                "model/tiny-llama.Q4_1/config.json", "model/webtensor-shipped/README.md",
                "model/tiny-gpt2/%2e%2e/%2e%2e/etc/passwd", "model/..%2f..%2fetc/passwd", "model/config.json",
                "pyodide/../../etc/passwd", "pyodide/%2e%2e/x", "etc/passwd", "web/server.py"):
        status, body, _, _ = _get(url + bad)
        assert status == 404, bad
        assert b"not a model" not in body


def test_server_routes(served):
    url, _, _ = served
    status, body, ctype, _ = _get(url)
    assert status == 200 and b"webtensor" in body and ctype.startswith("text/html")
    for name in ("app.js", "gpu_helper.js", "pyodide/pyodide.js"):
        assert _get(url + name)[0] == 200, name
    assert _get(url + "pyodide/pyodide.asm.wasm")[2] == "application/wasm"


def test_server_validators_and_304(served, llama_gguf):
    """Every model file, the page's files, its zip and Pyodide's carry a strong ETag (files also Last-Modified);
    a request whose If-None-Match (else If-Modified-Since) matches gets 304 with no body, and no bytes are
    counted as sent; the manifest lists each model file's ETag; a changed file gets a new one."""
    from email.utils import formatdate, parsedate_to_datetime

    url, model, app = served
    paths = ["model/tiny-gpt2/model.safetensors", "model/tiny-gpt2/config.json",
             f"model/tiny-llama.Q4_1/{llama_gguf.name}", "model/webtensor-shipped/model.q8_0.gguf",
             "webtensor.zip", "app.js", "", "pyodide/pyodide.asm.wasm"]
    for path in paths:
        status, body, _, h = _get(url + path)
        etag, sent = h["ETag"], app.sent["/" + path]
        assert status == 200 and body and re.fullmatch(r'"[0-9a-f-]+"', etag), (path, h)  # strong: no W/
        assert h["Cache-Control"] == ("max-age=3600" if path.startswith("pyodide/") else "no-cache")
        assert sent == len(body)
        for same in (etag, f'"other", {etag}', f"W/{etag}", "*"):
            status, body, _, h304 = _get(url + path, If_None_Match=same)
            assert (status, body, h304["ETag"]) == (304, b"", etag), (path, same)
        assert _get(url + path, If_None_Match='"other"')[:2] == (200, _get(url + path)[1])
        if path.endswith(".zip") or path.endswith(".gguf") and "q8_0" in path:  # bytes made in memory
            assert "Last-Modified" not in h
        else:
            modified = h["Last-Modified"]
            assert _get(url + path, If_Modified_Since=modified)[:2] == (304, b"")
            before = formatdate(parsedate_to_datetime(modified).timestamp() - 10, usegmt=True)
            assert _get(url + path, If_Modified_Since=before)[0] == 200
            assert _get(url + path, If_Modified_Since="not a date")[0] == 200
            # If-None-Match decides alone when both are sent
            assert _get(url + path, If_None_Match='"other"', If_Modified_Since=modified)[0] == 200
    man = json.loads(_get(url + "model/manifest.json")[1])
    listed = {f"model/{m['id']}/{f['name']}": f["etag"] for m in man["models"] for fs in m["files"].values()
              for f in fs}
    for path in paths[:4]:
        assert listed[path] == _get(url + path, method="HEAD")[3]["ETag"], path
    old = _get(url + paths[1], method="HEAD")[3]["ETag"]
    cfg = model / "config.json"
    cfg.write_text(cfg.read_text() + " ")  # changed: a new ETag, and the old one no longer matches
    status, body, _, h = _get(url + paths[1], If_None_Match=old)
    assert status == 200 and body == cfg.read_bytes() and h["ETag"] != old


def test_server_survives_an_aborted_download(served, capfd):
    """A page that goes away mid-download (a reload) costs the server nothing: no traceback, the next request
    answered."""
    import socket
    import time

    url, _, app = served
    host, port = url.split("//")[1].rstrip("/").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /model/webtensor-shipped/model.safetensors HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, at once
    time.sleep(0.5)
    assert _get(url + "model/manifest.json")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_server_offers_the_cpu_device_where_pyodide_has_numpy(tmp_path, llama_gguf):
    """The manifest's `cpu`: the served Pyodide lists numpy (pyodide-lock.json) and holds its wheel and its
    dependencies' (Pyodide's full release), so the page can load numpy offline; npm's core-only package does not."""
    from webtensor.web.server import WebApp, find_pyodide, pyodide_numpy

    npm = find_pyodide()
    assert "numpy" in json.loads((npm / "pyodide-lock.json").read_text())["packages"]  # listed, not held
    assert pyodide_numpy(npm) is None and WebApp([], npm).manifest()["cpu"] is False
    full = _pyodide_stand_in(tmp_path)
    lock = dict(info={}, packages=dict(
        numpy=dict(name="numpy", file_name="numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl", depends=["libx"]),
        libx=dict(name="libx", file_name="libx-1.0.zip", depends=[])))
    (full / "pyodide-lock.json").write_text(json.dumps(lock))
    (full / lock["packages"]["numpy"]["file_name"]).write_bytes(b"PK")
    assert pyodide_numpy(full) is None  # a dependency's file is missing
    (full / "libx-1.0.zip").write_bytes(b"PK")
    assert pyodide_numpy(full) == "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"
    assert WebApp([llama_gguf], full).manifest()["cpu"] is True
    (full / "pyodide-lock.json").write_text("not json")
    assert pyodide_numpy(full) is None


def test_page_runs_a_model_on_the_cpu_device(page_model):
    """app.load_model(..., device="cpu"): the model on webtensor's CPU device (what the page uses where its Pyodide
    has numpy), the tokens of the same calls on WebGPU; another device name is refused."""
    import asyncio

    from webtensor.web import app

    d, model = page_model
    app._state.update(device=model.device)
    try:
        facts = json.loads(asyncio.run(app.load_model(str(d), None, "float32", "cpu")))
        assert facts["device"] == "cpu" and app._state["model"].device.kind == "cpu"
        res = json.loads(asyncio.run(app.generate("Once upon a time", "6", "0.8", "7", None, "40", "0.9")))
        ids = model.encode("Once upon a time")
        assert res["adapter"] == "CPU (numpy)"
        assert res["token_ids"] == model.generate(ids, 6, temperature=0.8, top_k=40, top_p=0.9, seed=7)
        with pytest.raises(ValueError, match="runs a model on webgpu or cpu, not 'tpu'"):
            asyncio.run(app.load_model(str(d), None, "float32", "tpu"))
    finally:
        app._state.update(device=None, model=None, dtype=None)


def test_page_zip_carries_jinja2_and_markupsafe():
    """webtensor's sources plus jinja2's and markupsafe's .py files and BSD licenses; markupsafe's C speedups,
    the shipped model and caches left out."""
    from webtensor.web.server import package_zip

    z = zipfile.ZipFile(BytesIO(package_zip()))
    names = set(z.namelist())
    assert {"webtensor/__init__.py", "webtensor/backends/wgpu/kernels/matmul.wgsl", "webtensor/chat.py",
            "webtensor/backends/wgpu/gpu_helper.js", "jinja2/__init__.py", "jinja2/sandbox.py",
            "markupsafe/__init__.py", "markupsafe/_native.py"} <= names
    assert not any("/shipped/" in n or "__pycache__" in n or "_speedups" in n for n in names)
    assert {n.split("/")[0] for n in names} == {"webtensor", "jinja2", "markupsafe"}
    for pkg in ("jinja2", "markupsafe"):
        text = z.read(f"{pkg}/LICENSE.txt").decode()
        assert "Redistribution and use in source and binary forms" in text and "Pallets" in text


def test_served_model_forms(tmp_path, monkeypatch, llama_gguf):
    """`--model` takes a checkpoint directory, a .gguf file, a directory holding one, or an id in the local
    Hugging Face cache; ids are unique and the same checkpoint twice is served once."""
    import shutil

    from webtensor.web.server import WebApp, default_model_dir, served_model

    cache = tmp_path / "hub"
    snap = cache / "models--someone--tiny-chat" / "snapshots" / "0123abcd"
    shutil.copytree(default_model_dir(), snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    by_id = served_model("someone/tiny-chat")
    assert (by_id.id, by_id.name, by_id.path, by_id.gguf) == ("someone--tiny-chat", "someone/tiny-chat",
                                                              snap.resolve(), False)
    one = tmp_path / "one-gguf"
    one.mkdir()
    shutil.copy(llama_gguf, one / "m.gguf")
    assert served_model(one).files == {"m.gguf": (one / "m.gguf").resolve()}
    app = WebApp(["someone/tiny-chat", llama_gguf, str(llama_gguf), one, None], _pyodide_stand_in(tmp_path))
    assert list(app.models) == ["someone--tiny-chat", "tiny-llama.Q4_1", "m", "webtensor-shipped"]
    with pytest.raises(wt.CheckpointError, match="not in the local Hugging Face cache"):
        served_model("someone/absent")
    with pytest.raises(wt.UsageError, match="dtype"):
        WebApp([], app.pyodide_dir, dtype="int4")


def test_server_int8_of_a_bad_checkpoint_says_why(tmp_path):
    from gpt2_fixtures import make_checkpoint

    from webtensor.web.server import SetupError, WebApp

    d = make_checkpoint(tmp_path / "m", vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:2000])
    app = WebApp([d], _pyodide_stand_in(tmp_path))
    assert app.manifest()["models"][0]["files"]["float32"]  # the float page still gets its files (and says why)
    for _ in range(2):  # written once: the error is kept
        with pytest.raises(SetupError, match="int8 \\(q8_0\\) weights of m could not be written"):
            app.model_file("m", "model.q8_0.gguf")
    assert app.model_file("m", "config.json") == d / "config.json"
    with pytest.raises(SetupError, match="m has no file 'secret.txt'"):
        app.model_file("m", "secret.txt")


def test_server_needs_pyodide(tmp_path, monkeypatch):
    from webtensor.web import server as web_server

    monkeypatch.delenv("WEBTENSOR_PYODIDE_DIR", raising=False)
    monkeypatch.setattr(web_server, "PACKAGE_DIR", tmp_path / "nowhere" / "src" / "webtensor")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(web_server.SetupError, match="setup.sh --web"):
        web_server.find_pyodide()


# -- the command line ---------------------------------------------------------------------------------------
def test_cli_has_web_command(capsys):
    from webtensor.cli import main

    with pytest.raises(SystemExit) as e:
        main(["web", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--no-open" in out and "127.0.0.1" in out and ".gguf" in out


def test_cli_web_serves_the_models_given(tmp_path, llama_gguf):
    """`webtensor web --model FILE.gguf --model DIR`: the page's manifest lists both, then the shipped model."""
    import os
    import signal
    import subprocess

    from gpt2_fixtures import make_checkpoint

    d = make_checkpoint(tmp_path / "tiny-gpt2", vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    env = {**os.environ, "PYTHONPATH": str(Path(wt.__file__).resolve().parents[1])}
    p = subprocess.Popen([sys.executable, "-m", "webtensor", "web", "--no-open", "--port", "0", "--model",
                          str(llama_gguf), "-m", str(d), "--pyodide", str(_pyodide_stand_in(tmp_path))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = p.stdout.readline()
        assert first.startswith("webtensor web: serving http://127.0.0.1:"), first + p.stderr.read()
        url = first.split()[3]
        man = json.loads(_get(url + "model/manifest.json")[1])
        assert [m["id"] for m in man["models"]] == ["tiny-llama.Q4_1", "tiny-gpt2", "webtensor-shipped"]
        assert man["default"] == dict(model="tiny-llama.Q4_1", dtype="Q4_1")
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)  # (a loaded 2-core machine: the exit after SIGINT has taken > 30 s once)
    assert p.returncode == 130


def test_cli_web_refuses_bad_models(tmp_path, capsys, llama_gguf):
    """Each bad --model is one line and exit 1, before anything is served."""
    from webtensor.cli import main

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(llama_gguf.read_bytes()[:5000])
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [(str(cut), r"cut\.gguf"), (str(empty), "empty is not a checkpoint directory \\(no config.json\\)"),
             ("/nonexistent/ckpt", "checkpoint directory /nonexistent/ckpt does not exist"),
             ("nobody/nothing", "model 'nobody/nothing' is not in the local Hugging Face cache")]
    for model, pattern in cases:
        capsys.readouterr()
        assert main(["web", "--no-open", "--port", "0", "-m", str(llama_gguf), "--model", model]) == 1, model
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("webtensor: error: "), err
        assert re.search(pattern, err), err
