"""The pure-Python GGUF reader (for the browser) against the gguf package's GGUFReader, on random
files written by the gguf package's GGUFWriter: the same metadata (values and types), tensor
names, types, shapes and bytes; and only GGUFFormatError on truncated or corrupted bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webtensor import quant
from webtensor.formats.gguf_pure import GGUFFile, GGUFFormatError

gguf = pytest.importorskip("gguf")
VT = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType

_INT_RANGES = {VT.UINT8: (0, 2**8 - 1), VT.INT8: (-(2**7), 2**7 - 1), VT.UINT16: (0, 2**16 - 1),
               VT.INT16: (-(2**15), 2**15 - 1), VT.UINT32: (0, 2**32 - 1), VT.INT32: (-(2**31), 2**31 - 1),
               VT.UINT64: (0, 2**64 - 1), VT.INT64: (-(2**63), 2**63 - 1)}
_f32 = st.floats(allow_nan=False, width=32)
_f64 = st.floats(allow_nan=False)
_text = st.text(max_size=12)


def _scalar(vtype: VT) -> st.SearchStrategy:
    if vtype in _INT_RANGES:
        return st.integers(*_INT_RANGES[vtype])
    return {VT.FLOAT32: _f32, VT.FLOAT64: _f64, VT.BOOL: st.booleans(), VT.STRING: _text}[vtype]


@st.composite
def values(draw: st.DrawFn) -> tuple[VT, object, VT | None]:
    vtype = draw(st.sampled_from([*_INT_RANGES, VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING, VT.ARRAY]))
    if vtype != VT.ARRAY:
        return vtype, draw(_scalar(vtype)), None
    sub = draw(st.sampled_from([VT.UINT8, VT.INT32, VT.UINT64, VT.FLOAT32, VT.BOOL, VT.STRING]))
    return vtype, draw(st.lists(_scalar(sub), min_size=1, max_size=6)), sub


@st.composite
def tensors(draw: st.DrawFn) -> tuple[np.ndarray, Q | None]:
    kind = draw(st.sampled_from(["F32", "F16", "BF16", "I8", "I32", "Q8_0", "Q4_0", "Q4_1",
                                 *sorted(set(quant.TYPES) - set(quant.QUANTIZABLE))]))
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind in ("Q8_0", "Q4_0", "Q4_1", "BF16"):
        x = rng.standard_normal((*lead, 32 * draw(st.integers(1, 3)))).astype(np.float32)
        return gguf.quants.quantize(x, Q[kind]), Q[kind]
    if kind in quant.TYPES:  # random blocks (the gguf package does not quantize K-quants or IQ types)
        size = quant.TYPES[kind].nbytes
        return rng.integers(0, 256, (*lead, size * draw(st.integers(1, 2))), dtype=np.uint8), Q[kind]
    x = rng.standard_normal((*lead, draw(st.integers(1, 9)))) * 50
    return x.astype({"F32": np.float32, "F16": np.float16, "I8": np.int8, "I32": np.int32}[kind]), None


@st.composite
def gguf_files(draw: st.DrawFn) -> dict:
    keys = draw(st.lists(st.text("abcdefgh.", min_size=1, max_size=8), max_size=6, unique=True))
    return {
        "meta": {k: draw(values()) for k in keys},
        "tensors": draw(st.lists(tensors(), max_size=4)),
        "align": draw(st.sampled_from([None, 8, 64])),
    }


def _write(path: Path, spec: dict) -> None:
    w = gguf.GGUFWriter(str(path), "gpt2")
    if spec["align"]:
        w.add_custom_alignment(spec["align"])
    for k, (vtype, v, sub) in spec["meta"].items():
        w.add_key_value("x." + k, v, vtype, sub_type=sub)
    for i, (arr, qtype) in enumerate(spec["tensors"]):
        w.add_tensor(f"t{i}", arr, raw_shape=arr.shape if qtype else None, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _same(path: Path) -> GGUFFile:
    ref = gguf.GGUFReader(str(path))
    pure = GGUFFile.from_path(path)
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(pure.metadata) == list(fields)
    for k, f in fields.items():
        assert pure.metadata[k] == f.contents(), k
        assert pure.value_types[k] == tuple(int(t) for t in f.types), k
    assert list(pure.tensors) == [t.name for t in ref.tensors]
    assert pure.data_offset == ref.data_offset and pure.alignment == ref.alignment
    for t in ref.tensors:
        p = pure.tensors[t.name]
        assert p.type_name == t.tensor_type.name
        assert p.shape == tuple(int(s) for s in reversed(t.shape.tolist()))
        assert p.n_elements == t.n_elements and p.nbytes == t.n_bytes
        assert bytes(pure.raw(t.name)) == t.data.tobytes()
    return pure


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gguf_files())
def test_pure_reader_equals_gguf_package(tmp_path: Path, spec: dict) -> None:
    path = tmp_path / "f.gguf"
    _write(path, spec)
    pure = _same(path)
    assert GGUFFile.from_bytes(path.read_bytes()).metadata == pure.metadata
    pure.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gguf_files(), st.data())
def test_damaged_bytes_raise_only_format_errors(tmp_path: Path, spec: dict, data: st.DataObject) -> None:
    path = tmp_path / "f.gguf"
    _write(path, spec)
    raw = bytearray(path.read_bytes())
    f = GGUFFile.from_bytes(bytes(raw))
    needed = max([f.header_size, *(t.offset + t.nbytes for t in f.tensors.values())])  # then padding only
    cut = data.draw(st.integers(0, needed - 1))
    with pytest.raises(GGUFFormatError):
        GGUFFile.from_bytes(bytes(raw[:cut]))
    # a flipped byte may still parse (a value changed) but must never escape as another exception
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    try:
        GGUFFile.from_bytes(bytes(raw))
    except GGUFFormatError:
        pass


def test_float32_of_f32_and_bf16_tensors(tmp_path: Path) -> None:
    """GGUFFile.float32: F32 as stored, BF16 widened exactly (without numpy), other types refused."""
    from webtensor.formats.gguf_pure import bf16_to_f32

    x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32) * 100
    x[0, :3] = [np.inf, -0.0, 1e-40]
    q8 = gguf.quants.quantize(np.ones((3, 32), np.float32), Q.Q8_0)
    spec = {"meta": {}, "align": None, "tensors": [(x, None), (gguf.quants.quantize(x, Q.BF16), Q.BF16), (q8, Q.Q8_0)]}
    path = tmp_path / "f.gguf"
    _write(path, spec)
    f = _same(path)
    assert f.float32("t0") == x.tobytes()
    want = gguf.quants.dequantize(gguf.quants.quantize(x, Q.BF16), Q.BF16)
    assert bytes(f.float32("t1")) == want.astype("<f4").tobytes()
    with pytest.raises(GGUFFormatError, match="'t2' is Q8_0, not F32 or BF16"):
        f.float32("t2")
    with pytest.raises(GGUFFormatError, match="3 bytes are not a whole number of bfloat16 values"):
        bf16_to_f32(b"abc")


def test_a_bad_string_in_an_array_is_named_by_its_index(tmp_path: Path) -> None:
    """String arrays (a vocabulary: 128k tokens, 280k merges) are read in one loop; an item that is not UTF-8, or
    cut short, is still named `key[i]` with its byte, as a string read alone is."""
    path = tmp_path / "f.gguf"
    _write(path, {"align": None, "meta": {"words": (VT.ARRAY, ["ab", "cd", "efgh"], VT.STRING)}, "tensors": []})
    raw = path.read_bytes()
    assert GGUFFile.from_bytes(raw).metadata["x.words"] == ["ab", "cd", "efgh"]
    with pytest.raises(GGUFFormatError, match=r"value of 'x\.words'\[1\] at byte \d+ is not valid UTF-8"):
        GGUFFile.from_bytes(raw.replace(b"cd", b"\xff\xfe"))
    cut = raw.index(b"efgh") + 2
    with pytest.raises(GGUFFormatError, match=r"truncated: value of 'x\.words'\[2\] at byte \d+ needs 4 bytes, "
                                              r"2 remain"):
        GGUFFile.from_bytes(raw[:cut])
    with pytest.raises(GGUFFormatError, match=r"truncated: value of 'x\.words'\[2\] length"):
        GGUFFile.from_bytes(raw[:raw.index(b"efgh") - 3])
