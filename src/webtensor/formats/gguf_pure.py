"""Pure-Python reader of llama.cpp's GGUF format (standard library only), for the browser, where
the `gguf` package is not available. Natively webtensor reads GGUF through `gguf.GGUFReader`
(`gguf_reader.py`); tests check that both see the same metadata and tensor bytes.

Layout of a GGUF file (versions 2 and 3, little-endian)::

    "GGUF"  u32 version  u64 tensor_count  u64 kv_count
    kv_count times:      string key, u32 value_type, value
    tensor_count times:  string name, u32 n_dims, u64 dims[n_dims] (innermost first),
                         u32 ggml_type, u64 offset (from the start of the data section)
    padding to general.alignment (default 32), then the data section

A string is a u64 byte length and UTF-8 bytes; an array is a u32 item type, a u64 count and the
items. Every read is bounds-checked: a truncated or corrupt file raises `GGUFFormatError` naming
what was being read and where, never an IndexError or a huge allocation.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any, NamedTuple

try:  # mmap may be missing on exotic platforms (some WebAssembly builds)
    import mmap as _mmap
except ImportError:  # pragma: no cover
    _mmap = None  # type: ignore[assignment]

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS

# value types: id -> struct code of a scalar (None: string / array)
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_U64 = struct.Struct("<Q")
VALUE_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32",
                    7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}

# ggml tensor types: id -> (name, values per block, bytes per block), from ggml's type traits
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


class GGUFFormatError(ValueError):
    """The bytes are not a valid GGUF file; the message says what and where."""


def bf16_to_f32(raw: bytes | bytearray | memoryview) -> bytearray:
    """bfloat16 values (little-endian, 2 bytes each) -> float32 bytes, exactly: each value's two
    bytes become the top half of a float32 whose low half is zero (two strided copies, no loop)."""
    src = memoryview(raw).cast("B")
    if src.nbytes % 2:
        raise GGUFFormatError(f"{src.nbytes} bytes are not a whole number of bfloat16 values")
    out = bytearray(2 * src.nbytes)
    out[2::4], out[3::4] = src[0::2], src[1::2]
    return out


class TensorInfo(NamedTuple):
    name: str
    type_id: int
    type_name: str
    shape: tuple[int, ...]  # numpy order: outermost first (GGUF's dims reversed)
    n_elements: int
    offset: int  # absolute, from the start of the file
    nbytes: int


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, view: memoryview):
        self.view, self.pos = view, 0

    def _need(self, n: int, what: str) -> int:
        p = self.pos
        if n > len(self.view) - p:
            raise GGUFFormatError(f"file is truncated: {what} at byte {p} needs {n} bytes, "
                                  f"{len(self.view) - p} remain")
        self.pos = p + n
        return p

    def scalars(self, code: str, count: int, what: str) -> tuple[Any, ...]:
        size = struct.calcsize("<" + code)
        p = self._need(size * count, what)
        return struct.unpack_from(f"<{count}{code}", self.view, p)

    def scalar(self, code: str, what: str) -> Any:
        return self.scalars(code, 1, what)[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", what + " length")
        p = self._need(n, what)
        try:
            return str(self.view[p : p + n], "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError(f"{what} at byte {p} is not valid UTF-8: {e}") from None

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings one after another: `string`'s reads and messages (item i named `what[i]`) in one loop
        (a vocabulary's 128k tokens and 280k merges: ~0.3 s, where a call a string took ~1.3 s)."""
        view, p, end, out = self.view, self.pos, len(self.view), []
        length = _U64.unpack_from
        for i in range(count):
            if end - p < 8:
                self.pos = p
                self._need(8, f"{what}[{i}] length")
            (n,) = length(view, p)
            p += 8
            if n > end - p:
                self.pos = p
                self._need(n, f"{what}[{i}]")
            try:
                out.append(str(view[p : p + n], "utf-8"))
            except UnicodeDecodeError as e:
                raise GGUFFormatError(f"{what}[{i}] at byte {p} is not valid UTF-8: {e}") from None
            p += n
        self.pos = p
        return out


def _value(cur: _Cursor, vtype: int, what: str) -> tuple[Any, tuple[int, ...]]:
    """A value of type `vtype` and its full type (array: (9, item type, ...))."""
    code = _SCALARS.get(vtype)
    if code is not None:
        return cur.scalar(code, what), (vtype,)
    if vtype == _STRING:
        return cur.string(what), (vtype,)
    if vtype != _ARRAY:
        raise GGUFFormatError(f"{what} has unknown value type {vtype}")
    itype = cur.scalar("I", what + " item type")
    count = cur.scalar("Q", what + " count")
    code = _SCALARS.get(itype)
    if code is not None:
        return list(cur.scalars(code, count, what)), (vtype, itype)
    if itype not in (_STRING, _ARRAY):
        raise GGUFFormatError(f"{what} is an array of unknown value type {itype}")
    min_item = 8 if itype == _STRING else 12
    if count * min_item > len(cur.view) - cur.pos:  # refuse an absurd count before looping over it
        raise GGUFFormatError(f"file is truncated: {what} claims {count} items at byte {cur.pos}")
    if itype == _STRING:
        return cur.strings(count, what), (vtype, itype)
    items: list[Any] = []
    sub: tuple[int, ...] = (itype,)
    for i in range(count):
        v, sub = _value(cur, itype, f"{what}[{i}]")
        items.append(v)
    return items, (vtype, *sub)


