"""Finding and reading Hugging Face checkpoint directories: a local directory or a model id in the local Hugging
Face cache (offline, never the network); safetensors only — pickle (.bin) checkpoints are refused, because
loading them can run code. Safetensors are read by the `safetensors` library, or where it is missing (the page) by
the pure-Python `formats/safetensors_pure.py` (the same checks, messages and bytes). A tensor's bytes are a view of
the file's read-only map (the pure reader: a positioned read of that tensor), and a loader releases its pages as it
uploads them (`release`), so loading never holds the file, only the pieces in flight. Names are a family's
canonical names (`Family.canonical`); nothing here knows a family."""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError

if TYPE_CHECKING:  # (safetensors_pure is imported where a file is opened)
    from .safetensors_pure import SafetensorsFile, TensorInfo

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "shipped"  # the small model that ships with webtensor


def hf_cache_dir() -> Path:
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env)
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve(model: str | os.PathLike[str] | None) -> Path:
    """A checkpoint directory for `model`: None (the shipped model), a path, or a Hugging Face id
    ("gpt2", "openai-community/gpt2-xl", ...) looked up in the local cache only."""
    if model is None:
        return SHIPPED
    p = Path(model).expanduser()
    if p.is_dir():
        return p
    name = str(model)
    looks_like_id = name.count("/") <= 1 and not name.startswith((".", "/", "~"))
    if looks_like_id:
        ids = [name] if "/" in name else [name, f"openai-community/{name}"]
        cache = hf_cache_dir()
        for repo in ids:
            snap = _cached_snapshot(cache, repo)
            if snap is not None:
                return snap
        raise CheckpointError(
            f"model {name!r} is not in the local Hugging Face cache (looked in {cache} for "
            f"{', '.join('models--' + r.replace('/', '--') for r in ids)}). webtensor never downloads at run "
            f"time: fetch it once with `huggingface-cli download {ids[-1]} config.json model.safetensors "
            f"tokenizer.json vocab.json merges.txt`, or pass a directory"
        )
    raise CheckpointError(f"checkpoint directory {p} does not exist")


def _cached_snapshot(cache: Path, repo: str) -> Path | None:
    root = cache / ("models--" + repo.replace("/", "--"))
    snaps = root / "snapshots"
    if not snaps.is_dir():
        return None
    ref = root / "refs" / "main"
    if ref.is_file():
        snap = snaps / ref.read_text().strip()
        if (snap / "config.json").exists():
            return snap
    cands = sorted((s for s in snaps.iterdir() if (s / "config.json").exists()), key=lambda s: s.stat().st_mtime)
    return cands[-1] if cands else None


