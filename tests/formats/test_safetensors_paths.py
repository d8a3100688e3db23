"""The two safetensors paths agree: the `safetensors` library (native) and webtensor's pure-Python
reader (`formats/safetensors_pure.py`, where the library is missing: the browser).

On random files written by the library's own writer, the pure reader gives the library's names,
metadata, dtypes, shapes and values (bit for bit, and bit for bit after conversion to float32);
`SafetensorsReader` gives the same arrays with the library hidden; the shipped model loads with the
library hidden and computes the same logits; malformed files raise the same CheckpointError (the
same message) on both paths, and a mutated file is accepted or refused alike by both."""

from __future__ import annotations

import json
import re
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.formats.safetensors_pure import FLOAT_DTYPES, SafetensorsFile
from webtensor.formats.safetensors_reader import SHIPPED, SafetensorsReader

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save as numpy_save  # noqa: E402

try:
    import torch
except ImportError:  # BF16 needs torch to be written and read by the library
    torch = None

DTYPES = [d for d in FLOAT_DTYPES if d != "BF16" or torch is not None]
_NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def _paths(monkeypatch):
    """run(fn) -> {"library": fn(), "pure": fn()}: fn called with the library importable, then with
    it hidden (`import safetensors` fails, as in the browser)."""
    def run(fn):
        out = {"library": fn()}
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "safetensors", None)
            with pytest.raises(ImportError):
                import safetensors  # noqa: F401
            out["pure"] = fn()
        return out
    return run


# --- random files written by the library ---------------------------------------------------------

def _bits(draw, dtype: str, n: int) -> np.ndarray:
    """n random bit patterns of `dtype` (any value: NaN payloads, infinities, subnormals, -0)."""
    width = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}[dtype]
    raw = draw(st.binary(min_size=n * width, max_size=n * width))
    return np.frombuffer(raw, {2: "<u2", 4: "<u4", 8: "<u8"}[width]).copy()


@st.composite
def st_files(draw) -> tuple[dict[str, tuple[str, tuple[int, ...], np.ndarray]], dict[str, str] | None]:
    names = draw(st.lists(st.text("abcxyz._0123", min_size=1, max_size=10).filter(lambda s: s != "__metadata__"),
                          min_size=1, max_size=5, unique=True))
    tensors = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        tensors[name] = (dtype, shape, _bits(draw, dtype, int(np.prod(shape))))
    metadata = draw(st.none() | st.dictionaries(st.text(max_size=6), st.text(max_size=12), max_size=3))
    return tensors, metadata


def _write(path: Path, tensors, metadata) -> None:
    if torch is None:
        from safetensors.numpy import save_file

        save_file({k: b.view(_NP[d]).reshape(s) for k, (d, s, b) in tensors.items()}, str(path), metadata=metadata)
        return
    from safetensors.torch import save_file

    types = {"F32": (np.int32, torch.float32), "F16": (np.int16, torch.float16), "BF16": (np.int16, torch.bfloat16),
             "F64": (np.int64, torch.float64)}
    save_file({k: torch.from_numpy(b.view(types[d][0])).view(types[d][1]).reshape(s)
               for k, (d, s, b) in tensors.items()}, str(path), metadata=metadata)


