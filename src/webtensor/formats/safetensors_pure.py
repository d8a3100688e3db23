"""The one pure-Python reader of the safetensors format (standard library only; numpy optional).

Natively webtensor reads safetensors through the `safetensors` library (`formats/safetensors_reader.py`);
this reader stands in where the library is missing: the browser (Pyodide has neither the library
nor, on the page, numpy), and any install without it. Tests check that it accepts and refuses the
same files as the library, with the same messages on both paths, and reads the same values.

Layout of a ``.safetensors`` file::

    [8 bytes]  N, little-endian u64: length of the JSON header
    [N bytes]  UTF-8 JSON object:
                 {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
                  ...,
                  "__metadata__": {"<key>": "<string value>", ...}}      (optional)
    [rest]     the data section; ``data_offsets`` are relative to its start

The header is validated as the library validates it: every entry must have a known dtype, a shape
of non-negative ints and ``[begin, end]`` offsets whose length is ``prod(shape) * itemsize``; the
tensors must tile the data section exactly (sorted by offset, no overlap, no gap, nothing after the
last one); ``__metadata__`` is a map of strings. A key given twice takes its last value (as
``serde`` does in the library). Any violation raises :class:`SafetensorsFormatError` (a
`CheckpointError`) naming the problem and the tensor.

Reading a tensor (``name`` a key of the file):

* :meth:`SafetensorsFile.raw` - its stored bytes (little-endian, C order) as a ``memoryview``: a
  zero-copy slice of the caller's buffer for :meth:`~SafetensorsFile.from_bytes`, a fresh
  positioned read for :meth:`~SafetensorsFile.from_path` (nothing of the file stays mapped, so
  loading holds the weights plus one tensor, not twice the file).
* :meth:`SafetensorsFile.float32` - without numpy: the values as little-endian float32 bytes
  (``prod(shape) * 4`` of them; the shape is ``info(name).shape``), for `FLOAT_DTYPES` only,
  bit-exact with numpy's ``astype(float32)`` (F16 through a table of all 65536 halves, BF16 by
  placing its bits in the top half of a float32, F64 by C's double -> float).
* :meth:`SafetensorsFile.array` - with numpy: a fresh array, as the library's
  ``safe_open(..., framework="numpy").get_tensor`` returns it (float32 for F32, float16 for F16,
  float64 for F64) and float32 for BF16 (numpy has no bfloat16; the library cannot return it).

Other dtypes (I64, U8, F8_*, ...) can be read with :meth:`~SafetensorsFile.raw`, but ``float32`` and
``array`` refuse them with a `CheckpointError` naming the tensor and its dtype: model weights are
floats.
"""

from __future__ import annotations

import array as _array
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..errors import CheckpointError

__all__ = [
    "DTYPE_BITS",
    "FLOAT_DTYPES",
    "MAX_HEADER_SIZE",
    "SafetensorsFile",
    "SafetensorsFormatError",
    "TensorInfo",
    "not_a_float_error",
]

# Same limit as the reference implementation: refuse absurd headers before parsing them.
MAX_HEADER_SIZE = 100_000_000

#: Size in bits of one element of every dtype the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

_METADATA_KEY = "__metadata__"


#: The dtypes :meth:`SafetensorsFile.float32` and :meth:`SafetensorsFile.array` read: floats that
#: convert to float32 (model weights).
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}


class SafetensorsFormatError(CheckpointError):
    """The bytes are not a valid safetensors file; the message says what is wrong and where
    (a `CheckpointError`, hence a ValueError)."""


def not_a_float_error(where: str, name: str, dtype: str) -> CheckpointError:
    """The error for a tensor whose dtype is not one of `FLOAT_DTYPES` (the same on every path)."""
    return CheckpointError(f"{where}tensor {name!r} has dtype {dtype}; webtensor reads weights stored as "
                           f"{', '.join(FLOAT_DTYPES[:-1])} or {FLOAT_DTYPES[-1]}")


class TensorInfo(NamedTuple):
    """Description of one tensor of a safetensors file."""

    dtype: str
    """safetensors dtype name, e.g. ``"F32"``, ``"F16"``, ``"BF16"``, ``"I64"``."""
    shape: tuple[int, ...]
    """Shape; ``()`` for a scalar."""
    nbytes: int
    """Size of the tensor's data in bytes (``prod(shape) * itemsize``)."""


