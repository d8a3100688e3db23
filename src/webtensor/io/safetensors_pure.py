"""Pure-Python reader of the safetensors format (standard library only, no numpy).

Layout of a ``.safetensors`` file::

    [8 bytes]  N, little-endian u64: length of the JSON header
    [N bytes]  UTF-8 JSON object:
                 {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
                  ...,
                  "__metadata__": {"<key>": "<string value>", ...}}      (optional)
    [rest]     the data section; ``data_offsets`` are relative to its start

The header is validated as strictly as the reference ``safetensors`` library does: every entry
must have a known dtype, a shape of non-negative ints and ``[begin, end]`` offsets whose length
is ``prod(shape) * itemsize``; the tensors must tile the data section exactly (sorted by offset,
no overlap, no gap, nothing after the last one).  Any violation raises
:class:`SafetensorsFormatError` naming the problem and the tensor.

:meth:`SafetensorsFile.raw` returns a zero-copy :class:`memoryview` of a tensor's bytes
(little-endian, C order), backed by an ``mmap`` of the file when possible (:meth:`from_path`) or
by the caller's buffer (:meth:`from_bytes`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import NamedTuple

try:  # mmap may be missing on exotic platforms (e.g. some WebAssembly builds)
    import mmap as _mmap
except ImportError:  # pragma: no cover
    _mmap = None  # type: ignore[assignment]

__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER_SIZE",
    "SafetensorsFile",
    "SafetensorsFormatError",
    "TensorInfo",
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


class SafetensorsFormatError(ValueError):
    """The bytes are not a valid safetensors file; the message says what is wrong and where."""


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


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsFormatError(f"header has the key {key!r} twice")
        out[key] = value
    return out


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
    """A parsed, validated safetensors file giving zero-copy access to its tensors' bytes.

    Use :meth:`from_path` or :meth:`from_bytes`; :meth:`close` (or a ``with`` block) releases
    an mmap-backed file.
    """

    def __init__(self, buffer: object, *, _owner: object | None = None) -> None:
        """Parse and validate ``buffer`` (any bytes-like object); prefer :meth:`from_bytes`.

        Raises:
            SafetensorsFormatError: the buffer is not a valid safetensors file.
            TypeError: ``buffer`` does not support the buffer protocol.
        """
        view = memoryview(buffer)  # type: ignore[arg-type]
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        self._view: memoryview | None = view
        self._owner = _owner  # e.g. the mmap to close
        self._entries: dict[str, _Entry] = {}
        self._metadata: dict[str, str] = {}
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, buffer: bytes | bytearray | memoryview) -> SafetensorsFile:
        """Read a safetensors file held in memory (no copy: views point into ``buffer``)."""
        return cls(buffer)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> SafetensorsFile:
        """Open a ``.safetensors`` file, memory-mapped read-only when the platform allows it.

        Raises:
            FileNotFoundError / OSError: the file cannot be opened.
            SafetensorsFormatError: the file is not a valid safetensors file.
        """
        owner: object | None = None
        with open(path, "rb") as f:
            if _mmap is not None:
                try:
                    owner = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)
                except (OSError, ValueError):  # empty file, special file, no mmap support
                    owner = None
            buffer = owner if owner is not None else f.read()
        try:
            return cls(buffer, _owner=owner)
        except SafetensorsFormatError as e:
            raise SafetensorsFormatError(f"{os.fspath(path)}: {e}") from None

    # -- parsing ------------------------------------------------------------------------------

    def _parse(self) -> None:
        view = self._view
        assert view is not None
        size = len(view)
        if size < 8:
            raise SafetensorsFormatError(f"file is only {size} bytes, too short for the 8-byte header length")
        n = int.from_bytes(view[:8], "little")
        if n > MAX_HEADER_SIZE:
            raise SafetensorsFormatError(
                f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit (corrupt file?)"
            )
        if n > size - 8:
            raise SafetensorsFormatError(
                f"header length {n} is larger than the file: only {size - 8} bytes follow the 8-byte length"
            )
        try:
            text = bytes(view[8 : 8 + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SafetensorsFormatError(f"header is not valid UTF-8: {e}") from None
        try:
            header = json.loads(text, object_pairs_hook=_reject_duplicates)
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
        for name, e in ordered:
            if e.end > data_len:
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{e.begin}, {e.end}] reach past the end of the "
                    f"data section ({data_len} bytes): the file is truncated or the offsets are wrong"
                )
            if e.begin < pos:
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{e.begin}, {e.end}] overlap tensor {prev!r} "
                    f"which ends at {pos}"
                )
            if e.begin > pos:
                after = f"after tensor {prev!r}" if prev is not None else "at the start of the data"
                raise SafetensorsFormatError(
                    f"tensor {name!r}: data_offsets [{e.begin}, {e.end}] leave a gap of "
                    f"{e.begin - pos} bytes {after} (expected it to begin at {pos})"
                )
            pos, prev = e.end, name
        if pos != data_len:
            last = f"the last tensor {prev!r}" if prev is not None else "the header (no tensors)"
            raise SafetensorsFormatError(
                f"{data_len - pos} unexpected bytes after {last}: the data section is {data_len} "
                f"bytes but the tensors cover {pos}"
            )
        self._entries = entries

    # -- access -------------------------------------------------------------------------------

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

    def raw(self, name: str) -> memoryview:
        """Zero-copy view of tensor ``name``'s bytes (read-only unless the source buffer is writable).

        The bytes are little-endian and C-ordered, exactly as stored in the file.

        Raises:
            KeyError: no tensor of that name.
            ValueError: the file was closed.
        """
        if self._view is None:
            raise ValueError("safetensors file is closed")
        begin, end = self.file_range(name)
        return self._view[begin:end]

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._view is None

    def close(self) -> None:
        """Release the buffer (and unmap the file).  Views from :meth:`raw` that are still alive
        keep the mapping valid until they are garbage collected."""
        view, self._view = self._view, None
        if view is not None:
            try:
                view.release()
            except BufferError:  # something holds a buffer exported from this view
                pass
        owner, self._owner = self._owner, None
        if owner is not None and hasattr(owner, "close"):
            try:
                owner.close()
            except BufferError:  # raw() views still alive; the mmap closes when they go
                pass

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._view is None else f"{len(self._entries)} tensors"
        return f"<{type(self).__name__} {state}>"