class GGUFFile:
    """A parsed GGUF file: `metadata` (key -> value), `value_types` (key -> type ids),
    `tensors` (name -> TensorInfo, in file order) and `raw(name)`, a zero-copy view of a tensor's
    bytes. Build with `from_path` (memory-mapped where possible) or `from_bytes`."""

    def __init__(self, buffer: Any, _owner: Any = None):
        self._owner = _owner
        self._view = memoryview(buffer).cast("B")
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, tuple[int, ...]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._names: set[str] = set()
        self._parse()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> GGUFFile:
        return cls(data)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> GGUFFile:
        """Open a .gguf file. Raises OSError if it cannot be opened, GGUFFormatError if it is not GGUF."""
        owner = None
        with open(path, "rb") as f:
            if _mmap is not None:
                try:
                    owner = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
                except (OSError, ValueError):  # empty or special file, no mmap support
                    owner = None
            buffer = owner if owner is not None else f.read()
        try:
            return cls(buffer, _owner=owner)
        except GGUFFormatError as e:
            raise GGUFFormatError(f"{os.fspath(path)}: {e}") from None

    def _parse(self) -> None:
        cur = _Cursor(self._view)
        magic = bytes(self._view[:4])
        if magic != MAGIC:
            raise GGUFFormatError(f"not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
        cur.pos = 4
        version = cur.scalar("I", "version")
        if version & 0xFFFF == 0 and version:
            raise GGUFFormatError("big-endian GGUF files are not supported")
        if version not in SUPPORTED_VERSIONS:
            raise GGUFFormatError(f"GGUF version {version} is not supported (only {SUPPORTED_VERSIONS})")
        self.version = version
        n_tensors, n_kv = cur.scalars("Q", 2, "tensor and key counts")
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:
                raise GGUFFormatError(f"metadata key {key!r} appears twice")
            vtype = cur.scalar("I", f"type of {key!r}")
            self.metadata[key], self.value_types[key] = _value(cur, vtype, f"value of {key!r}")
        infos = [self._tensor_info(cur, i) for i in range(n_tensors)]
        self.header_size = cur.pos  # bytes before the alignment padding and the data section
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata and self.value_types["general.alignment"] != (4,):
            raise GGUFFormatError("general.alignment must be a UINT32")
        if align <= 0 or align & (align - 1):
            raise GGUFFormatError(f"general.alignment {align} is not a power of two")
        self.alignment = align
        self.data_offset = -(-cur.pos // align) * align
        size = len(self._view)
        for name, dims, type_id, rel in infos:
            tname, block, type_size = GGML_TYPES[type_id]
            n = math.prod(dims)
            if dims and dims[0] % block:
                raise GGUFFormatError(f"tensor {name!r} of type {tname} has rows of {dims[0]} values, "
                                      f"not a multiple of its block of {block}")
            nbytes = n // block * type_size
            start = self.data_offset + rel
            if rel % align:
                raise GGUFFormatError(f"tensor {name!r}: offset {rel} is not a multiple of the alignment {align}")
            if start + nbytes > size:
                raise GGUFFormatError(f"file is truncated: tensor {name!r} needs bytes {start}..{start + nbytes}, "
                                      f"the file has {size}")
            self.tensors[name] = TensorInfo(name, type_id, tname, tuple(reversed(dims)), n, start, nbytes)

    def _tensor_info(self, cur: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = cur.string(f"name of tensor #{i}")
        if name in self._names:
            raise GGUFFormatError(f"tensor {name!r} appears twice")
        self._names.add(name)
        n_dims = cur.scalar("I", f"rank of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")
        dims = cur.scalars("Q", n_dims, f"shape of tensor {name!r}")
        type_id = cur.scalar("I", f"type of tensor {name!r}")
        if type_id not in GGML_TYPES:
            raise GGUFFormatError(f"tensor {name!r} has unknown ggml type {type_id}")
        rel = cur.scalar("Q", f"offset of tensor {name!r}")
        return name, dims, type_id, rel

    @property
    def mapping(self) -> Any:
        """The file's mmap (`from_path`), or None (the bytes were read, or given)."""
        return self._owner

    def raw(self, name: str) -> memoryview:
        """The tensor's bytes, zero-copy (little-endian; ggml blocks for quantized types)."""
        t = self.tensors[name]
        return self._view[t.offset : t.offset + t.nbytes]

    def float32(self, name: str) -> bytearray:
        """An F32 or BF16 tensor's values as little-endian float32 bytes (BF16 widened exactly:
        `bf16_to_f32`); GGUFFormatError for another type."""
        t = self.tensors[name]
        if t.type_name == "F32":
            return bytearray(self.raw(name))
        if t.type_name == "BF16":
            return bf16_to_f32(self.raw(name))
        raise GGUFFormatError(f"tensor {name!r} is {t.type_name}, not F32 or BF16")

    def close(self) -> None:
        self._view.release()
        if self._owner is not None:
            self._owner.close()