def weight_files(d: Path) -> list[Path]:
    files = sorted(d.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if pickles:
        raise CheckpointError(
            f"{d} holds only pickle checkpoints ({', '.join(pickles)}); webtensor refuses them because "
            "unpickling can run arbitrary code. Convert once with transformers: "
            "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    raise CheckpointError(f"{d} has no model.safetensors")


class SafetensorsReader:
    """Tensors from one or more .safetensors files (every *.safetensors of the directory: shards too), by
    canonical name (`canonical(key)`; None: a tensor to skip), read on demand as their stored bytes.

    Read by the `safetensors` library when it is installed; where it is missing, by webtensor's one pure-Python
    reader (`formats/safetensors_pure.py`), which accepts, refuses (with the same CheckpointError messages) and
    reads the same. Weights must be floats (F32, F16, BF16, F64)."""

    def __init__(self, files: list[Path], canonical: Callable[[str], str | None] = lambda k: k,
                 pure: bool | None = None):
        self.where = str(files[0].parent) if files else ""
        self._where: dict[str, tuple[SafetensorsFile | _LibraryFile, str]] = {}
        use_pure = not _have_library() if pure is None else pure
        for f in files:
            handle = _open_pure(f) if use_pure else _LibraryFile(f)
            for key in handle.keys():
                name = canonical(key)
                if name is None:
                    continue
                if name in self._where:
                    raise CheckpointError(f"{f}: tensor {name!r} is stored twice (as {key!r} and before that under "
                                          "another prefix, or in another file)")
                self._where[name] = (handle, key)

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        handle, key = self._where[name]
        return tuple(handle.info(key).shape)

    def dtype(self, name: str) -> str:
        """The safetensors dtype the tensor is stored in ("F32", "BF16", ...)."""
        handle, key = self._where[name]
        return handle.info(key).dtype

    def raw(self, name: str) -> memoryview:
        """The tensor's stored bytes (little-endian, C order): a view of the file's map where the library reads it,
        else a fresh read; CheckpointError for a tensor that is not a float."""
        from .safetensors_pure import FLOAT_DTYPES, not_a_float_error

        handle, key = self._where[name]
        dtype = handle.info(key).dtype
        if dtype not in FLOAT_DTYPES:
            raise not_a_float_error(f"{handle.path}: ", key, dtype)
        return handle.raw(key)

    def release(self, name: str, start: int, end: int) -> None:
        """Bytes start..end of tensor `name` are on the device: their pages of the file's map leave the process."""
        handle, key = self._where[name]
        if isinstance(handle, _LibraryFile):
            handle.release(key, start, end)

    def get(self, name: str) -> Any:
        """The tensor as a fresh numpy array: float32 (F32, BF16), float16 (F16) or float64 (F64)."""
        handle, key = self._where[name]
        return handle.array(key)


def _have_library() -> bool:
    try:
        import safetensors  # noqa: F401
    except ImportError:  # the browser, or an install without it
        return False
    return True


def _open_pure(f: Path) -> SafetensorsFile:
    from .safetensors_pure import SafetensorsFile

    try:
        return SafetensorsFile.from_path(f)
    except OSError as e:
        raise CheckpointError(f"{f} could not be read: {e}") from e


class _LibraryFile:
    """One .safetensors file read by the `safetensors` library. A file it refuses gets the pure
    reader's message for the problem (so both paths say the same), the library's where only the
    library sees one. A tensor is read with the file opened just for it: its mapping goes away
    once the array is copied out."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        from .safetensors_pure import DTYPE_BITS, TensorInfo

        self.path = path
        self._pure: SafetensorsFile | None = None  # the pure reader's view of the file (offsets, BF16), on demand
        self._map: mmap.mmap | None = None  # the file mapped read-only (`raw`), on demand
        try:
            with safe_open(str(path), framework="numpy") as h:
                self._info: dict[str, TensorInfo] = {}
                for k in h.keys():
                    s = h.get_slice(k)
                    get_dtype = getattr(s, "get_dtype", None)  # (not in every safetensors release)
                    dtype = get_dtype() if get_dtype is not None else self._pure_file().info(k).dtype
                    shape = tuple(s.get_shape())
                    self._info[k] = TensorInfo(dtype, shape, math.prod(shape) * DTYPE_BITS[dtype] // 8)
        except Exception as e:
            raise _refused(path, e) from e

    def _pure_file(self) -> SafetensorsFile:
        if self._pure is None:
            self._pure = _open_pure(self.path)
        return self._pure

    def keys(self) -> list[str]:
        return list(self._info)

    def info(self, key: str) -> TensorInfo:
        return self._info[key]

    def raw(self, key: str) -> memoryview:
        """The stored bytes, a view of the file's map (opened once, after the library checked the file): a loader
        holds a tensor's pages only while it uploads them (`release`), never a copy of the file."""
        begin, end = self._pure_file().file_range(key)
        if self._map is None:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if end > 0 else None
        return memoryview(self._map)[begin:end] if self._map is not None else memoryview(b"")

    def release(self, key: str, start: int, end: int) -> None:
        from .gguf_reader import drop_pages

        begin = self._pure_file().file_range(key)[0]
        drop_pages(self._map, begin + start, begin + end)

    def array(self, key: str) -> Any:
        from safetensors import safe_open

        from .safetensors_pure import FLOAT_DTYPES, not_a_float_error

        dtype = self._info[key].dtype
        if dtype not in FLOAT_DTYPES:
            raise not_a_float_error(f"{self.path}: ", key, dtype)
        if dtype == "BF16":  # numpy has no bfloat16, so the library cannot return it: widen its bits
            return self._pure_file().array(key)
        try:
            with safe_open(str(self.path), framework="numpy") as h:
                return h.get_tensor(key)
        except Exception as e:
            raise CheckpointError(f"{self.path}: tensor {key!r} could not be read: {e}") from e


def _refused(path: Path, e: Exception) -> CheckpointError:
    """The error for a file the library refused: the pure reader's account of the problem."""
    from .safetensors_pure import SafetensorsFormatError

    try:
        _open_pure(path).close()
    except (SafetensorsFormatError, CheckpointError) as pure:
        return pure
    return CheckpointError(f"{path} is not a valid safetensors file: {e}")