def _library_values(path: Path) -> dict[str, np.ndarray]:
    """What the library reads: numpy arrays; BF16 (numpy has none) through torch, as float32."""
    out = {}
    with safe_open(str(path), framework="numpy") as f:
        for k in f.keys():
            if f.get_slice(k).get_dtype() != "BF16":
                out[k] = f.get_tensor(k)
    if len(out) < len(SafetensorsFile.from_path(path)):
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                if k not in out:
                    out[k] = f.get_tensor(k).float().numpy()
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st_files())
def test_pure_reader_reads_what_the_library_reads(monkeypatch, file) -> None:
    tensors, metadata = file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        _write(path, tensors, metadata)
        blob = path.read_bytes()
        want = _library_values(path)
        raw = dict(safetensors.deserialize(blob))
        with safe_open(str(path), framework="numpy") as lib:
            lib_keys, lib_meta = list(lib.keys()), lib.metadata()
            lib_info = {k: (lib.get_slice(k).get_dtype(), tuple(lib.get_slice(k).get_shape())) for k in lib_keys}
        for f in (SafetensorsFile.from_path(path), SafetensorsFile.from_bytes(blob)):
            with f:
                assert f.keys() == lib_keys == sorted(tensors)
                assert f.metadata == (lib_meta or {}) == (metadata or {})
                for k, (dtype, shape, bits) in tensors.items():
                    info = f.info(k)
                    assert (info.dtype, info.shape) == lib_info[k] == (dtype, shape)
                    assert bytes(f.raw(k)) == bytes(raw[k]["data"]) == bits.tobytes()
                    got = f.array(k)
                    assert _same_bits(got, want[k]), (k, dtype, got, want[k])
                    with np.errstate(over="ignore"):
                        as_f32 = want[k].astype(np.float32)
                    f32 = f.float32(k)
                    assert isinstance(f32, memoryview) and f32.nbytes == 4 * int(np.prod(shape))
                    assert bytes(f32) == as_f32.tobytes(), (k, dtype)
        # SafetensorsReader: the library, and with it hidden the pure reader, give the same arrays
        def read_all():
            r = SafetensorsReader([path])
            return {n: r.get(n) for n in r.names()}

        read = _paths(monkeypatch)(read_all)
        assert read["library"].keys() == read["pure"].keys() == {k.removeprefix("transformer.") for k in tensors}
        for n, a in read["library"].items():
            assert _same_bits(a, read["pure"][n]), n


def test_half_conversion_is_exact_for_every_half() -> None:
    """All 65536 F16 bit patterns (NaN payloads, subnormals, -0) convert as numpy converts them."""
    halves = np.arange(1 << 16, dtype="<u2")
    blob = numpy_save({"h": halves.view(np.float16)})
    f = SafetensorsFile.from_bytes(blob)
    assert bytes(f.float32("h")) == halves.view(np.float16).astype(np.float32).tobytes()


# --- the shipped model --------------------------------------------------------------------------

def test_shipped_model_loads_without_the_library(monkeypatch) -> None:
    """The 'dtype object' bug: with `safetensors` missing the shipped model must still load, to
    the same weights and logits."""
    from webtensor.models.gpt2 import GPT2

    def logits():
        m = GPT2.from_pretrained(None, device="cpu")
        ids = m.tokenizer.encode("It was a truth universally acknowledged")
        return m.logits(ids), m.wte.numpy()

    out = _paths(monkeypatch)(logits)
    assert _same_bits(out["library"][0], out["pure"][0])
    assert _same_bits(out["library"][1], out["pure"][1])
    with SafetensorsFile.from_path(SHIPPED / "model.safetensors") as f, \
            safe_open(str(SHIPPED / "model.safetensors"), framework="numpy") as lib:
        assert f.keys() == list(lib.keys()) and f.metadata == lib.metadata()
        for k in f.keys():
            assert _same_bits(f.array(k), lib.get_tensor(k)), k


def test_shipped_model_loads_without_numpy_reader(monkeypatch) -> None:
    """The browser's loader (numpy-free float32 bytes) reads the same weights as the library."""
    with SafetensorsFile.from_path(SHIPPED / "model.safetensors") as f, \
            safe_open(str(SHIPPED / "model.safetensors"), framework="numpy") as lib:
        for k in f.keys():
            assert bytes(f.float32(k)) == lib.get_tensor(k).astype(np.float32).tobytes(), k


# --- malformed files: the same CheckpointError on both paths -------------------------------------

