"""llama.cpp's GGUF files, read for any model family: the metadata (hyper-parameters, tokenizer, chat template)
and each tensor's ggml type, shape and stored bytes. Read through the `gguf` package's `GGUFReader`; where it is
missing (the page) the pure-Python `gguf_pure` reader stands in, which tests check reads the same. Which tensors a
model has and what they are called is the family's business (`Family.gguf_names`); nothing here knows a family.

Shapes are in numpy order (GGUF lists dimensions innermost first): a matrix of `n` rows of `k` values is
(n, k), the layout of nn.Linear and of ggml's blocks, which run along k.
"""

from __future__ import annotations

import functools
import math
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

    @property
    def nbytes(self) -> int:
        per_block, block_bytes = _TYPE_SIZES.get(self.type_name, (1, 0))
        return math.prod(self.shape) // per_block * block_bytes


def _open_with_gguf(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, tuple[int, ...], Callable[[], Any]]]]:
    import gguf

    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors: list[tuple[str, str, tuple[int, ...], Callable[[], Any]]] = []
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        data = t.data
        if data.nbytes != t.n_bytes:
            raise CheckpointError(f"tensor {t.name!r} has {data.nbytes} of its {t.n_bytes} bytes (truncated file?)")
        tensors.append((t.name, t.tensor_type.name, shape, functools.partial(_bytes_of, data)))
    return meta, tensors


def _bytes_of(data: Any) -> Any:
    """A gguf-py tensor's data (a numpy memmap of its stored type) as its bytes (uint8, flat)."""
    import numpy as np

    return data.reshape(-1).view(np.uint8)


def _open_pure(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, tuple[int, ...], Callable[[], Any]]]]:
    from .gguf_pure import GGUFFile

    f = GGUFFile.from_path(path)
    return f.metadata, [(n, t.type_name, t.shape, functools.partial(f.raw, n)) for n, t in f.tensors.items()]


class GGUFCheckpoint:
    """A GGUF file: `metadata` (key -> value) and `tensors` (GGUF name -> GGUFTensor)."""

    def __init__(self, path: str | Path, reader: str = "auto"):
        """Open `path`. reader: "gguf" (the gguf package), "pure" (gguf_pure), or "auto" (the package where it is
        installed). CheckpointError naming the file and the problem for anything that is not a valid GGUF file."""
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file {self.path} does not exist")
        if reader == "auto":
            try:
                import gguf  # noqa: F401

                reader = "gguf"
            except ImportError:
                reader = "pure"
        opener = {"gguf": _open_with_gguf, "pure": _open_pure}.get(reader)
        if opener is None:
            raise CheckpointError(f"unknown GGUF reader {reader!r}: expected 'auto', 'gguf' or 'pure'")
        try:
            meta, stored = opener(self.path)
        except CheckpointError as e:
            raise CheckpointError(f"{self.path}: {e}") from e
        except Exception as e:  # the readers raise ValueError, KeyError, struct errors ... on bad bytes
            raise CheckpointError(f"{self.path} is not a valid GGUF file (truncated or corrupt?): {e}") from e
        self.metadata: dict[str, Any] = meta
        self.tensors = {name: GGUFTensor(name, tname, shape, read) for name, tname, shape, read in stored}

    @property
    def architecture(self) -> Any:
        return self.metadata.get("general.architecture")

    def raw(self, name: str) -> memoryview:
        """Tensor `name`'s stored bytes; CheckpointError when they do not fill its shape or its type is unknown."""
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
