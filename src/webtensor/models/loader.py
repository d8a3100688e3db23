"""Loading a model from any source onto any device, for every family: the one loader behind
`webtensor.load_model`, `GPT2.from_pretrained`, the CLI, the server and the page.

A source is a Hugging Face checkpoint directory (config.json, *.safetensors — sharded, float32 / float16 /
bfloat16 —, tokenizer.json, tokenizer_config.json's chat template, generation_config.json's EOS ids), a model id
in the local Hugging Face cache, or a llama.cpp GGUF file (or a directory holding exactly one). The family comes
from the registry (config.json's `model_type`, GGUF's `general.architecture`); the family's config parser, tensor
map and checks decide the rest. Every expected tensor is checked (present, its shape, its stored type) before
anything is uploaded; a bad checkpoint is one line (CheckpointError) naming the file and the tensor.

Weights go to the device one tensor at a time from their stored bytes, numpy-free (the page runs this loader
too): floats are converted on the device where it can (float16 <-> float32 casts, transposes), quantized GGUF
blocks are uploaded as they are (dequantized in registers by the kernels). `dtype`:

- None ("auto"): as stored — float32 checkpoints in float32, float16 ones in float16 where the device computes
  in it (WebGPU with shader-f16; elsewhere float32: the CPU reference widens every float16 product to float32,
  so float32 weights give it the same results several times faster), bfloat16 ones in float32; quantized
  tensors kept quantized;
- "float32" / "float16": every matrix and embedding in that type (quantized ones dequantized);
- "q8_0" (or "int8"): float matrices and embeddings quantized to q8_0 at load; quantized ones kept.

Norms, biases and position tables are always float32. Float matrices are handed to the family as (K, N) views
(`x @ W`), stored transposed (N, K) where the backend's GEMV wants it (`Backend.kmajor_weights`); quantized ones
as (N, K). Where the family asks for it (`Family.fusions`), parts stored alike (q, k, v) are concatenated along
their output rows into one matrix.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from ..chat import find_chat_template
from ..errors import CheckpointError, TokenizerError
from ..formats.gguf_reader import FLOAT_TYPES, GGUFCheckpoint, find_gguf
from ..formats.safetensors_reader import SafetensorsReader, resolve, weight_files
from ..quant import TYPES as _QUANT
from ..tensor import from_buffer
from . import registry
from .config_reader import read_json_object, token_ids
from .spec import Family, TensorSpec

QUANT_TYPES = tuple(_QUANT)  # ggml block types the kernels read as stored
DTYPES = ("float32", "float16", "q8_0")
DEFAULT_CTX = 8192  # positions per sequence unless n_ctx says (each sequence's KV cache holds this many)
Progress = Callable[[str, int, int], None]  # (tensor name, bytes done, bytes in all)


def check_dtype(dtype: Any) -> str | None:
    """A load dtype's canonical name: None (as stored), "float32", "float16" or "q8_0" ("int8" is q8_0)."""
    if dtype is None or dtype == "auto":
        return None
    name = getattr(dtype, "name", dtype)
    if isinstance(name, str) and name.lower() in ("int8", "q8_0"):
        return "q8_0"
    if name not in ("float32", "float16"):
        raise CheckpointError(f"model dtype must be float32, float16, q8_0 (int8) or None (as stored), got {dtype!r}")
    return str(name)


