"""llama.cpp's GGUF files, read for any model family: the metadata (hyper-parameters, tokenizer, chat template)
and each tensor's ggml type, shape and stored bytes, as views of the file's read-only map (`release` drops a
tensor's pages once a loader has them on the device). Read by webtensor's own `gguf_pure` reader (the page's too): on
a Llama 3 file (128,256 tokens, 280,147 merges) it parsed the metadata in 0.9 s and ~30 MB (a third of that since
string arrays are read in one loop: 0.68 -> 0.25 s for 128k tokens and 128k merges), where the `gguf`
package's `GGUFReader` takes 17.6 s and peaks ~430 MB above (one numpy array per string); reader="gguf" picks the
package's, which tests check reads the same. Which tensors a model has and what they are called is the family's
business (`Family.gguf_names`); nothing here knows a family.

Shapes are in numpy order (GGUF lists dimensions innermost first): a matrix of `n` rows of `k` values is
(n, k), the layout of nn.Linear and of ggml's blocks, which run along k.
"""

from __future__ import annotations

import functools
import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .gguf_pure import GGML_TYPES

_TYPE_SIZES = {name: (per_block, nbytes) for name, per_block, nbytes in GGML_TYPES.values()}
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class GGUFTensor:
    """One stored tensor: its ggml type, numpy-order shape and a reader of its raw bytes."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    read: Callable[[], Any]  # -> the stored bytes (a buffer)
    offset: int = 0  # where they start in the file

    @property
    def nbytes(self) -> int:
        per_block, block_bytes = _TYPE_SIZES.get(self.type_name, (1, 0))
        return math.prod(self.shape) // per_block * block_bytes


Opened = tuple[dict[str, Any], list[tuple[str, str, tuple[int, ...], Callable[[], Any], int]], Any]


def _open_with_gguf(path: Path) -> Opened:
    import gguf

    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors: list[tuple[str, str, tuple[int, ...], Callable[[], Any], int]] = []
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        data = t.data
        if data.nbytes != t.n_bytes:
            raise CheckpointError(f"tensor {t.name!r} has {data.nbytes} of its {t.n_bytes} bytes (truncated file?)")
        tensors.append((t.name, t.tensor_type.name, shape, functools.partial(_bytes_of, data), int(t.data_offset)))
    return meta, tensors, getattr(r.data, "_mmap", None)  # (numpy's memmap keeps its mmap.mmap there)


def _bytes_of(data: Any) -> Any:
    """A gguf-py tensor's data (a numpy memmap of its stored type) as its bytes (uint8, flat)."""
    import numpy as np

    return data.reshape(-1).view(np.uint8)


def _open_pure(path: Path) -> Opened:
    from .gguf_pure import GGUFFile

    f = GGUFFile.from_path(path)
    tensors: list[tuple[str, str, tuple[int, ...], Callable[[], Any], int]] = [
        (n, t.type_name, t.shape, functools.partial(f.raw, n), t.offset) for n, t in f.tensors.items()]
    return f.metadata, tensors, f.mapping


def drop_pages(mapping: Any, start: int, end: int) -> None:
    """Take bytes start..end of a read-only file map out of the process's resident memory (madvise DONTNEED): the
    map stays valid (a page read again comes back from the page cache or the file), so this changes no byte; a
    loader calls it once a tensor's bytes are on the device, so the file is never resident whole. A no-op where the
    platform has no madvise or `mapping` is not an mmap."""
    if not isinstance(mapping, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or mapping.closed:
        return
    start -= start % mmap.PAGESIZE  # (madvise takes whole pages; the neighbours' share is read again if needed)
    end = min(end, len(mapping))
    if end > start:
        mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


class GGUFCheckpoint:
    """A GGUF file: `metadata` (key -> value) and `tensors` (GGUF name -> GGUFTensor)."""

    def __init__(self, path: str | Path, reader: str = "auto"):
        """Open `path`. reader: "pure" or "auto" (gguf_pure), or "gguf" (the gguf package's GGUFReader). CheckpointError
        naming the file and the problem for anything that is not a valid GGUF file."""
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file {self.path} does not exist")
        if reader == "auto":
            reader = "pure"
        opener = {"gguf": _open_with_gguf, "pure": _open_pure}.get(reader)
        if opener is None:
            raise CheckpointError(f"unknown GGUF reader {reader!r}: expected 'auto', 'gguf' or 'pure'")
        try:
            meta, stored, self._mapping = opener(self.path)
        except CheckpointError as e:
            raise CheckpointError(f"{self.path}: {e}") from e
        except Exception as e:  # the readers raise ValueError, KeyError, struct errors ... on bad bytes
            raise CheckpointError(f"{self.path} is not a valid GGUF file (truncated or corrupt?): {e}") from e
        self.metadata: dict[str, Any] = meta
        self.tensors = {name: GGUFTensor(name, tname, shape, read, at) for name, tname, shape, read, at in stored}

    @property
    def architecture(self) -> Any:
        return self.metadata.get("general.architecture")

    def release(self, name: str, start: int, end: int) -> None:
        """Bytes start..end of tensor `name` are on the device: their pages leave the process (`drop_pages`)."""
        at = self.tensors[name].offset
        drop_pages(self._mapping, at + start, at + end)

    def raw(self, name: str) -> memoryview:
        """Tensor `name`'s stored bytes (a view of the file's map, not a copy); CheckpointError when they do not fill
        its shape or its type is unknown."""
        t = self.tensors[name]
        if t.type_name not in _TYPE_SIZES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has an unknown ggml type {t.type_name!r}")
        try:
            raw = memoryview(t.read()).cast("B")
        except Exception as e:
            raise CheckpointError(f"{self.path}: tensor {name!r} could not be read: {e}") from e
        if raw.nbytes != t.nbytes:
            raise CheckpointError(f"{self.path}: tensor {name!r}: {raw.nbytes} bytes where shape {t.shape} "
                                  f"{t.type_name} needs {t.nbytes}")
        return raw


def find_gguf(model: Any) -> Path | None:
    """The GGUF file `model` names: a file (any name: its magic is checked when read), or a directory holding
    exactly one *.gguf and no safetensors checkpoint. None otherwise (a safetensors directory, an id);
    CheckpointError for a directory with several GGUF files."""
    if model is None:
        return None
    p = Path(model).expanduser()
    if p.is_file():
        return p
    if not p.is_dir() or any(p.glob("*.safetensors")):
        return None
    files = sorted(p.glob("*.gguf"))
    if len(files) > 1:
        raise CheckpointError(f"{p} holds several GGUF files ({', '.join(f.name for f in files)}): pass one of them")
    return files[0] if files else None
