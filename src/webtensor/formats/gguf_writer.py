"""A Hugging Face checkpoint of any family written as a llama.cpp GGUF file, through the `gguf` package's own
`GGUFWriter` (the inverse of `gguf_reader` + the loader): what `webtensor web` serves the page for dtype int8,
and the GGUF files the tests and benchmarks make from random checkpoints.

Layout (llama.cpp's converter's): every matrix (out, in) = (N, K) — GPT-2's Conv1D matrices transposed —,
embeddings (V, C), a mixture of experts' matrices of one projection stacked (E, N, K) (the family names them
alike), and whatever the family changes on the way (`Family.to_gguf`: llama.cpp permutes the rows of
Q and K of the `llama` architecture); the family's metadata keys (`Family.gguf_metadata`) and the tensors the
converter derives from the config (`Family.gguf_tensors`: llama3's `rope_freqs`), the byte-level BPE
vocabulary (padded to the embedding's rows with [PAD{i}], as llama.cpp's converter pads) and the chat template.
Matrices and embeddings are written in `outtype` (f32, f16, bf16, q8_0, q4_0, q4_1: the `gguf` package's own
quantizers, bit for bit llama.cpp's reference; a matrix whose rows are not whole blocks stays f32 / f16), norms and
biases in F32. `q4_k_m`, `q5_k_m`, `q3_k_m`, `q2_k`, `iq4_nl` and `iq4_xs` are llama.cpp's mixes (`mix_type`, after
llama-quant.cpp's choice per tensor: the mix's type for most matrices, Q6_K for the output, more bits for some
attn_v / ffn_down / attn_output, llama.cpp's fallbacks where rows are not whole 256-value blocks); webtensor has no
K-quant or IQ4 quantizer (llama.cpp's search scales iteratively), so those tensors' blocks come from the caller
(`kquant_blocks`: random blocks of the published shapes for tests and benchmarks, tools/random_checkpoint.py), the
32-value fallbacks (Q5_0, Q5_1, Q8_0) from the package's quantizers. `tensor_types` gives chosen tensors a type of
their own, as llama-quantize's `--tensor-type` does (a file holding every type a test needs, experts included).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, CheckpointError
from ..quant.types import QUANTIZABLE, TYPES

# llama.cpp's mixes: outtype -> (its type for most matrices, general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_*)
MIXES = {"q4_k_m": ("Q4_K", 15), "q5_k_m": ("Q5_K", 17), "q3_k_m": ("Q3_K", 12), "q2_k": ("Q2_K", 10),
         "iq4_nl": ("IQ4_NL", 25), "iq4_xs": ("IQ4_XS", 30)}
OUTTYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32), "q8_0": ("Q8_0", 7), "q4_0": ("Q4_0", 2),
            "q4_1": ("Q4_1", 3), **MIXES}  # -> (ggml type, general.file_type: llama.cpp's LLAMA_FTYPE_*)
# llama.cpp's types for rows that are not whole 256-value blocks (llama-quant.cpp)
FLOATS = ("F32", "F16", "BF16")  # the float types a tensor_types pattern may ask for
KQUANT_FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1",
                   "Q6_K": "Q8_0"}


def mix_type(mix: str, gguf_name: str, n_layer: int, tied: bool, n_gqa: int = 1) -> str:
    """llama.cpp's type for matrix `gguf_name` of a file in `mix` (a key of MIXES; llama-quant.cpp's
    llama_tensor_get_type for a dense model): Q6_K for the output (and for the token embedding of a model whose LM
    head reads it); attn_v: Q6_K in the layers `use_more_bits` picks (the first and last eighth, every third
    between) for q4_k_m / q5_k_m, Q5_K in layers 0 and 1 else Q4_K for q3_k_m, Q4_K (n_gqa >= 4) or Q3_K for q2_k,
    Q5_K for iq4_nl / iq4_xs where n_gqa >= 4; ffn_down: Q6_K where `use_more_bits` for q4_k_m / q5_k_m, Q5_K in
    the first sixteenth of the layers else Q4_K for q3_k_m, Q3_K for q2_k; attn_output: Q4_K for q3_k_m, Q3_K for
    q2_k; the mix's type for the rest."""
    base = MIXES[mix][0]
    if gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight"):
        return "Q6_K"
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk":
        return base
    i, n, kind = int(parts[1]), n_layer, parts[2]
    more_bits = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
    if kind == "attn_v":
        if mix in ("q4_k_m", "q5_k_m"):
            return "Q6_K" if more_bits else base
        if mix == "q3_k_m":
            return "Q5_K" if i < 2 else "Q4_K"
        if mix == "q2_k":
            return "Q4_K" if n_gqa >= 4 else "Q3_K"
        return "Q5_K" if n_gqa >= 4 else base
    if kind == "ffn_down":
        if mix in ("q4_k_m", "q5_k_m"):
            return "Q6_K" if more_bits else base
        if mix == "q3_k_m":
            return "Q5_K" if i < n // 16 else "Q4_K"
        return "Q3_K" if mix == "q2_k" else base
    if kind == "attn_output":
        return {"q3_k_m": "Q4_K", "q2_k": "Q3_K"}.get(mix, base)
    return base