@dataclass
class Checkpoint:
    """An opened source: the family, its config, tokenizer and chat template, and its tensors by canonical name
    (`shape` in the stored layout, `stored_type` the ggml / safetensors type, `raw` the stored bytes)."""

    family: Family
    config: Any
    tokenizer: Any
    chat_template: str | None
    eos_ids: frozenset[int]
    where: str
    name: str
    names: set[str]
    shape: Callable[[str], tuple[int, ...]]
    stored_type: Callable[[str], str]
    raw: Callable[[str], memoryview]
    gguf: bool  # stored in GGUF's layout: every matrix (N, K)
    # release(name, a, b): bytes a..b of `raw(name)` are on the device, their file pages may go (None: not mapped)
    release: Callable[[str, int, int], None] | None = None

    def hf_shape(self, name: str, spec: TensorSpec) -> tuple[int, ...]:
        shape = tuple(self.shape(name))
        return shape[::-1] if self.gguf and spec.kind == "conv1d" else shape

    def array(self, name: str) -> Any:
        """Tensor `name` as a numpy array in the Hugging Face layout: float16 where stored so, float32 otherwise
        (quantized tensors dequantized). For comparisons and exports; the loader itself never needs it."""
        import numpy as np

        t, shape, raw = self.stored_type(name), tuple(self.shape(name)), self.raw(name)
        if t == "F16":
            arr = np.frombuffer(raw, "<f2").reshape(shape)
        elif t in QUANT_TYPES:
            arr = np.frombuffer(_dequantized(t, raw, shape), "<f4").reshape(shape)
        else:
            arr = np.frombuffer(float32_bytes(t, raw), "<f4").reshape(shape)
        spec = self.family.tensors(self.config).get(name)
        return np.ascontiguousarray(arr.T) if self.gguf and spec is not None and spec.kind == "conv1d" else arr.copy()


# -- sources ------------------------------------------------------------------------------------------------
def open_checkpoint(source: Any = None, reader: str = "auto") -> Checkpoint:
    """Open and check `source` (None: the model that ships with webtensor; a directory; a .gguf file; an id in the
    local Hugging Face cache). `reader` "pure" reads with the pure-Python readers (the page's)."""
    gguf_file = find_gguf(source)
    ck = _open_gguf(gguf_file, reader) if gguf_file is not None else _open_hf(resolve(source), reader, source)
    _check_tensors(ck)
    return ck


def _open_hf(d: Path, reader: str, source: Any) -> Checkpoint:
    path = d / "config.json"
    raw = read_json_object(path, missing="a checkpoint directory needs config.json")
    family = registry.for_hf(raw.get("model_type"), str(path))
    cfg = family.config_from_hf(raw, str(path))
    from ..text.tokenizer import GPT2Tokenizer

    tok = GPT2Tokenizer.from_dir(d, native=None if reader == "auto" else reader != "pure")
    gen_path = d / "generation_config.json"
    gen = read_json_object(gen_path, missing=None)
    eos = set(cfg.spec.eos_ids) | set(token_ids(gen.get("eos_token_id"), "eos_token_id", str(gen_path)))
    st = SafetensorsReader(weight_files(d), family.canonical, pure=None if reader == "auto" else reader == "pure")
    name = "webtensor-shipped" if source is None else str(source)
    return Checkpoint(family, cfg, tok, find_chat_template(d), frozenset(eos), str(d), name, st.names(), st.shape,
                      st.dtype, st.raw, gguf=False, release=st.release)


def _open_gguf(path: Path, reader: str) -> Checkpoint:
    f = GGUFCheckpoint(path, reader)
    where = str(path)
    family = registry.for_gguf(f.architecture, where)
    cfg = family.config_from_gguf(f.metadata, list(f.tensors), where)
    by_gguf = {g: c for c, g in family.gguf_names(cfg).items()}
    by_gguf.setdefault("output.weight", "lm_head.weight")  # (a tied model's stored copy of its head)
    names: dict[str, str] = {}
    for g in f.tensors:
        c = by_gguf.get(g)
        if c is None:
            raise CheckpointError(f"{where}: tensor {g!r} is not part of a {cfg.spec.architecture} model")
        names[c] = g
    tok = _gguf_tokenizer(f.metadata, cfg.spec.vocab_size, f"{path} (tokenizer metadata)", reader)
    return Checkpoint(family, cfg, tok, find_chat_template(f.metadata), cfg.spec.eos_ids, where,
                      str(path), set(names), lambda n: f.tensors[names[n]].shape,
                      lambda n: f.tensors[names[n]].type_name, lambda n: f.raw(names[n]), gguf=True,
                      release=lambda n, a, b: f.release(names[n], a, b))


def _gguf_name_of(ck: Checkpoint, name: str) -> str:
    if not ck.gguf:
        return name
    return ck.family.gguf_names(ck.config).get(name, "output.weight" if name == "lm_head.weight" else name)


