"""Finding and reading GPT-2 checkpoints: a local directory or a model id in the local Hugging Face
cache (offline, never the network); safetensors only — pickle (.bin) checkpoints are refused,
because loading them can run code. Tensors are read one at a time with positioned reads (no mapping
of the whole file stays resident) and uploaded one by one, so loading holds the weights plus about one
tensor in host RAM."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from .config import GPT2Config

SHIPPED = Path(__file__).parent / "shipped"


def hf_cache_dir() -> Path:
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env)
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve(model: str | os.PathLike | None) -> Path:
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
            "GPT2LMHeadModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    raise CheckpointError(f"{d} has no model.safetensors")


def expected_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    return dict(_iter_expected(cfg))


def _iter_expected(cfg: GPT2Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Lazily, so that checking a config.json with an absurd n_layer stops at the first missing layer."""
    C, V, P = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    yield from {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}.items()
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        yield from {
            h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
            h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
            h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
            h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,),
        }.items()


class SafetensorsReader:
    """Tensors from one or more .safetensors files, by GPT-2 name (prefix stripped), read on demand.
    Uses the `safetensors` library to validate each file; the pure-Python reader only where it is
    missing (browser)."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, tuple[Any, str]] = {}
        for f in files:
            handle = _open(f)
            for key in handle.keys():
                name = key.removeprefix("transformer.")
                self._where[name] = (handle, key)

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        handle, key = self._where[name]
        return tuple(handle.info(key).shape)

    def get(self, name: str) -> Any:
        """The tensor as a fresh numpy array (or, on the numpy-free path, its raw bytes)."""
        handle, key = self._where[name]
        try:
            return handle.get_tensor(key)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"tensor {key!r} could not be read: {e}") from e


def _open(f: Path) -> Any:
    try:
        from safetensors import safe_open
    except ImportError:  # the browser: no compiled safetensors
        from ...io.safetensors_pure import SafetensorsFile, SafetensorsFormatError

        try:
            return _PureHandle(SafetensorsFile.from_path(f))
        except SafetensorsFormatError as e:
            raise CheckpointError(f"{f} is not a valid safetensors file: {e}") from e
    try:
        with safe_open(str(f), framework="numpy"):  # validates the header, offsets and file size
            pass
        return _PreadHandle(f)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{f} is not a valid safetensors file (truncated or corrupt header?): {e}") from e


class _Info:
    def __init__(self, dtype: str, shape: tuple[int, ...], begin: int, end: int):
        self.dtype, self.shape, self.begin, self.end = dtype, shape, begin, end


_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
              "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class _PreadHandle:
    """One safetensors file (already validated by the library), each tensor read into a fresh numpy
    array with a positioned read: nothing of the file stays mapped, so peak host memory while
    loading is the weights plus one tensor, not twice the file."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        self.data_start = 8 + n
        self._info = {k: _Info(v["dtype"], tuple(v["shape"]), *v["data_offsets"])
                      for k, v in header.items() if k != "__metadata__"}

    def keys(self) -> list[str]:
        return list(self._info)

    def info(self, key: str) -> _Info:
        return self._info[key]

    def get_tensor(self, key: str) -> Any:
        import numpy as np

        i = self._info[key]
        if i.dtype not in _NP_DTYPES:
            raise CheckpointError(f"{self.path}: tensor {key!r} has dtype {i.dtype}, which webtensor cannot read")
        arr = np.empty(i.shape, _NP_DTYPES[i.dtype])
        want = i.end - i.begin
        if arr.nbytes != want:
            raise CheckpointError(f"{self.path}: tensor {key!r} has {want} bytes for shape {i.shape} {i.dtype}")
        with open(self.path, "rb") as fh:
            fh.seek(self.data_start + i.begin)
            got = fh.readinto(arr.reshape(-1).view(np.uint8)) if want else 0
        if got != want:
            raise CheckpointError(f"{self.path} is truncated: tensor {key!r} has {got} of its {want} bytes")
        if i.dtype == "BF16":  # numpy has no bfloat16: widen the top 16 bits of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr


class _PureHandle:
    def __init__(self, sf: Any):
        self.sf = sf

    def keys(self) -> list[str]:
        return list(self.sf.keys())

    def info(self, key: str) -> Any:
        return self.sf.info(key)

    def get_tensor(self, key: str) -> Any:
        info = self.sf.info(key)
        return _RawTensor(self.sf.raw(key), info.dtype, tuple(info.shape))


class _RawTensor:
    """Bytes of a tensor, for the numpy-free path (uploads take any buffer)."""

    def __init__(self, data: memoryview, dtype: str, shape: tuple[int, ...]):
        self.data, self.dtype, self.shape = data, dtype, shape


def check_checkpoint(reader: SafetensorsReader, cfg: GPT2Config, where: Path) -> None:
    names = reader.names()
    for name, shape in _iter_expected(cfg):
        if name not in names:
            raise CheckpointError(f"{where}: tensor {name!r} is missing from the checkpoint")
        got = reader.shape(name)
        if got != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {got}, expected {shape} from config.json")
