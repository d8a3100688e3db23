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
biases in F32. `q4_k_m` is llama.cpp's mix (`q4_k_m_type`: Q4_K matrices, Q6_K for the output and some attn_v /
ffn_down, Q5_0 / Q8_0 where rows are not whole 256-value blocks); webtensor has no K-quant quantizer (llama.cpp's
searches scales iteratively), so those tensors' blocks come from the caller (`kquant_blocks`: random blocks of the
published shapes for benchmarks, tools/random_checkpoint.py), the others from the package's quantizers.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, CheckpointError

OUTTYPES = {"f32": ("F32", 0), "f16": ("F16", 1), "bf16": ("BF16", 32), "q8_0": ("Q8_0", 7), "q4_0": ("Q4_0", 2),
            "q4_1": ("Q4_1", 3), "q4_k_m": ("Q4_K", 15)}  # -> (ggml type, general.file_type: llama.cpp's LLAMA_FTYPE_*)
KQUANT_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}  # llama.cpp's types for rows that are not whole 256-blocks


def q4_k_m_type(gguf_name: str, n_layer: int, tied: bool) -> str:
    """llama.cpp's choice for a matrix of a Q4_K_M file (llama-quant.cpp): Q6_K for the output (and for the token
    embedding of a model whose LM head reads it), for attn_v and ffn_down of the layers `use_more_bits` picks (the
    first and last eighth, every third between); Q4_K for the rest."""
    if gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight"):
        return "Q6_K"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        i, n = int(parts[1]), n_layer
        if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def write_gguf(model_dir: str | os.PathLike[str], out: str | os.PathLike[str], outtype: str = "q8_0",
               embedding_outtype: str | None = None,
               kquant_blocks: Callable[[str, int, int], Any] | None = None) -> Path:
    """Convert the HF checkpoint in `model_dir` (config.json, *.safetensors, tokenizer) — or any source the loader
    opens: a GGUF file too, its quantized tensors dequantized first — to GGUF file `out`, its matrices in `outtype`
    and its embedding tables (the token embedding, which a tied LM head reads; an untied head) in
    `embedding_outtype` (default: `outtype`; llama.cpp's Q4_1 files of SmolLM2 keep theirs in q8_0).
    `kquant_blocks(ggml type, N, K)`: the blocks (uint8 (N, bytes a row)) of a K-quant matrix, which q4_k_m needs.
    CheckpointError for a bad checkpoint (the loader's checks and messages), ArgumentError for an unknown
    outtype or q4_k_m without `kquant_blocks`."""
    import gguf
    import numpy as np

    from ..models import loader

    for t in (outtype, embedding_outtype or outtype):
        if t not in OUTTYPES:
            raise ArgumentError(f"GGUF outtype must be one of {', '.join(OUTTYPES)}, got {t!r}")
    ggml_type, file_type = OUTTYPES[outtype]
    embedding_type = OUTTYPES[embedding_outtype or outtype][0]
    mix_embedding = (embedding_outtype or outtype) == "q4_k_m"
    if "q4_k_m" in (outtype, embedding_outtype) and kquant_blocks is None:
        raise ArgumentError("GGUF outtype q4_k_m needs llama.cpp's quantizer (llama-quantize); webtensor writes "
                            "K-quant files only from given blocks (kquant_blocks: tools/random_checkpoint.py's random "
                            "ones)")
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
        stacks: dict[str, list[Any]] = {}  # GGUF name -> the arrays written as it (several: a stack of experts)
        kinds: dict[str, str] = {}
        mixed: set[str] = set()  # GGUF names in the Q4_K_M mix, written in its fallback type (not whole blocks)
        for name, tspec in fam.tensors(cfg).items():
            in_mix = mix_embedding if tspec.kind == "embedding" else outtype == "q4_k_m" and tspec.kind != "float32"
            if in_mix and len(tspec.shape) == 2:
                n, k = tspec.shape if tspec.kind != "conv1d" else tspec.shape[::-1]
                t = q4_k_m_type(names[name], cfg.spec.n_layer, tied)
                if k % 256 == 0 and kquant_blocks is not None:  # (the float values are not needed)
                    qtype = getattr(gguf.GGMLQuantizationType, t)
                    data = np.ascontiguousarray(kquant_blocks(t, n, k), np.uint8)
                    w.add_tensor(names[name], data, raw_shape=data.shape, raw_dtype=qtype)
                    continue
            arr = ck.array(name).astype(np.float32, copy=False)  # HF's layout (quantized ones dequantized)
            if tspec.kind == "conv1d":
                arr = arr.T  # HF's Conv1D (K, N) -> (N, K)
            if not ck.gguf:  # (a GGUF source's rows are in llama.cpp's order already)
                arr = fam.to_gguf(cfg, name, arr)
            stacks.setdefault(names[name], []).append(arr)
            kinds[names[name]] = tspec.kind
            if in_mix:
                mixed.add(names[name])
        for gname, arrs in stacks.items():
            # one tensor; or the experts' matrices stacked (E, N, K), as llama.cpp's converter stacks them
            arr = np.ascontiguousarray(arrs[0] if len(arrs) == 1 else np.stack(arrs), np.float32)
            kind = kinds[gname]
            t = "F32" if kind == "float32" else embedding_type if kind == "embedding" else ggml_type
            if gname in mixed:
                t = KQUANT_FALLBACK[q4_k_m_type(gname, cfg.spec.n_layer, tied)]
            if t.startswith("Q") and (arr.ndim not in (2, 3) or arr.shape[-1] % 32):
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
