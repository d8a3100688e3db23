"""Finding and reading GPT-2 checkpoints: a local directory or a model id in the local Hugging Face
cache (offline, never the network); safetensors only — pickle (.bin) checkpoints are refused,
because loading them can run code. Tensors are read one at a time with positioned reads (no mapping
of the whole file stays resident) and uploaded one by one, so loading holds the weights plus about one
tensor in host RAM."""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator, Mapping
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
    C, V, P, F = cfg.n_embd, cfg.vocab_size, cfg.n_positions, cfg.inner_dim
    yield from {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}.items()
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (V, C)  # torch Linear layout (V, C), like wte
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        yield from {
            h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
            h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
            h + "mlp.c_fc.weight": (C, F), h + "mlp.c_fc.bias": (F,),
            h + "mlp.c_proj.weight": (F, C), h + "mlp.c_proj.bias": (C,),
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
                add_tensor(self._where, key, (handle, key), f)

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


# tensors a GPT-2 checkpoint may hold that do not take part in generation: the causal-mask buffers
# of old checkpoints (Hugging Face ignores them too) and GPT2DoubleHeadsModel's multiple-choice head
IGNORED_TENSORS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|multiple_choice_head\..*")


def gpt2_name(key: str) -> str:
    """A checkpoint key as webtensor names it: GPT2LMHeadModel's "transformer." prefix dropped."""
    return key.removeprefix("transformer.")


def add_tensor(index: dict[str, Any], key: str, value: Any, where: Path) -> None:
    """index[gpt2_name(key)] = value, refusing a second tensor of the same name (a key stored both
    with and without the prefix, or in two files)."""
    name = gpt2_name(key)
    if name in index:
        raise CheckpointError(f"{where}: tensor {name!r} is stored twice (as {key!r} and before that with "
                              "or without the 'transformer.' prefix, or in another file)")
    index[name] = value


def check_checkpoint(reader: SafetensorsReader, cfg: GPT2Config, where: Path) -> None:
    check_shapes({n: reader.shape(n) for n in reader.names()}, cfg, where)


def check_shapes(shapes: Mapping[str, tuple[int, ...]], cfg: GPT2Config, where: Path) -> None:
    """Refuse a checkpoint whose tensors (`shapes`, by GPT-2 name) disagree with config.json: the
    sizes they imply first (naming both values), then each tensor, then tensors nobody would read."""
    _check_implied_sizes(shapes, cfg, where)
    expected = set()
    for name, shape in _iter_expected(cfg):
        expected.add(name)
        if name not in shapes:
            raise CheckpointError(f"{where}: tensor {name!r} is missing from the checkpoint")
        got = tuple(shapes[name])
        if got != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {got}, expected {shape} from config.json")
    extra = sorted(n for n in shapes if n not in expected and not IGNORED_TENSORS.fullmatch(n)
                   and not (n == "lm_head.weight" and cfg.tie_word_embeddings))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise CheckpointError(f"{where}: the checkpoint holds tensors a GPT-2 LM does not have: "
                              f"{', '.join(map(repr, extra[:3]))}{more} (another architecture, or an extra head?)")


def _check_implied_sizes(shapes: Mapping[str, tuple[int, ...]], cfg: GPT2Config, where: Path) -> None:
    layers = {int(m.group(1)) for n in shapes if (m := re.match(r"h\.(\d+)\.", n))}
    n_layer = max(layers) + 1 if layers else 0
    if n_layer != cfg.n_layer:
        raise CheckpointError(f"{where}: config.json says n_layer = {cfg.n_layer} but the checkpoint has "
                              f"{n_layer} layers (h.0 .. h.{n_layer - 1})")
    implied = [("vocab_size", "wte.weight", 0, cfg.vocab_size), ("n_embd", "wte.weight", 1, cfg.n_embd),
               ("n_positions", "wpe.weight", 0, cfg.n_positions),
               ("n_inner", "h.0.mlp.c_fc.weight", 1, cfg.inner_dim)]
    if not cfg.tie_word_embeddings:
        implied.append(("vocab_size", "lm_head.weight", 0, cfg.vocab_size))
    for field, name, axis, want in implied:
        shape = shapes.get(name)
        if shape is not None and len(shape) == 2 and shape[axis] != want:
            said = f"{cfg.n_inner} ({want})" if field == "n_inner" and cfg.n_inner is None else str(want)
            raise CheckpointError(f"{where}: config.json says {field} = {said} but tensor {name!r} has shape "
                                  f"{tuple(shape)}, i.e. {field} = {shape[axis]}")
    if cfg.tie_word_embeddings and "lm_head.weight" in shapes and "wte.weight" in shapes \
            and tuple(shapes["lm_head.weight"]) != tuple(shapes["wte.weight"]):
        raise CheckpointError(f"{where}: tie_word_embeddings = true but lm_head.weight has shape "
                              f"{tuple(shapes['lm_head.weight'])}, wte.weight {tuple(shapes['wte.weight'])}")


def check_tied_head(same: bool, where: Path) -> None:
    """With tie_word_embeddings a stored lm_head.weight must equal wte.weight (the loaders compare
    them): otherwise which one the head should be is ambiguous."""
    if not same:
        raise CheckpointError(f"{where}: tie_word_embeddings = true, but the checkpoint's lm_head.weight differs "
                              "from wte.weight; set tie_word_embeddings to false to use lm_head.weight")


def check_tokenizer(cfg: GPT2Config, tokenizer_ids: int, where: Path) -> None:
    """The tokenizer's ids (largest + 1) must have embedding rows; a padded embedding (more rows
    than the tokenizer uses) is fine."""
    if tokenizer_ids > cfg.vocab_size:
        raise CheckpointError(f"{where}: the tokenizer has {tokenizer_ids} token ids but config.json's vocab_size "
                              f"= {cfg.vocab_size}: ids {cfg.vocab_size}.. would have no embedding row")