def write_gguf(model_dir: str | os.PathLike[str], out: str | os.PathLike[str], outtype: str = "q8_0",
               embedding_outtype: str | None = None,
               kquant_blocks: Callable[[str, int, int], Any] | None = None,
               tensor_types: Mapping[str, str] | None = None) -> Path:
    """Convert the HF checkpoint in `model_dir` (config.json, *.safetensors, tokenizer) — or any source the loader
    opens: a GGUF file too, its quantized tensors dequantized first — to GGUF file `out`, its matrices in `outtype`
    and its embedding tables (the token embedding, which a tied LM head reads; an untied head) in
    `embedding_outtype` (default: `outtype`; llama.cpp's Q4_1 files of SmolLM2 keep theirs in q8_0).
    `kquant_blocks(ggml type, N, K)`: the blocks (uint8 (N, bytes a row)) of a K-quant or IQ4 matrix, which the
    mixes need. `tensor_types` (as llama-quantize's `--tensor-type PATTERN=TYPE`): a matrix or embedding whose GGUF
    name a PATTERN (a regular expression) is found in takes that ggml type (the first that matches) instead of the
    outtype's or the mix's, llama.cpp's fallback applying where its rows are not whole 256-value blocks.
    CheckpointError for a bad checkpoint (the loader's checks and messages), ArgumentError for an unknown outtype
    or tensor type, a bad pattern, or a K-quant or IQ4 type without `kquant_blocks`."""
    import gguf
    import numpy as np

    from ..models import loader

    for t in (outtype, embedding_outtype or outtype):
        if t not in OUTTYPES:
            raise ArgumentError(f"GGUF outtype must be one of {', '.join(OUTTYPES)}, got {t!r}")
    ggml_type, file_type = OUTTYPES[outtype]
    embedding_type = OUTTYPES[embedding_outtype or outtype][0]
    mix = next((t for t in (outtype, embedding_outtype) if t in MIXES), None)
    mix_embedding = (embedding_outtype or outtype) in MIXES
    overrides = _tensor_types(tensor_types or {})
    if kquant_blocks is None and any(t not in QUANTIZABLE + FLOATS for _, t in overrides):
        raise ArgumentError("K-quant and IQ4 tensor types need their blocks from the caller (kquant_blocks)")
    if mix is not None and kquant_blocks is None:
        raise ArgumentError(f"GGUF outtype {mix} needs llama.cpp's quantizer (llama-quantize); webtensor writes "
                            "K-quant and IQ4 files only from given blocks (kquant_blocks: tools/random_checkpoint.py's "
                            "random ones)")
    ck = loader.open_checkpoint(model_dir)
    fam, cfg, spec = ck.family, ck.config, ck.config.spec
    w = gguf.GGUFWriter(str(out), fam.gguf_architecture(cfg))
    try:
        w.add_name(Path(model_dir).name)
        w.add_file_type(file_type)
        for key, value in fam.gguf_metadata(cfg).items():
            add_value(w, key, value)
        _add_tokenizer(w, ck.tokenizer, spec.vocab_size, ck.eos_ids, spec.bos_id)
        if ck.chat_template:
            w.add_chat_template(ck.chat_template)
        names = fam.gguf_names(cfg)
        tied = "output.weight" not in names.values()
        gqa = spec.n_head // max(spec.n_kv_head, 1)
        stacks: dict[str, list[Any]] = {}  # GGUF name -> the arrays written as it (several: a stack of experts)
        kinds: dict[str, str] = {}
        chosen: dict[str, str] = {}  # GGUF name -> its type by the mix or tensor_types ("" where the outtype decides)
        given: set[str] = set()  # GGUF names whose arrays are kquant_blocks' blocks of their chosen type
        for name, tspec in fam.tensors(cfg).items():
            gname = names[name]
            in_mix = mix_embedding if tspec.kind == "embedding" else outtype in MIXES and tspec.kind != "float32"
            t = ""
            if in_mix and mix is not None and len(tspec.shape) == 2:
                t = mix_type(mix, gname, spec.n_layer, tied, gqa)
            if tspec.kind != "float32":
                t = next((forced for pattern, forced in overrides if pattern.search(gname)), t)
            kinds[gname] = tspec.kind
            if t and len(tspec.shape) == 2:
                n, k = tspec.shape if tspec.kind != "conv1d" else tspec.shape[::-1]
                t = t if k % 256 == 0 else KQUANT_FALLBACK.get(t, t)
                if t in TYPES and t not in QUANTIZABLE and k % TYPES[t].values == 0 and kquant_blocks is not None:
                    # (N, bytes a row); the float values are not needed
                    stacks.setdefault(gname, []).append(np.ascontiguousarray(kquant_blocks(t, n, k), np.uint8))
                    chosen[gname] = t
                    given.add(gname)
                    continue
            arr = ck.array(name).astype(np.float32, copy=False)  # HF's layout (quantized ones dequantized)
            if tspec.kind == "conv1d":
                arr = arr.T  # HF's Conv1D (K, N) -> (N, K)
            if not ck.gguf:  # (a GGUF source's rows are in llama.cpp's order already)
                arr = fam.to_gguf(cfg, name, arr)
            stacks.setdefault(gname, []).append(arr)
            chosen[gname] = t
        for gname, arrs in stacks.items():
            # one tensor; or the experts' matrices stacked (E, N, K), as llama.cpp's converter stacks them
            if gname in given:  # the caller's blocks, (rows, bytes a row) or (E, rows, bytes a row)
                data = arrs[0] if len(arrs) == 1 else np.stack(arrs)
                w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=getattr(gguf.GGMLQuantizationType,
                                                                                 chosen[gname]))
                continue
            arr = np.ascontiguousarray(arrs[0] if len(arrs) == 1 else np.stack(arrs), np.float32)
            kind, t = kinds[gname], chosen[gname]
            if not t:
                t = "F32" if kind == "float32" else embedding_type if kind == "embedding" else ggml_type
            whole_blocks = arr.ndim in (2, 3) and arr.shape[-1] % 32 == 0
            if t not in FLOATS and (t not in QUANTIZABLE or not whole_blocks):
                t = "F32"  # (rows that are not whole blocks)
            if t == "F32":
                w.add_tensor(gname, arr)
            elif t == "F16":
                w.add_tensor(gname, arr.astype(np.float16))
            else:  # the quantized types and BF16: the package's bytes, (rows, bytes a row)
                qtype = getattr(gguf.GGMLQuantizationType, t)
                data = gguf.quants.quantize(arr, qtype)
                w.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=qtype)
        for gname, values in fam.gguf_tensors(cfg).items():  # (what the converter derives from the config)
            w.add_tensor(gname, np.asarray(values, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return Path(out)


def _tensor_types(patterns: Mapping[str, str]) -> list[tuple[re.Pattern[str], str]]:
    """`write_gguf`'s tensor_types compiled: [(pattern, ggml type)]; ArgumentError naming a bad one."""
    out = []
    for pattern, qtype in patterns.items():
        t = str(qtype).upper()
        if t not in TYPES and t not in FLOATS:
            raise ArgumentError(f"tensor type {pattern}={qtype}: not one of {', '.join((*FLOATS, *TYPES))}")
        try:
            out.append((re.compile(pattern), t))
        except re.error as e:
            why = f"the pattern is not a regular expression ({e})"
            raise ArgumentError(f"tensor type {pattern}={qtype}: {why}") from None
    return out


def add_value(w: Any, key: str, value: Any) -> None:
    """Metadata `key` = `value` on GGUFWriter `w`, typed by the Python value: bool, uint32, float32, string, or an
    array of the items of any other iterable."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def _add_tokenizer(w: Any, tok: Any, vocab_size: int, eos: frozenset[int], bos: int | None) -> None:
    """tokenizer.ggml.*: llama.cpp's converter's keys for the tokenizer (`text.tokenizer_files`), and the config's
    EOS / BOS ids where the tokenizer names none."""
    from ..text.tokenizer_files import gguf_tokenizer_metadata

    meta = gguf_tokenizer_metadata(tok.spec, vocab_size)
    if eos:
        meta.setdefault("tokenizer.ggml.eos_token_id", min(eos))
    if bos is not None:
        meta.setdefault("tokenizer.ggml.bos_token_id", bos)
    for key, value in meta.items():
        add_value(w, key, value)


def gguf_bytes(model_dir: str | os.PathLike[str], outtype: str = "q8_0") -> bytes:
    """`write_gguf` into memory: the GGUF file's bytes (written to a temporary file, then read)."""
    with tempfile.TemporaryDirectory(prefix="webtensor-gguf-") as td:
        path = write_gguf(model_dir, Path(td) / f"model.{outtype}.gguf", outtype)
        try:
            return path.read_bytes()
        except OSError as e:  # pragma: no cover - the temporary folder vanished
            raise CheckpointError(f"the GGUF file written for {model_dir} could not be read back: {e}") from e