class _Entry(NamedTuple):
    info: TensorInfo
    begin: int
    end: int


def _is_uint(x: object) -> bool:
    return type(x) is int and x >= 0


def _parse_entry(name: str, entry: object) -> tuple[TensorInfo, int, int]:
    def fail(msg: str) -> SafetensorsFormatError:
        return SafetensorsFormatError(f"tensor {name!r}: {msg}")

    if not isinstance(entry, dict):
        raise fail(f"header entry must be an object, got {type(entry).__name__}")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise fail(f"header entry is missing the field {field!r}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise fail(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise fail(f"shape must be a list of non-negative integers, got {shape!r}")
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise fail(f"data_offsets must be [begin, end] with non-negative integers, got {offsets!r}")
    begin, end = offsets
    if begin > end:
        raise fail(f"data_offsets {offsets} are out of order (begin > end)")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise fail(f"shape {shape} of {dtype} ({bits} bits) is not a whole number of bytes")
    nbytes = bits // 8
    if end - begin != nbytes:
        raise fail(
            f"data_offsets {offsets} span {end - begin} bytes but shape {shape} of {dtype} "
            f"needs {nbytes} bytes"
        )
    return TensorInfo(dtype, tuple(shape), nbytes), begin, end


class SafetensorsFile:
    """A parsed, validated safetensors file: its tensors' names, dtypes, shapes, metadata and data.

    Open it with :meth:`from_path` (the header is read and checked at once, each tensor later with
    a positioned read) or :meth:`from_bytes` (a file held in memory); :meth:`close` (or a ``with``
    block) ends access.
    """

    def __init__(self, buffer: object) -> None:
        """Parse and validate ``buffer`` (any bytes-like object); the same as :meth:`from_bytes`.

        Raises:
            SafetensorsFormatError: the buffer is not a valid safetensors file.
            TypeError: ``buffer`` does not support the buffer protocol.
        """
        view = memoryview(buffer)  # type: ignore[arg-type]
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        self._setup(view, None)
        try:
            self._parse(view, len(view))
        except SafetensorsFormatError as e:
            self.close()
            raise SafetensorsFormatError(f"not a valid safetensors file: {e}") from None

    def _setup(self, view: memoryview | None, path: str | None) -> None:
        self._view = view  # the whole file (from_bytes), or None (from_path: positioned reads)
        self._path = path
        self._where = f"{path}: " if path is not None else ""
        self._closed = False
        self._entries: dict[str, _Entry] = {}
        self._metadata: dict[str, str] = {}
        self._data_start = 0

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, buffer: bytes | bytearray | memoryview) -> SafetensorsFile:
        """Read a safetensors file held in memory (no copy: :meth:`raw` views point into ``buffer``)."""
        return cls(buffer)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> SafetensorsFile:
        """Open a ``.safetensors`` file: read and validate its header now, its tensors on demand.

        Raises:
            FileNotFoundError / OSError: the file cannot be opened.
            SafetensorsFormatError: the file is not a valid safetensors file; the message starts
                with ``"<path> is not a valid safetensors file: "``.
        """
        self = cls.__new__(cls)
        self._setup(None, os.fspath(path))
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) == 8:
                n = int.from_bytes(head, "little")
                if n <= min(MAX_HEADER_SIZE, size - 8):
                    head += fh.read(n)
        try:
            self._parse(memoryview(head), size)
        except SafetensorsFormatError as e:
            self._closed = True
            raise SafetensorsFormatError(f"{self._path} is not a valid safetensors file: {e}") from None
        return self

    # -- parsing ------------------------------------------------------------------------------

    def _parse(self, head: memoryview, size: int) -> None:
        """Validate the file of `size` bytes whose first bytes (at least 8 + header length, where
        the file has them) are `head`."""
        if size < 8 or len(head) < 8:
            raise SafetensorsFormatError(f"file is only {size} bytes, too short for the 8-byte header length")
        n = int.from_bytes(head[:8], "little")
        if n > MAX_HEADER_SIZE:
            raise SafetensorsFormatError(
                f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit (corrupt file?)"
            )
        if n > size - 8 or len(head) < 8 + n:
            raise SafetensorsFormatError(
                f"header length {n} is larger than the file: only {size - 8} bytes follow the 8-byte length"
            )
        try:
            text = bytes(head[8 : 8 + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SafetensorsFormatError(f"header is not valid UTF-8: {e}") from None
        try:
            header = json.loads(text)
        except json.JSONDecodeError as e:
            raise SafetensorsFormatError(f"header is not valid JSON: {e}") from None
        if not isinstance(header, dict):
            raise SafetensorsFormatError(f"header must be a JSON object, got {type(header).__name__}")

        metadata = header.pop(_METADATA_KEY, None)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise SafetensorsFormatError(
                    f"{_METADATA_KEY} must be an object of strings, got {type(metadata).__name__}"
                )
            for key, value in metadata.items():
                if not isinstance(value, str):
                    raise SafetensorsFormatError(
                        f"{_METADATA_KEY}[{key!r}] must be a string, got {type(value).__name__}"
                    )
            self._metadata = dict(metadata)

        self._data_start = 8 + n
        data_len = size - self._data_start
        entries = {name: _Entry(*_parse_entry(name, entry)) for name, entry in header.items()}

        # The tensors must tile the data section: sorted by offset, each one starting where the
        # previous one ended, the last one ending at the end of the file.
        ordered = sorted(entries.items(), key=lambda kv: (kv[1].begin, kv[1].end))
        pos, prev = 0, None
        for name, ent in ordered:
            if ent.end > data_len:
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{ent.begin}, {ent.end}] reach past the end of the "
                    f"data section ({data_len} bytes): the file is truncated or the offsets are wrong"
                )
            if ent.begin < pos:
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{ent.begin}, {ent.end}] overlap tensor {prev!r} "
                    f"which ends at {pos}"
                )
            if ent.begin > pos:
                after = f"after tensor {prev!r}" if prev is not None else "at the start of the data"
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{ent.begin}, {ent.end}] leave a gap of "
                    f"{ent.begin - pos} bytes {after} (expected it to begin at {pos})"
                )
            pos, prev = ent.end, name
        if pos != data_len:
            last = f"the last tensor {prev!r}" if prev is not None else "the header (no tensors)"
            raise SafetensorsFormatError(
                f"{data_len - pos} unexpected bytes after {last}: the data section is {data_len} "
                f"bytes but the tensors cover {pos}"
            )
        self._entries = entries

    # -- what the file holds ------------------------------------------------------------------

    def keys(self) -> list[str]:
        """Tensor names, sorted (like ``safetensors.safe_open(...).keys()``)."""
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    @property
    def path(self) -> str | None:
        """The file's path (:meth:`from_path`), else None."""
        return self._path

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` string map (empty if the file has none)."""
        return dict(self._metadata)

    @property
    def data_start(self) -> int:
        """Offset of the data section from the start of the file (8 + header length)."""
        return self._data_start

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in this safetensors file") from None

    def info(self, name: str) -> TensorInfo:
        """dtype, shape and byte size of tensor ``name`` (``KeyError`` if absent)."""
        return self._entry(name).info

    def file_range(self, name: str) -> tuple[int, int]:
        """``(begin, end)`` byte offsets of tensor ``name`` from the start of the file."""
        e = self._entry(name)
        return self._data_start + e.begin, self._data_start + e.end

    # -- reading tensors ----------------------------------------------------------------------

    def _read_into(self, name: str, out: memoryview) -> None:
        """Fill `out` (bytes, the tensor's size) with tensor `name`'s stored bytes."""
        if self._closed:
            raise ValueError("safetensors file is closed")
        begin, end = self.file_range(name)
        if self._view is not None:
            out[:] = self._view[begin:end]
            return
        assert self._path is not None
        got = 0
        if end > begin:
            with open(self._path, "rb") as fh:
                fh.seek(begin)
                got = fh.readinto(out) or 0
        if got != end - begin:
            raise SafetensorsFormatError(f"{self._path} is truncated: tensor {name!r} has {got} of its "
                                         f"{end - begin} bytes (was the file changed after it was opened?)")

    def raw(self, name: str) -> memoryview:
        """Tensor ``name``'s stored bytes (little-endian, C order), as a byte ``memoryview``: a
        zero-copy view of the buffer for :meth:`from_bytes` (read-only unless the buffer is
        writable), a fresh read of the file for :meth:`from_path`.

        Raises:
            KeyError: no tensor of that name.
            ValueError: the file was closed.
            SafetensorsFormatError: the file is shorter than when it was opened.
        """
        if self._closed:
            raise ValueError("safetensors file is closed")
        if self._view is not None:
            begin, end = self.file_range(name)
            return self._view[begin:end]
        out = bytearray(self.info(name).nbytes)
        self._read_into(name, memoryview(out))
        return memoryview(out)

    def _float_info(self, name: str) -> TensorInfo:
        info = self.info(name)
        if info.dtype not in FLOAT_DTYPES:
            raise not_a_float_error(self._where, name, info.dtype)
        return info

    def float32(self, name: str) -> memoryview:
        """Tensor ``name`` converted to float32, without numpy: ``prod(shape) * 4`` little-endian
        bytes in C order, as a byte ``memoryview`` (for F32 that is :meth:`raw` itself).
        Bit-exact with numpy's ``astype(np.float32)``.

        Raises:
            CheckpointError: the dtype is not one of `FLOAT_DTYPES` (the message names the tensor
                and its dtype); or the errors of :meth:`raw`.
        """
        dtype = self._float_info(name).dtype
        raw = self.raw(name)
        if dtype == "F32":
            return raw
        if dtype == "BF16":  # a bfloat16 is the top half of a float32: put its two bytes there
            src = bytes(raw)
            out = bytearray(2 * len(src))
            out[2::4], out[3::4] = src[0::2], src[1::2]
            return memoryview(out)
        if dtype == "F16":
            halves = _array.array("H")
            halves.frombytes(raw)
            if _BIG_ENDIAN:
                halves.byteswap()
            words = _array.array("I", map(_half_table().__getitem__, halves))
        else:  # F64: C's double -> float (round to nearest, inf beyond the range), as numpy does
            doubles = _array.array("d")
            doubles.frombytes(raw)
            if _BIG_ENDIAN:
                doubles.byteswap()
            words = _array.array("f", doubles)  # type: ignore[assignment]
        if _BIG_ENDIAN:
            words.byteswap()
        return memoryview(words).cast("B")

    def array(self, name: str) -> Any:
        """Tensor ``name`` as a fresh numpy array of its shape (numpy is imported here): float32
        for F32 and BF16, float16 for F16, float64 for F64 - what the ``safetensors`` library's
        numpy ``get_tensor`` returns, except BF16, which numpy cannot hold.

        Raises:
            CheckpointError: the dtype is not one of `FLOAT_DTYPES`; or the errors of :meth:`raw`.
        """
        import numpy as np

        info = self._float_info(name)
        arr = np.empty(info.shape, _NUMPY_DTYPES[info.dtype])
        if arr.nbytes:
            self._read_into(name, arr.reshape(-1).view(np.uint8).data)
        elif self._closed:
            raise ValueError("safetensors file is closed")
        if info.dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End access (idempotent). Views from :meth:`raw` that are still alive stay valid."""
        self._closed = True
        view, self._view = self._view, None
        if view is not None:
            try:
                view.release()
            except BufferError:  # something holds a buffer exported from this view
                pass

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._entries)} tensors"
        where = f" {self._path}" if self._path is not None else ""
        return f"<{type(self).__name__}{where} {state}>"


_BIG_ENDIAN = sys.byteorder == "big"
_HALF_TABLE: list[int] = []


def _half_to_float_bits(h: int) -> int:
    """The float32 bit pattern of the IEEE half with bits `h` (exact: every half is a float32)."""
    sign, exp, frac = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
    if exp == 0x1F:  # inf / NaN, payload kept
        return sign | 0x7F800000 | (frac << 13)
    if exp:
        return sign | ((exp + 112) << 23) | (frac << 13)
    if not frac:
        return sign
    exp = 113  # subnormal half: normalize
    while not frac & 0x400:
        frac <<= 1
        exp -= 1
    return sign | (exp << 23) | ((frac & 0x3FF) << 13)


def _half_table() -> list[int]:
    """float32 bits of all 65536 halves, built on first use."""
    if not _HALF_TABLE:
        _HALF_TABLE.extend(_half_to_float_bits(h) for h in range(1 << 16))
    return _HALF_TABLE