def _file(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _t(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


_GOOD = {"a": _t("F32", [2], 0, 8), "b": _t("F16", [2, 2], 8, 16)}
MALFORMED = {
    "empty": (b"", r"file is only 0 bytes, too short for the 8-byte header length"),
    "short": (b"\x08\0\0", r"file is only 3 bytes"),
    "header-length-past-end": (_file(_GOOD, bytes(16), length=4096),
                               r"header length 4096 is larger than the file: only \d+ bytes follow"),
    "header-length-huge": (struct.pack("<Q", 2**40) + b"{}", r"header length 1099511627776 exceeds the"),
    "not-json": (struct.pack("<Q", 5) + b"{'a':", r"header is not valid JSON"),
    "not-utf8": (struct.pack("<Q", 3) + b'{"\xff', r"header is not valid UTF-8"),
    "truncated": (_file(_GOOD, bytes(12)),
                  r"tensor 'b': data_offsets \[8, 16\] reach past the end of the data section \(12 bytes\): "
                  r"the file is truncated"),
    "overlap": (_file({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 4, 12)}, bytes(12)),
                r"tensor 'b': data_offsets \[4, 12\] overlap tensor 'a' which ends at 8"),
    "gap": (_file({"a": _t("F32", [1], 0, 4), "b": _t("F32", [1], 8, 12)}, bytes(12)),
            r"tensor 'b': data_offsets \[8, 12\] leave a gap of 4 bytes after tensor 'a'"),
    "wrong-size": (_file({"a": _t("F32", [3], 0, 8)}, bytes(8)),
                   r"tensor 'a': data_offsets \[0, 8\] span 8 bytes but shape \[3\] of F32 needs 12 bytes"),
    "unknown-dtype": (_file({"a": _t("F31", [2], 0, 8)}, bytes(8)), r"tensor 'a': unknown dtype 'F31'"),
    "trailing-bytes": (_file(_GOOD, bytes(20)), r"4 unexpected bytes after the last tensor 'b'"),
    "negative-dim": (_file({"a": _t("F32", [-1], 0, 4)}, bytes(4)), r"tensor 'a': shape must be a list of non-neg"),
    "metadata-not-string": (_file({"__metadata__": {"k": 3}, **_GOOD}, bytes(16)),
                            r"__metadata__\['k'\] must be a string, got int"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_give_the_same_error_on_both_paths(case, tmp_path, monkeypatch) -> None:
    blob, message = MALFORMED[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(blob)
    with pytest.raises(Exception):  # noqa: B017 - the library refuses it too
        safetensors.deserialize(blob)

    def error():
        with pytest.raises(wt.CheckpointError) as e:
            SafetensorsReader([path])
        return str(e.value)

    got = _paths(monkeypatch)(error)
    assert got["library"] == got["pure"]
    assert got["pure"].startswith(f"{path} is not a valid safetensors file: ")
    assert re.search(message, got["pure"]), got["pure"]


@pytest.mark.parametrize("dtype", ["I64", "I32", "U8", "BOOL", "F8_E4M3"])
def test_non_float_tensor_is_refused_naming_it(dtype, tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.safetensors"
    n = {"I64": 8, "I32": 4}.get(dtype, 1)
    path.write_bytes(_file({"wte.weight": _t("F32", [1], 0, 4), "wpe.weight": _t(dtype, [2], 4, 4 + 2 * n)},
                           bytes(4 + 2 * n)))

    def error():
        r = SafetensorsReader([path])
        assert r.get("wte.weight").dtype == np.float32 and r.dtype("wpe.weight") == dtype
        with pytest.raises(wt.CheckpointError) as e:
            r.get("wpe.weight")
        return str(e.value)

    got = _paths(monkeypatch)(error)
    assert got["library"] == got["pure"] == (f"{path}: tensor 'wpe.weight' has dtype {dtype}; webtensor reads "
                                             "weights stored as F32, F16, BF16 or F64")
    with SafetensorsFile.from_path(path) as f, pytest.raises(wt.CheckpointError, match=dtype):
        f.float32("wpe.weight")


_VALID = _file({"__metadata__": {"format": "pt"}, "x": _t("F32", [2, 1], 0, 8), "y": _t("BF16", [3], 8, 14),
                "z": _t("F16", [], 14, 16)}, bytes(range(16)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.integers(0, len(_VALID) - 1).map(lambda n: _VALID[:n]),  # truncated anywhere
    st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=3)
    .map(lambda edits: bytes(b if i not in dict(edits) else dict(edits)[i] for i, b in enumerate(_VALID))),
))
def test_mutated_files_are_judged_alike(monkeypatch, blob) -> None:
    """A truncated or byte-edited file: the library and the pure reader both accept it (with the
    same tensors) or both refuse it with the same CheckpointError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(blob)

        def judge():
            try:
                r = SafetensorsReader([path])
            except wt.CheckpointError as e:
                return "refused", str(e)
            return "read", {n: (r.dtype(n), r.shape(n)) for n in r.names()}

        got = _paths(monkeypatch)(judge)
        try:
            safetensors.deserialize(blob)
            lib = "read"
        except Exception:  # noqa: BLE001 - SafetensorError
            lib = "refused"
        assert got["library"] == got["pure"] and got["pure"][0] == lib, got


# --- inside Pyodide (the page's Python: no safetensors, no numpy) ----------------------------------

_PYODIDE_CODE = """
import hashlib, json, os, sys
sys.path.insert(0, "/src")
from webtensor.errors import CheckpointError
from webtensor.formats.safetensors_pure import SafetensorsFile
out = {}
for name in sorted(os.listdir("/cases")):
    if not name.endswith(".safetensors"):
        continue
    try:
        with SafetensorsFile.from_path("/cases/" + name) as f:
            out[name] = {k: hashlib.sha256(f.float32(k)).hexdigest() for k in f.keys()}
    except CheckpointError as e:
        out[name] = str(e).replace("/cases/", "")
assert "numpy" not in sys.modules and "safetensors" not in sys.modules
json.dump(out, open("/cases/out.json", "w"))
"""


def test_pure_reader_inside_pyodide(tmp_path) -> None:
    """In Pyodide, without numpy, the reader gives the float32 bytes the library gives natively
    (shipped model, and a file of F16 / BF16 / F64), and the same errors."""
    import hashlib
    import shutil

    from text_fixtures import run_in_pyodide

    cases = tmp_path / "cases"
    cases.mkdir()
    shutil.copy(SHIPPED / "model.safetensors", cases / "shipped.safetensors")
    rng = np.random.default_rng(3)
    mixed = {"f16": ("F16", (3, 5)), "bf16": ("BF16", (7,)), "f64": ("F64", (2, 2)), "scalar": ("F16", ()),
             "empty": ("BF16", (0, 3))}
    mixed = {k: (d, s, rng.integers(0, 2**16, int(np.prod(s)) * (4 if d == "F64" else 1), dtype="<u2")
                 .view({"F64": "<u8"}.get(d, "<u2"))) for k, (d, s) in mixed.items() if d in DTYPES}
    _write(cases / "mixed.safetensors", mixed, {"k": "v"})
    for case in ("truncated", "overlap", "unknown-dtype"):
        (cases / f"{case}.safetensors").write_bytes(MALFORMED[case][0])
    run_in_pyodide(_PYODIDE_CODE, {"/src": Path(__file__).resolve().parents[2] / "src", "/cases": cases}, tmp_path)
    out = json.loads((cases / "out.json").read_text(encoding="utf-8"))
    for name in ("shipped", "mixed"):
        path = cases / f"{name}.safetensors"
        with np.errstate(over="ignore"):  # F64 beyond float32's range: inf, on both sides
            want = {k: hashlib.sha256(v.astype(np.float32).tobytes()).hexdigest()
                    for k, v in _library_values(path).items()}
        assert out[f"{name}.safetensors"] == want, name
    for case in ("truncated", "overlap", "unknown-dtype"):
        path = cases / f"{case}.safetensors"
        with pytest.raises(wt.CheckpointError) as e:
            SafetensorsReader([path])
        assert out[f"{case}.safetensors"] == str(e.value).replace(f"{cases}/", ""), case


def test_library_without_slice_dtypes(monkeypatch) -> None:
    """A safetensors release whose slices lack get_dtype: the dtypes come from the pure reader."""
    real = safetensors.safe_open

    class Slice:
        def __init__(self, s):
            self.get_shape = s.get_shape

    class Handle:
        def __init__(self, *a, **kw):
            self.h = real(*a, **kw)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *exc):
            return self.h.__exit__(*exc)

        def keys(self):
            return self.h.keys()

        def get_slice(self, k):
            return Slice(self.h.get_slice(k))

        def get_tensor(self, k):
            return self.h.get_tensor(k)

    monkeypatch.setattr(safetensors, "safe_open", Handle)
    from webtensor.models.gpt2.names import canonical

    r = SafetensorsReader([SHIPPED / "model.safetensors"], canonical)
    assert {r.dtype(n) for n in r.names()} == {"F32"} and r.get("wte.weight").shape == r.shape("wte.weight")
