"""Finding and reading GPT-2 checkpoints: a local directory or a model id in the local Hugging Face
cache (offline, never the network); safetensors only — pickle (.bin) checkpoints are refused,
because loading them can run code. Safetensors are read by the `safetensors` library, or where it is
missing by the pure-Python `formats/safetensors_pure.py` (the same checks, messages and values).
Tensors are read one at a time (no mapping of the whole file stays resident) and uploaded one by
one, so loading holds the weights plus about one tensor in host RAM."""

from __future__ import annotations

import math
import os
import re
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
    """Tensors from one or more .safetensors files (every *.safetensors of the directory: shards
    too), by GPT-2 name (prefix stripped), read on demand as numpy arrays.

    Read by the `safetensors` library when it is installed; where it is missing, by webtensor's
    one pure-Python reader (`formats/safetensors_pure.py`), which accepts, refuses (with the same
    CheckpointError messages) and reads the same. Weights must be floats (F32, F16, BF16, F64).
    Each tensor is read into a fresh array and nothing of the file stays mapped (the library maps
    the file only while it copies one tensor out; the pure reader uses positioned reads): loading
    holds the weights plus about one tensor in host RAM."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, tuple[Any, str]] = {}
        for f in files:
            handle = _LibraryFile(f) if _have_library() else _open_pure(f)
            for key in handle.keys():
                add_tensor(self._where, key, (handle, key), f)

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        handle, key = self._where[name]
        return tuple(handle.info(key).shape)

    def dtype(self, name: str) -> str:
        """The safetensors dtype the tensor is stored in ("F32", "BF16", ...)."""
        handle, key = self._where[name]
        return handle.info(key).dtype

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


def _open_pure(f: Path) -> Any:
    from ...formats.safetensors_pure import SafetensorsFile

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

        from ...formats.safetensors_pure import DTYPE_BITS, TensorInfo

        self.path = path
        self._pure: Any = None  # the pure reader's view of the file (BF16 tensors), opened on demand
        try:
            with safe_open(str(path), framework="numpy") as h:
                self._info = {}
                for k in h.keys():
                    s = h.get_slice(k)
                    get_dtype = getattr(s, "get_dtype", None)  # (not in every safetensors release)
                    dtype = get_dtype() if get_dtype is not None else self._pure_file().info(k).dtype
                    shape = tuple(s.get_shape())
                    self._info[k] = TensorInfo(dtype, shape, math.prod(shape) * DTYPE_BITS[dtype] // 8)
        except Exception as e:
            raise _refused(path, e) from e

    def _pure_file(self) -> Any:
        if self._pure is None:
            self._pure = _open_pure(self.path)
        return self._pure

    def keys(self) -> list[str]:
        return list(self._info)

    def info(self, key: str) -> Any:
        return self._info[key]

    def array(self, key: str) -> Any:
        from safetensors import safe_open

        from ...formats.safetensors_pure import FLOAT_DTYPES, not_a_float_error

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
    from ...formats.safetensors_pure import SafetensorsFormatError

    try:
        _open_pure(path).close()
    except (SafetensorsFormatError, CheckpointError) as pure:
        return pure
    return CheckpointError(f"{path} is not a valid safetensors file: {e}")


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
