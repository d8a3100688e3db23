"""Fuzzing the checkpoint and tokenizer loaders: mutated bytes of a valid model.safetensors,
config.json, tokenizer.json, vocab.json and merges.txt (and JSON-aware mutations of the JSON
files). Every failure must be a webtensor error (CheckpointError, TokenizerError, ... all
WebtensorError), never another exception, a crash or a hang.

Bounded for the test suite (about 180 examples in all, derandomized so CI is reproducible). For a
longer random campaign: WT_FUZZ_EXAMPLES=5000 WT_FUZZ_RANDOM=1 pytest tests/reliability/test_fuzz_loaders.py
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_helpers import tiny_checkpoint, watchdog

import webtensor as wt
from webtensor.models.gpt2 import GPT2, GPT2Tokenizer

SCALE = int(os.environ.get("WT_FUZZ_EXAMPLES", "0")) or None
RANDOM = os.environ.get("WT_FUZZ_RANDOM", "") == "1"


def fuzz_settings(n):
    return settings(max_examples=SCALE or n, deadline=None, derandomize=not RANDOM, database=None,
                    suppress_health_check=list(HealthCheck))


TEXT = "Hello wörld! It's 3.14 — naïve café 😀👍🏽 \n\t <|endoftext|> the end"


def _must_be_webtensor_error(fn):
    """Run fn; a WebtensorError is a pass, anything else escaping (or a crash) is a failure."""
    try:
        fn()
    except wt.WebtensorError:
        pass
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: B036 - Rust panics (pyo3 PanicException) derive from BaseException
        raise AssertionError(f"{type(e).__module__}.{type(e).__name__} escaped the loader: {e}") from e


def _use_model(d):
    """Load on the CPU and exercise what a loaded model offers: tokenizer and a forward pass."""
    m = GPT2.from_pretrained(d, device="cpu")
    ids = m.encode(TEXT)
    m.decode(ids)
    m.decode(range(min(m.tokenizer.vocab_size, 400)))
    m.logits((ids or [1])[:8])
    m.generate((ids or [1])[:4], 2)


def _use_tokenizer(d):
    tok = GPT2Tokenizer.from_dir(d)
    ids = tok.encode(TEXT)
    assert isinstance(tok.decode(ids), str)
    "".join(tok.stream_decode(ids))
    for i in range(min(tok.vocab_size, 400)):
        tok.token_bytes(i)


# -- the files to mutate ---------------------------------------------------------------------------


@functools.cache
def _originals() -> dict[str, bytes]:
    """Pristine bytes: the tiny checkpoint's files, plus its tokenizer as vocab.json + merges.txt."""
    import tokenizers

    src = tiny_checkpoint()
    files = {n: (src / n).read_bytes() for n in ("config.json", "model.safetensors", "tokenizer.json")}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizers.Tokenizer.from_file(str(src / "tokenizer.json")).model.save(tmp)
        for n in ("vocab.json", "merges.txt"):
            files[n] = (Path(tmp) / n).read_bytes()
    return files


@functools.cache
def _workdir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="wt-fuzz-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _write(d, files):
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for n, b in files.items():
        (d / n).write_bytes(b)
    return d


# -- byte-level mutations --------------------------------------------------------------------------

mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("set"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 16)),
    st.tuples(st.just("duplicate"), st.floats(0, 1), st.integers(1, 32)),
    st.tuples(st.just("digits"), st.floats(0, 1),
              st.sampled_from([b"9", b"99999999999", b"-1", b"0", b"1e999", b"."])),
)


def _mutate(data: bytes, muts, region: int | None = None) -> bytes:
    """Apply mutations at fractional positions of data[:region] (the whole file by default)."""
    b = bytearray(data)
    for m in muts:
        end = max(1, min(len(b), region or len(b)))
        pos = min(int(m[1] * end), max(0, len(b) - 1))
        if m[0] == "flip" and b:
            b[pos] ^= 1 << m[2]
        elif m[0] == "set" and b:
            b[pos] = m[2]
        elif m[0] == "truncate":
            del b[pos:]
        elif m[0] == "insert":
            b[pos:pos] = m[2]
        elif m[0] == "delete":
            del b[pos:pos + m[2]]
        elif m[0] == "duplicate":
            b[pos:pos] = b[pos:pos + m[2]]
        elif m[0] == "digits":  # replace the next run of digits (a number in a header / JSON) by m[2]
            i = pos
            while i < len(b) and not chr(b[i]).isdigit():
                i += 1
            j = i
            while j < len(b) and chr(b[j]).isdigit():
                j += 1
            if i < len(b):
                b[i:j] = m[2]
    return bytes(b)


@fuzz_settings(60)
@given(muts=st.lists(mutation, min_size=1, max_size=4), in_header=st.booleans())
def test_fuzz_safetensors(muts, in_header):
    data = _originals()["model.safetensors"]
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    mutated = _mutate(data, muts, header_end if in_header else None)
    files = dict(_originals(), **{"model.safetensors": mutated})
    files.pop("vocab.json"), files.pop("merges.txt")
    d = _write(_workdir() / "fuzz-st", files)
    with watchdog(60):
        _must_be_webtensor_error(lambda: _use_model(d))


