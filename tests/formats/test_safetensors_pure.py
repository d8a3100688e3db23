"""The pure-Python safetensors reader (`formats/safetensors_pure.py`) against the reference
``safetensors`` library: bytes, metadata and dtypes of files the library writes, and every kind of
corruption refused (by both) with a SafetensorsFormatError naming the problem. How the two load
paths of `SafetensorsReader` agree is in test_safetensors_paths.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save, save_file  # noqa: E402

from webtensor.errors import CheckpointError  # noqa: E402
from webtensor.formats import safetensors_pure as stp  # noqa: E402

SafetensorsFile = stp.SafetensorsFile
SafetensorsFormatError = stp.SafetensorsFormatError
TensorInfo = stp.TensorInfo


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal((2, 3, 5)).astype(np.float16),
        "f64": rng.standard_normal(7),
        "i32": rng.integers(-(2**31), 2**31 - 1, size=(4, 1), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, size=(5,), dtype=np.int64),
        "u8": rng.integers(0, 255, size=(9,), dtype=np.uint8),
        "i8": rng.integers(-128, 127, size=(2, 2), dtype=np.int8),
        "u16": rng.integers(0, 65535, size=(3,), dtype=np.uint16),
        "bool": rng.integers(0, 2, size=(6,)).astype(bool),
        "scalar_f32": np.array(3.5, dtype=np.float32),
        "scalar_i64": np.array(-7, dtype=np.int64),
        "empty_f32": np.zeros((0,), dtype=np.float32),
        "empty_3d": np.zeros((2, 0, 3), dtype=np.float16),
        "transformer.h.0.attn.c_attn.weight": rng.standard_normal((8, 24)).astype(np.float32),
    }


def _header_file(header: dict, data: bytes = b"", *, length: int | None = None) -> bytes:
    raw = json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def _raw_header(text: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(text)) + text + data


def _t(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# --- reading real files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = _tensors()
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "héllo ✓"})
    return path, tensors


@pytest.mark.parametrize("source", ["path", "bytes", "bytearray", "memoryview"])
def test_reads_back_byte_identical(source: str, written: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tensors = written
    blob = path.read_bytes()
    if source == "path":
        f = SafetensorsFile.from_path(path)
    elif source == "bytes":
        f = SafetensorsFile.from_bytes(blob)
    elif source == "bytearray":
        f = SafetensorsFile.from_bytes(bytearray(blob))
    else:
        f = SafetensorsFile.from_bytes(memoryview(blob))
    reference = dict(safetensors.deserialize(blob))
    with f, safe_open(str(path), framework="np") as ref:
        assert f.keys() == list(ref.keys()) == sorted(tensors)
        assert f.metadata == ref.metadata() == {"format": "np", "note": "héllo ✓"}
        assert len(f) == len(tensors) and "f32" in f and "nope" not in f
        for name, arr in tensors.items():
            info = f.info(name)
            expected = ref.get_tensor(name)
            assert info == TensorInfo(reference[name]["dtype"], tuple(arr.shape), arr.nbytes)
            view = f.raw(name)
            assert isinstance(view, memoryview) and view.nbytes == info.nbytes
            assert bytes(view) == bytes(reference[name]["data"]) == expected.tobytes()
            assert bytes(view) == np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
            begin, end = f.file_range(name)
            assert blob[begin:end] == bytes(view)
        assert f.data_start == 8 + struct.unpack("<Q", blob[:8])[0]
    assert f.closed
    with pytest.raises(ValueError, match="closed"):
        f.raw("f32")


def test_raw_is_zero_copy() -> None:
    blob = bytearray(save({"x": np.arange(4, dtype=np.float32)}))
    f = SafetensorsFile.from_bytes(blob)
    view = f.raw("x")
    assert view.tolist()[:4] == list(blob[f.file_range("x")[0] :][:4])
    blob[f.file_range("x")[0]] ^= 0xFF  # mutate the source: the view sees it
    assert view[0] == blob[f.file_range("x")[0]]
    assert view.cast("f").tolist()[1:] == [1.0, 2.0, 3.0]


@pytest.mark.hf  # (torch writes the BF16 and F8 files)
def test_bf16_and_other_dtypes_via_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as torch_save_file

    tensors = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f16": torch.randn(4).half(),
        "i16": torch.arange(-3, 3, dtype=torch.int16),
        "bf16_scalar": torch.tensor(1.25, dtype=torch.bfloat16),
        "bf16_empty": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    if hasattr(torch, "float8_e4m3fn"):
        tensors["f8"] = torch.randn(6).to(torch.float8_e4m3fn)
    path = tmp_path / "t.safetensors"
    torch_save_file(tensors, str(path))
    reference = dict(safetensors.deserialize(path.read_bytes()))
    with SafetensorsFile.from_path(path) as f:
        assert f.keys() == sorted(tensors)
        for name, t in tensors.items():
            assert f.info(name).dtype == reference[name]["dtype"]
            assert f.info(name).shape == tuple(t.shape)
            assert bytes(f.raw(name)) == bytes(reference[name]["data"])
        assert f.info("bf16") == TensorInfo("BF16", (3, 5), 30)
        assert f.metadata == {}


def test_no_tensors_and_padding() -> None:
    f = SafetensorsFile.from_bytes(save({}))
    assert f.keys() == [] and f.metadata == {}
    # A header padded with trailing spaces and a null __metadata__ are valid.
    f = SafetensorsFile.from_bytes(_raw_header(b'{"__metadata__": null}      '))
    assert f.metadata == {} and len(f) == 0


def test_sub_byte_dtypes() -> None:
    blob = _header_file({"a": _t("F4", [2, 3], 0, 3), "b": _t("F6_E2M3", [4], 3, 6)}, b"abcdef")
    f = SafetensorsFile.from_bytes(blob)
    assert f.info("a") == TensorInfo("F4", (2, 3), 3)
    assert bytes(f.raw("b")) == b"def"
    assert len(safetensors.deserialize(blob)) == 2  # the reference agrees


def test_unknown_tensor_name(written: tuple[Path, dict[str, np.ndarray]]) -> None:
    with SafetensorsFile.from_path(written[0]) as f:
        with pytest.raises(KeyError, match="no tensor named 'missing'"):
            f.raw("missing")
        with pytest.raises(KeyError, match="no tensor named 'missing'"):
            f.info("missing")


def test_close_with_live_views(written: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tensors = written
    for f in (SafetensorsFile.from_path(path), SafetensorsFile.from_bytes(path.read_bytes())):
        view = f.raw("u8")
        expected = bytes(view)
        f.close()  # must not raise although a view is alive
        assert bytes(view) == expected == tensors["u8"].tobytes()  # the view stays valid
        f.close()  # idempotent
        assert "closed" in repr(f) and f.closed
        for read in (f.raw, f.float32, f.array):
            with pytest.raises(ValueError, match="closed"):
                read("f32")


def test_file_shrunk_after_opening(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": np.ones(4, np.float32), "b": np.ones(8, np.float32)}, str(path))
    f = SafetensorsFile.from_path(path)
    path.write_bytes(path.read_bytes()[:-8])
    assert bytes(f.raw("a")) == np.ones(4, np.float32).tobytes()
    for read in (f.raw, f.float32, f.array):
        with pytest.raises(SafetensorsFormatError, match=r"m.safetensors is truncated: tensor 'b' has 24 of its 32"):
            read("b")


def test_from_path_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        SafetensorsFile.from_path(tmp_path / "missing.safetensors")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(SafetensorsFormatError, match=r"empty.safetensors is not a valid .*: file is only 0 bytes"):
        SafetensorsFile.from_path(empty)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(_header_file({"w": _t("F32", [4], 0, 16)}, b"\0" * 8))
    with pytest.raises(SafetensorsFormatError, match=r"bad.safetensors is not a valid .*: tensor 'w'.*truncated"):
        SafetensorsFile.from_path(bad)


def test_from_bytes_type_error() -> None:
    with pytest.raises(TypeError):
        SafetensorsFile.from_bytes("not bytes")  # type: ignore[arg-type]


# --- corruption ------------------------------------------------------------------------------

GOOD = {"a": _t("F32", [2], 0, 8), "b": _t("I64", [1], 8, 16)}
GOOD_DATA = bytes(range(16))


def _truncated_real_file() -> bytes:
    blob = save({"w": np.ones((4, 4), np.float32)})
    return blob[:-5]


CORRUPT = [
    pytest.param(b"", r"file is only 0 bytes, too short for the 8-byte header length", id="empty"),
    pytest.param(b"\x10\x00\x00", r"file is only 3 bytes", id="short"),
    pytest.param(
        _header_file(GOOD, GOOD_DATA, length=10_000),
        r"header length 10000 is larger than the file: only \d+ bytes follow",
        id="header-too-long",
    ),
    pytest.param(struct.pack("<Q", 2**63) + b"{}", r"exceeds the 100000000-byte limit", id="header-huge"),
    pytest.param(_raw_header(b'{"a": "\xff\xfe"}'), r"header is not valid UTF-8", id="not-utf8"),
    pytest.param(_raw_header(b'{"a": {"dtype": '), r"header is not valid JSON", id="bad-json"),
    pytest.param(_raw_header(b"{}\x00"), r"header is not valid JSON", id="trailing-nul"),
    pytest.param(_raw_header(b"[1, 2]"), r"header must be a JSON object, got list", id="not-object"),
    pytest.param(  # the last entry of a key counts, as in the library
        _raw_header(b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {}}', b"x"),
        r"tensor 'a': header entry is missing the field 'dtype'",
        id="duplicate-name",
    ),
    pytest.param(_header_file({"a": [1, 2]}), r"tensor 'a': header entry must be an object", id="entry-list"),
    pytest.param(
        _header_file({"w": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        r"tensor 'w': header entry is missing the field 'dtype'",
        id="missing-dtype",
    ),
    pytest.param(
        _header_file({"w": {"dtype": "F32", "data_offsets": [0, 8]}}, b"\0" * 8),
        r"tensor 'w': header entry is missing the field 'shape'",
        id="missing-shape",
    ),
    pytest.param(
        _header_file({"w": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
        r"tensor 'w': header entry is missing the field 'data_offsets'",
        id="missing-offsets",
    ),
    pytest.param(
        _header_file({"w": _t("f32", [2], 0, 8)}, b"\0" * 8),
        r"tensor 'w': unknown dtype 'f32'",
        id="unknown-dtype",
    ),
    pytest.param(
        _header_file({"w": _t("Q8", [2], 0, 2)}, b"\0" * 2),
        r"tensor 'w': unknown dtype 'Q8' \(known: BOOL, F4",
        id="unknown-dtype2",
    ),
    pytest.param(
        _header_file({"w": _t("F32", [-2], 0, 8)}, b"\0" * 8),
        r"tensor 'w': shape must be a list of non-negative integers, got \[-2\]",
        id="negative-dim",
    ),
    pytest.param(
        _header_file({"w": _t("F32", [2.0], 0, 8)}, b"\0" * 8),
        r"tensor 'w': shape must be a list of non-negative integers",
        id="float-dim",
    ),
    pytest.param(
        _header_file({"w": _t("F32", [True], 0, 4)}, b"\0" * 4),
        r"tensor 'w': shape must be a list of non-negative integers",
        id="bool-dim",
    ),
    pytest.param(
        _header_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8),
        r"tensor 'w': data_offsets must be \[begin, end\]",
        id="offsets-one-number",
    ),
    pytest.param(
        _header_file({"w": _t("F32", [2], 8, 0)}, b"\0" * 8),
        r"tensor 'w': data_offsets \[8, 0\] are out of order \(begin > end\)",
        id="offsets-reversed",
    ),
    pytest.param(
        _header_file({"w": _t("F32", [3], 0, 8)}, b"\0" * 8),
        r"tensor 'w': data_offsets \[0, 8\] span 8 bytes but shape \[3\] of F32 needs 12 bytes",
        id="size-mismatch",
    ),
    pytest.param(
        _header_file({"w": _t("F4", [3], 0, 2)}, b"\0" * 2),
        r"tensor 'w': shape \[3\] of F4 \(12 bits\) is not a whole number of bytes",
        id="sub-byte-size",
    ),
    pytest.param(
        _header_file({"a": _t("F32", [2], 0, 8), "b": _t("F32", [2], 4, 12)}, b"\0" * 12),
        r"tensor 'b': data_offsets \[4, 12\] overlap tensor 'a' which ends at 8",
        id="overlap",
    ),
    pytest.param(
        _header_file({"a": _t("U8", [2], 0, 2), "b": _t("U8", [2], 0, 2)}, b"\0" * 2),
        r"tensor 'b': data_offsets \[0, 2\] overlap tensor 'a'",
        id="same-offsets",
    ),
    pytest.param(
        _header_file({"a": _t("U8", [2], 0, 2), "b": _t("U8", [2], 4, 6)}, b"\0" * 6),
        r"tensor 'b': data_offsets \[4, 6\] leave a gap of 2 bytes after tensor 'a'",
        id="gap",
    ),
    pytest.param(
        _header_file({"a": _t("U8", [2], 2, 4)}, b"\0" * 4),
        r"tensor 'a': data_offsets \[2, 4\] leave a gap of 2 bytes at the start of the data",
        id="gap-at-start",
    ),
    pytest.param(
        _header_file({"a": _t("F32", [2], 100, 108)}, b"\0" * 8),
        r"tensor 'a': data_offsets \[100, 108\] reach past the end of the data section \(8 bytes\)",
        id="offsets-outside-data",
    ),
    pytest.param(
        _header_file(GOOD, GOOD_DATA[:12]),
        r"tensor 'b': data_offsets \[8, 16\] reach past the end of the data section \(12 bytes\): "
        r"the file is truncated",
        id="truncated",
    ),
    pytest.param(_truncated_real_file(), r"tensor 'w'.*the file is truncated", id="truncated-real"),
    pytest.param(
        _header_file(GOOD, GOOD_DATA + b"xyz"),
        r"3 unexpected bytes after the last tensor 'b'",
        id="trailing-bytes",
    ),
    pytest.param(
        _header_file({}, b"zz"), r"2 unexpected bytes after the header \(no tensors\)", id="no-tensors-data"
    ),
    pytest.param(
        _header_file({"__metadata__": {"k": 1}}),
        r"__metadata__\['k'\] must be a string, got int",
        id="metadata-value",
    ),
    pytest.param(
        _header_file({"__metadata__": ["k"]}),
        r"__metadata__ must be an object of strings, got list",
        id="metadata-list",
    ),
]


@pytest.mark.parametrize(("blob", "message"), CORRUPT)
def test_corruption_is_detected(blob: bytes, message: str) -> None:
    with pytest.raises(SafetensorsFormatError, match=message):
        SafetensorsFile.from_bytes(blob)
    # The reference implementation rejects every one of these files as well.
    with pytest.raises(Exception):  # noqa: B017
        safetensors.deserialize(blob)


def test_good_fixture_is_valid() -> None:
    """The hand-built GOOD file used by the corruption cases is itself valid."""
    f = SafetensorsFile.from_bytes(_header_file(GOOD, GOOD_DATA))
    assert f.info("a") == TensorInfo("F32", (2,), 8) and bytes(f.raw("b")) == GOOD_DATA[8:]
    assert len(safetensors.deserialize(_header_file(GOOD, GOOD_DATA))) == 2


def test_error_is_a_checkpoint_error() -> None:
    assert issubclass(SafetensorsFormatError, CheckpointError) and issubclass(SafetensorsFormatError, ValueError)
    with pytest.raises(ValueError):
        SafetensorsFile.from_bytes(b"1234")