def _check_tensors(ck: Checkpoint) -> None:
    """Every expected tensor present with its shape and a type the kernels read; nothing unexpected; a tied head
    stored apart equal to the embedding; the tokenizer's ids within the embedding."""
    spec = ck.config.spec
    if spec.n_layer > len(ck.names):  # (before the expected tensors are listed: a config may say 10**9 layers)
        raise CheckpointError(f"{ck.where}: the config says {spec.n_layer} layers, but the checkpoint holds only "
                              f"{len(ck.names)} tensors")
    specs = ck.family.tensors(ck.config)

    def missing() -> None:
        for name in specs:
            if name not in ck.names:
                shown = f"{name!r} ({_gguf_name_of(ck, name)})" if ck.gguf else repr(name)
                raise CheckpointError(f"{ck.where}: tensor {shown} is missing from the checkpoint")
    if ck.gguf:  # (a GGUF file's tensors are named by the file's names; the family's checks name its own)
        missing()
    ck.family.check(ck.config, {n: ck.hf_shape(n, specs.get(n, TensorSpec((), "linear"))) for n in ck.names},
                    ck.where)
    missing()
    for name, spec in specs.items():
        shown = _gguf_name_of(ck, name)
        got = ck.hf_shape(name, spec)
        if got != spec.shape:
            raise CheckpointError(f"{ck.where}: tensor {shown!r} has shape {tuple(ck.shape(name))}, expected "
                                  f"{spec.shape[::-1] if ck.gguf and spec.kind == 'conv1d' else spec.shape} "
                                  "from the config")
        t = ck.stored_type(name)
        readable = FLOAT_TYPES + ("F64",) + (QUANT_TYPES if spec.kind != "float32" else ())
        if t not in readable:
            raise CheckpointError(f"{ck.where}: tensor {shown!r} is stored as {t}; webtensor reads "
                                  f"{', '.join(readable)} there")
    tied = "lm_head.weight" not in specs
    extra = sorted(n for n in ck.names if n not in specs and not (tied and n == "lm_head.weight"))
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise CheckpointError(f"{ck.where}: the checkpoint holds tensors a {ck.config.spec.architecture} model does "
                              f"not have: {', '.join(map(repr, extra[:3]))}{more}")
    embed = next(n for n, s in specs.items() if s.kind == "embedding")
    if tied and "lm_head.weight" in ck.names and ck.stored_type("lm_head.weight") == ck.stored_type(embed) \
            and bytes(ck.raw("lm_head.weight")) != bytes(ck.raw(embed)):
        raise CheckpointError(f"{ck.where}: tie_word_embeddings = true, but the checkpoint's "
                              f"{_gguf_name_of(ck, 'lm_head.weight')} differs from {_gguf_name_of(ck, embed)}: the "
                              "config ties the LM head to the token embedding; set tie_word_embeddings to false to "
                              "use it")
    n_tok = getattr(ck.tokenizer, "vocab_size", 0)
    if n_tok > ck.config.spec.vocab_size:
        raise CheckpointError(f"{ck.where}: the tokenizer has {n_tok} token ids but config.json's vocab_size = "
                              f"{ck.config.spec.vocab_size}: ids {ck.config.spec.vocab_size}.. would have no "
                              "embedding row")


# -- upload -------------------------------------------------------------------------------------------------
STREAM_PIECES = 32  # a load writes its largest tensor in about this many pieces (see `upload`)
PIECE_RANGE = (256 << 10, 32 << 20)  # ... of at least 256 KiB and at most 32 MiB