@fuzz_settings(30)
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_config_bytes(muts):
    files = dict(_originals(), **{"config.json": _mutate(_originals()["config.json"], muts)})
    files.pop("vocab.json"), files.pop("merges.txt")
    d = _write(_workdir() / "fuzz-cfg", files)
    with watchdog(60):
        _must_be_webtensor_error(lambda: _use_model(d))


WEIRD = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 7, 1.5, -0.0, 1e-300, 1e308, 10**18, 10**40, "", "12",
                     "gpt2", [], [1, 2], {}, {"a": 1}]),
    st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
CONFIG_KEYS = ["vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "layer_norm_epsilon",
               "eos_token_id", "bos_token_id", "model_type", "activation_function", "n_inner"]


@fuzz_settings(30)
@given(edits=st.lists(st.tuples(st.sampled_from(CONFIG_KEYS), st.one_of(st.just("<delete>"), WEIRD)),
                      min_size=1, max_size=3))
@example(edits=[("activation_function", [])])  # (the thorough profile found it: a TypeError, not a CheckpointError)
def test_fuzz_config_values(edits):
    cfg = json.loads(_originals()["config.json"])
    for k, v in edits:
        if v == "<delete>":
            cfg.pop(k, None)
        else:
            cfg[k] = v
    files = dict(_originals(), **{"config.json": json.dumps(cfg).encode()})  # NaN / Infinity are JSON here
    files.pop("vocab.json"), files.pop("merges.txt")
    d = _write(_workdir() / "fuzz-cfgv", files)
    with watchdog(60):
        _must_be_webtensor_error(lambda: _use_model(d))


def _json_edit(doc, path, value):
    """Set doc[path...] = value where the path exists (lists indexed modulo their length)."""
    node = doc
    for key in path[:-1]:
        if isinstance(node, dict) and node:
            node = node[key if key in node else sorted(node)[hash(key) % len(node)]]
        elif isinstance(node, list) and node:
            node = node[key % len(node) if isinstance(key, int) else 0]
        else:
            return doc
    last = path[-1]
    if isinstance(node, dict):
        node[last if last in node or not node else sorted(node)[hash(last) % len(node)]] = value
    elif isinstance(node, list) and node:
        node[last % len(node) if isinstance(last, int) else 0] = value
    return doc


TOKENIZER_PATHS = st.sampled_from([
    ("model", "type"), ("model", "vocab", "Ġt"), ("model", "vocab", "a"), ("model", "vocab", "<|endoftext|>"),
    ("model", "merges", 0), ("model", "merges", 5, 1), ("model", "merges", 7, 0), ("model", "unk_token"),
    ("model", "byte_fallback"), ("model", "dropout"), ("added_tokens", 0, "id"),
    ("added_tokens", 0, "content"),
    ("added_tokens", 0, "special"), ("pre_tokenizer", "type"), ("pre_tokenizer", "use_regex"),
    ("decoder", "type"), ("normalizer",), ("post_processor",), ("model",), ("added_tokens",), ("version",),
])


@fuzz_settings(30)
@given(muts=st.lists(mutation, min_size=1, max_size=3),
       edits=st.lists(st.tuples(TOKENIZER_PATHS, WEIRD), max_size=2), json_first=st.booleans())
def test_fuzz_tokenizer_json(muts, edits, json_first):
    raw = _originals()["tokenizer.json"]
    if json_first and edits:
        doc = json.loads(raw)
        for path, value in edits:
            doc = _json_edit(doc, list(path), value)
        raw = json.dumps(doc).encode()
    else:
        raw = _mutate(raw, muts)
    d = _write(_workdir() / "fuzz-tj", {"tokenizer.json": raw})
    with watchdog(60):
        _must_be_webtensor_error(lambda: _use_tokenizer(d))


@fuzz_settings(30)
@given(which=st.sampled_from(["vocab.json", "merges.txt"]), muts=st.lists(mutation, min_size=1, max_size=4),
       vocab_edit=st.one_of(st.none(), st.tuples(st.sampled_from(["Ġt", "a", "<|endoftext|>", "zz"]), WEIRD)))
def test_fuzz_vocab_and_merges(which, muts, vocab_edit):
    files = {"vocab.json": _originals()["vocab.json"], "merges.txt": _originals()["merges.txt"]}
    if which == "vocab.json" and vocab_edit is not None:
        vocab = json.loads(files["vocab.json"])
        vocab[vocab_edit[0]] = vocab_edit[1]
        files["vocab.json"] = json.dumps(vocab).encode()
    else:
        files[which] = _mutate(files[which], muts)
    d = _write(_workdir() / "fuzz-vm", files)
    with watchdog(60):
        _must_be_webtensor_error(lambda: _use_tokenizer(d))


def test_fuzz_baseline_loads(tmp_path):
    """The unmutated files load and work (so the fuzz targets above do reach past the parsers)."""
    files = dict(_originals())
    vm = {"vocab.json": files.pop("vocab.json"), "merges.txt": files.pop("merges.txt")}
    _use_model(_write(tmp_path / "ck", files))
    _use_tokenizer(_write(tmp_path / "vm", vm))