def upload(ck: Checkpoint, device: Any, dtype: str | None, progress: Progress | bool | None = None) -> dict[str, Any]:
    """The checkpoint's weights on `device` by canonical name (fused names where parts were fused).

    Streamed, tensor by tensor and piece by piece, from the file's map: on a WebGPU device each tensor goes in
    pieces of about 1/32 of the file's largest tensor (`STREAM_PIECES`, `PIECE_RANGE`), the writes' staging copies
    are bounded to two pieces (`WgpuContext.upload`), and a piece's pages of the map leave the process once it is on
    its way (`Checkpoint.release`; float tensors converted or copied on the host, theirs once read). So the host
    holds, beyond the runtime, a few pieces and the one tensor a conversion makes (a float type converted, a fused
    q/k/v): never the file, never the model (tools/load_memory.py measures it). The CPU device keeps quantized
    blocks as views of the map, as llama.cpp does on the CPU."""
    specs = ck.family.tensors(ck.config)
    groups = {parts[0]: (fused, parts) for fused, parts in ck.family.fusions(ck.config)
              if len({ck.stored_type(p) for p in parts}) == 1}  # (parts stored alike: one matrix)
    later = {p for _, parts in groups.values() for p in parts[1:]}
    sizes = {n: stored_nbytes(ck.stored_type(n), ck.shape(n)) for n in specs}
    report = _progress(progress, sum(sizes.values()), ck.name)
    done = 0
    params: dict[str, Any] = {}
    mapped = ck.release is not None
    piece = min(max(max(sizes.values(), default=0) // STREAM_PIECES, PIECE_RANGE[0]), PIECE_RANGE[1]) & ~4095
    staging = getattr(device.ctx, "upload_pieces", None)
    try:
        with staging(piece) if staging is not None else contextlib.nullcontext():
            for name, spec in specs.items():
                if name in later:
                    continue
                fused, parts = groups.get(name, (name, (name,)))
                if len(parts) == 1:
                    raw, stored, shape = ck.raw(name), ck.stored_type(name), tuple(ck.shape(name))
                else:  # rows of (N_i, K) matrices (or vectors) one after another: one (sum N_i, K) matrix
                    f32 = spec.kind == "float32"
                    raw = memoryview(b"".join(float32_bytes(ck.stored_type(p), ck.raw(p)) if f32 else ck.raw(p)
                                              for p in parts))  # (one copy: join takes the views as they are)
                    stored = "F32" if f32 else ck.stored_type(name)
                    shape = (sum(ck.shape(p)[0] for p in parts), *ck.shape(name)[1:])
                    if mapped:  # (the parts' bytes are in the joined copy now)
                        for p in parts:
                            ck.release(p, 0, sizes[p])  # type: ignore[misc]
                on_way = _on_its_way(ck, name, done, report) if mapped and len(parts) == 1 else None
                params[fused] = _upload_one(raw, stored, shape, spec, ck.gguf, device, dtype, on_way)
                done += sum(sizes[p] for p in parts)
                report(name, done)
    finally:
        report(None, done)
    return params


def _on_its_way(ck: Checkpoint, name: str, before: int, report: Callable[[str | None, int], None]
                ) -> Callable[[int, int], None]:
    """What to do as bytes a..b of tensor `name` reach the device: drop their pages of the map, move the bar."""
    release = ck.release
    assert release is not None

    def on_way(a: int, b: int) -> None:
        release(name, a, b)
        report(name, before + b)
    return on_way


def stored_nbytes(t: str, shape: tuple[int, ...]) -> int:
    from ..formats.gguf_pure import GGML_TYPES

    n = math.prod(shape)
    if t == "F64":
        return n * 8
    for name, per_block, nbytes in GGML_TYPES.values():
        if name == t:
            return n // per_block * nbytes
    return n * 4


def _upload_one(raw: memoryview, stored: str, shape: tuple[int, ...], spec: TensorSpec, gguf: bool, device: Any,
                dtype: str | None, on_way: Callable[[int, int], None] | None = None) -> Any:
    """One tensor from its stored bytes (`shape` in the stored layout) to what the family's forward takes;
    `on_way(a, b)` once bytes a..b of `raw` are copied where they go or read into a conversion (not called for
    what keeps viewing them: the CPU device's quantized blocks)."""
    n_stored = raw.nbytes

    def read_whole() -> None:  # (a conversion has read all the stored bytes: they may go)
        if on_way is not None:
            on_way(0, n_stored)
    if spec.kind == "float32":
        t = from_buffer(float32_bytes(stored, raw), shape, dt.float32, device)
        read_whole()
        return t
    if stored in QUANT_TYPES:
        if dtype in ("float32", "float16"):  # asked for floats: dequantized
            raw, stored = _dequantized(stored, raw, shape), "F32"
            read_whole()
            on_way = None  # (what follows reads the dequantized copy, not the file)
        else:
            return _quantized(device, stored, raw, shape, on_way)
    # a float matrix or embedding: (N, K) or (V, C) in the stored layout, but GPT-2's Conv1D from safetensors (K, N)
    nk = spec.kind != "conv1d" or gguf
    if dtype == "q8_0":
        t = _quantize_q8(device, float32_bytes(stored, raw), shape, transpose=not nk)
        read_whole()
        return t
    keep_f16 = stored == "F16" and device.has_f16 and not device.backend.widens_f16
    want = dt.float16 if (dtype == "float16" or (dtype is None and keep_f16)) else dt.float32
    if want is dt.float16 and not device.has_f16:
        raise CheckpointError(f"{device.describe()} has no shader-f16 feature: use dtype float32")
    kmajor = device.backend.kmajor_weights
    np: Any
    try:
        import numpy as np
    except ImportError:  # the page: converted and transposed on the device
        np = None
    if np is not None:  # natively on the host (a tensor over the binding limit cannot be rearranged on a device)
        arr = np.frombuffer(raw, "<f2") if stored == "F16" else np.frombuffer(float32_bytes(stored, raw), "<f4")
        arr = arr.reshape(shape).astype(want.name, copy=False)
        if spec.kind != "embedding" and nk != kmajor:  # stored (N, K) where the backend keeps (K, N), or back
            arr = arr.T
        arr = np.ascontiguousarray(arr)
        # (writeable: a fresh array the reader made for this tensor, or our own copy, kept as it is on the CPU;
        # read-only: a file map, copied)
        view = np.may_share_memory(arr, np.frombuffer(raw, np.uint8))
        if not view:
            read_whole()
        t = device.backend.from_numpy(device, arr, arr.flags.writeable, on_way if view else None)
        return t if spec.kind == "embedding" or not kmajor else t.T
    if stored == "F16" and device.has_f16:
        t = from_buffer(raw, shape, dt.float16, device)
    else:
        t = from_buffer(float32_bytes(stored, raw), shape, dt.float32, device)
    if t.dtype is not want:
        t = t.to(want)
    if spec.kind == "embedding":
        return t
    if nk:  # t is (N, K): hand over (K, N)
        return t.T if kmajor else t.T.contiguous()
    return t.T.contiguous().T if kmajor else t  # t is (K, N)


def float32_bytes(stored: str, raw: memoryview) -> memoryview:
    """Float bytes as float32 (numpy where present, else the pure-Python conversions the page uses)."""
    if stored == "F32":
        return raw
    if stored == "BF16":  # a bfloat16 is the top half of a float32
        src = bytes(raw)
        out = bytearray(2 * len(src))
        out[2::4], out[3::4] = src[0::2], src[1::2]
        return memoryview(out)
    try:
        import numpy as np
    except ImportError:
        import array
        import struct

        if stored == "F16":
            return memoryview(array.array("f", struct.unpack(f"<{raw.nbytes // 2}e", raw))).cast("B")
        return memoryview(array.array("f", array.array("d", bytes(raw)))).cast("B")
    src_type = {"F16": "<f2", "F64": "<f8"}.get(stored)
    if src_type is None:
        raise CheckpointError(f"cannot read a {stored} tensor as floats")
    return np.frombuffer(raw, src_type).astype("<f4").data.cast("B")


def _quantized(device: Any, stored: str, raw: memoryview, shape: tuple[int, ...],
               on_way: Callable[[int, int], None] | None = None) -> Any:
    """A quantized (N, K) tensor on `device` from its ggml blocks, kept as they are (on the CPU device a view of
    them: the file's map, like llama.cpp's on the CPU, so `on_way` is not called)."""
    if device.kind == "wgpu":
        from ..backends.wgpu import quant_ops

        return quant_ops.upload_blocks(device, stored, raw, shape, on_way)
    from ..quant import QuantWeight

    return QuantWeight.from_blocks(stored, raw, shape)


def _dequantized(stored: str, raw: memoryview, shape: tuple[int, ...]) -> memoryview:
    from ..quant import QuantWeight

    floats = QuantWeight.from_blocks(stored, raw, shape).dequantize().astype("<f4")
    return memoryview(floats.tobytes())


def _quantize_q8(device: Any, raw32: memoryview, shape: tuple[int, ...], transpose: bool) -> Any:
    """Float32 bytes of a matrix of stored `shape` — (N, K), or (K, N) with `transpose` — quantized to q8_0 in the
    (N, K) layout (ggml's rounding)."""
    import numpy as np

    from ..quant import quantize

    w = np.frombuffer(raw32, "<f4").reshape(shape)
    w = quantize(np.ascontiguousarray(w.T) if transpose else w, "Q8_0")
    if device.kind == "wgpu":
        from ..backends.wgpu import quant_ops

        return quant_ops.upload(device, w)
    return w


def _progress(progress: Progress | bool | None, total: int, label: str) -> Callable[[str | None, int], None]:
    """A reporter: `progress` a callback, or True / None for a tqdm bar (None: only on a terminal), False nothing."""
    if callable(progress):
        return lambda name, done: progress(name, done, total) if name is not None else None
    if progress is False:
        return lambda name, done: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return lambda name, done: None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {label}", leave=False,
               disable=None if progress is None else not progress)
    last = [0]

    def report(name: str | None, done: int) -> None:
        bar.update(done - last[0])
        last[0] = done
        if name is None:
            bar.close()
    return report


# -- small readers ------------------------------------------------------------------------------------------
def _gguf_tokenizer(meta: Mapping[str, Any], vocab_size: int, src: str, reader: str) -> Any:
    """The byte-level BPE a GGUF file's `tokenizer.ggml.*` metadata describes (llama.cpp's meaning of each field)."""
    from ..text.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(meta, src, native=None if reader == "auto" else reader != "pure")
    if tok.vocab_size > vocab_size:
        raise TokenizerError(f"{src}: {tok.vocab_size} tokens but a vocabulary of {vocab_size}")
    return tok



# -- models -------------------------------------------------------------------------------------------------
def load(source: Any = None, device: Any = None, dtype: Any = None, n_ctx: int | None = None,
         progress: Progress | bool | None = None, reader: str = "auto", kv_dtype: str | None = None) -> Any:
    """`webtensor.load_model`: open, check, upload, build."""
    from ..device import Device

    dev = Device.parse(device)
    want = check_dtype(dtype)
    if want == "float16" and not dev.has_f16:
        raise CheckpointError(f"{dev.describe()} has no shader-f16 feature: use dtype float32")
    ck = open_checkpoint(source, reader)
    return build(ck, dev, want, n_ctx, progress, kv_dtype=kv_dtype)


def build(ck: Checkpoint, device: Any, dtype: str | None, n_ctx: int | None = None,
          progress: Progress | bool | None = None, cls: Any = None, kv_dtype: str | None = None) -> Any:
    """A `LanguageModel` (or `cls`) of an opened checkpoint on `device`; `kv_dtype`: its KV cache's type (None: the
    device's default, `models.base.default_kv_dtype`)."""
    from .base import LanguageModel

    spec = ck.config.spec
    ctx = min(spec.n_ctx, DEFAULT_CTX) if n_ctx is None else n_ctx
    if isinstance(ctx, bool) or not isinstance(ctx, int) or not 1 <= ctx <= spec.n_ctx:
        raise CheckpointError(f"n_ctx must be an integer in [1, {spec.n_ctx}] (the model's context), got {n_ctx!r}")
    if kv_dtype is not None:  # (before the upload: a bad one costs nothing)
        from ..runtime.cache import check_kv_dtype

        check_kv_dtype(kv_dtype, spec.head_dim, device.has_f16)
    params = upload(ck, device, dtype, progress)
    weights = ck.family.build(ck.config, params, device, ctx)
    nbytes = sum(getattr(v, "nbytes", 0) for v in {id(v): v for v in params.values()}.values())
    return (cls or LanguageModel)(ck.family, ck.config, weights, device, ctx, tokenizer=ck.tokenizer,
                                  chat_template=ck.chat_template, eos_ids=ck.eos_ids, dtype=dtype, name=ck.name,
                                  weight_bytes=nbytes, params=params, kv_dtype=kv_dtype)


def export_arrays(model: Any) -> dict[str, Any]:
    """A loaded model's weights read back from its device as float32 numpy arrays by canonical name, in the Hugging
    Face checkpoint's layout (each tensor of `Family.tensors`; fused matrices split into their parts, quantized ones
    dequantized, float16 ones widened, and what the family did to a GGUF file's rows undone: `Family.to_hf`): the
    weights HF transformers or a torch re-implementation takes to compute what the model computes."""
    import numpy as np

    fam, cfg, params = model.family, model.config, model.params
    specs = fam.tensors(cfg)
    fused_of = {p: (fused, parts) for fused, parts in fam.fusions(cfg) if fused in params for p in parts}
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        if name in params:
            arr = _hf_array(params[name], spec)
        else:  # a part of a fused matrix (rows) or vector: its rows of the whole
            fused, parts = fused_of[name]
            whole = _hf_array(params[fused], spec)  # (sum N_i, K) or (sum N_i,)
            r0 = sum(specs[p].shape[0] for p in parts[:parts.index(name)])
            arr = whole[r0:r0 + spec.shape[0]]
        out[name] = np.ascontiguousarray(fam.to_hf(cfg, name, arr), np.float32)
        if out[name].shape != spec.shape:  # (a defect of this function or of the family's maps, not of the input)
            raise AssertionError(f"export_arrays: {name} came back as {out[name].shape}, expected {spec.shape}")
    return out


def _hf_array(t: Any, spec: TensorSpec) -> Any:
    """One uploaded weight as numpy in the HF layout: quantized (N, K) dequantized; float matrices, handed to the
    family as (K, N) views, turned back to nn.Linear's (N, K) (GPT-2's Conv1D keeps (K, N))."""
    if hasattr(t, "qtype"):  # quant.QuantWeight, or a WebGPU device's upload of one (read back): (N, K)
        w = (t.to_quant_weight() if hasattr(t, "to_quant_weight") else t).dequantize()
        return w.T if spec.kind == "conv1d" else w
    arr = t.numpy()
    return arr.T if spec.kind == "linear" else arr


def from_arrays(family: Family | str, config: Any, arrays: Mapping[str, Any], name: str = "model") -> Checkpoint:
    """A checkpoint of float32 numpy arrays by canonical name (HF layout), without a tokenizer."""
    import numpy as np

    fam = registry.by_name(family) if isinstance(family, str) else family
    data = {k: np.array(v, np.float32, order="C") for k, v in arrays.items()}  # (copies, C-ordered)
    ck = Checkpoint(fam, config, None, None, config.spec.eos_ids, name, name, set(data),
                    lambda n: data[n].shape, lambda n: "F32", lambda n: data[n].data.cast("B"), gguf=False)
    _check_tensors(ck)
    return ck


def random_arrays(family: Family | str, config: Any, seed: int = 0) -> dict[str, Any]:
    """Random float32 weights of a family's shapes: N(0, 0.02) matrices and tables, norm weights 1, biases 0."""
    import numpy as np

    fam = registry.by_name(family) if isinstance(family, str) else family
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in fam.tensors(config).items():
        if spec.kind != "float32" or name.endswith("wpe.weight"):
            out[name] = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(0.02)
        elif name.endswith(".bias"):
            out[name] = np.zeros(spec.shape, np.float32)
        else:
            out[name] = np.ones(spec.shape, np.float32)
    return out


def random(family: str, config: Any, device: Any = None, dtype: Any = None, seed: int = 0,
           n_ctx: int | None = None, kv_dtype: str | None = None) -> Any:
    from ..device import Device

    ck = from_arrays(family, config, random_arrays(family, config, seed), name=f"random-{family}")
    return build(ck, Device.parse(device), check_dtype(dtype), n_ctx, progress=False, kv_dtype=kv_dtype)
