"""A Hugging Face GPT-2 checkpoint written as a llama.cpp GGUF file, through the `gguf` package's
own `GGUFWriter` (the inverse of `gguf_reader`): what `webtensor web` serves the page for
dtype int8, a download of about 0.27x the float32 checkpoint.

Layout (llama.cpp's, as `gguf_reader` reads it): the four block matrices transposed to (out, in) =
(N, K), wte as (V, C); with outtype "q8_0" those five kinds of matrix are Q8_0, quantized by
`webtensor.quant` exactly as `GPT2.from_pretrained(..., dtype="int8")` quantizes the
safetensors at load (bit for bit ggml's reference), so the file holds the very weights of the
native int8 model; layer norms, biases and the position embedding F32 (the tensors int8 keeps in
float). An untied LM head is written as `output.weight` in F32 (int8 keeps it float too). The
metadata carries the hyper-parameters and the byte-level BPE vocabulary (tokens padded to the
embedding's rows with [PAD{i}], as llama.cpp's converter pads), so the file stands alone:
`webtensor generate -m FILE.gguf` reads it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import ArgumentError, CheckpointError
from ..models.gpt2.config import GPT2Config
from ..models.gpt2.quantized import Int8Reader, held_in_q8
from ..models.gpt2.weights import SafetensorsReader, check_checkpoint, check_tokenizer, expected_shapes, weight_files
from ..quant.weight import QuantWeight
from ..text.tokenizer import GPT2Tokenizer
from .gguf_reader import TOKEN_CONTROL, TOKEN_USER_DEFINED, gguf_name

OUTTYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # general.file_type: llama.cpp's LLAMA_FTYPE_*
TOKEN_NORMAL, TOKEN_UNUSED = 1, 5  # llama.cpp's token types (control and user-defined: gguf_reader's)


def write_gpt2(model_dir: str | os.PathLike, out: str | os.PathLike, outtype: str = "q8_0") -> Path:
    """Convert the HF GPT-2 checkpoint in `model_dir` (config.json, *.safetensors, tokenizer) to
    GGUF file `out`; outtype "q8_0", "f16" or "f32" for the matrices. CheckpointError for a bad
    checkpoint (the loader's checks and messages), ArgumentError for an unknown outtype."""
    import gguf
    from gguf import GGMLQuantizationType

    if outtype not in OUTTYPES:
        raise ArgumentError(f"GGUF outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    d = Path(model_dir)
    cfg = GPT2Config.from_file(d / "config.json")
    tok = GPT2Tokenizer.from_dir(d)
    check_tokenizer(cfg, tok.vocab_size, d)
    reader = SafetensorsReader(weight_files(d))
    check_checkpoint(reader, cfg, d)
    quant = Int8Reader(reader) if outtype == "q8_0" else reader
    w = gguf.GGUFWriter(str(out), "gpt2")
    try:
        w.add_name(d.name)
        w.add_block_count(cfg.n_layer)
        w.add_context_length(cfg.n_positions)
        w.add_embedding_length(cfg.n_embd)
        w.add_feed_forward_length(cfg.inner_dim)
        w.add_head_count(cfg.n_head)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
        w.add_file_type(OUTTYPES[outtype])
        _add_tokenizer(w, tok, cfg)
        names = list(expected_shapes(cfg))
        if not cfg.tie_word_embeddings:
            names.append("lm_head.weight")
        for name in names:
            value = quant.get(name) if held_in_q8(name) else reader.get(name)
            if isinstance(value, QuantWeight):  # (N, K) already
                blocks = value.to_blocks()
                w.add_tensor(gguf_name(name), blocks, raw_shape=blocks.shape,
                             raw_dtype=GGMLQuantizationType[value.qtype])
                continue
            arr = np.asarray(value, np.float32)
            if arr.ndim == 2 and name.startswith("h."):
                arr = np.ascontiguousarray(arr.T)  # HF's Conv1D (K, N) -> (N, K)
            if outtype == "f16" and held_in_q8(name):
                arr = arr.astype(np.float16)
            w.add_tensor(gguf_name(name), arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return Path(out)


def _add_tokenizer(w: object, tok: GPT2Tokenizer, cfg: GPT2Config) -> None:
    """tokenizer.ggml.*: the vocabulary in id order (padded to cfg.vocab_size), merges, token types."""
    spec = tok.spec
    tokens = [spec.token_of(i) for i in range(cfg.vocab_size)]
    special = spec.special_ids
    added = {t.id for t in spec.added_tokens}
    types = [TOKEN_UNUSED if t is None else TOKEN_CONTROL if i in special else
             TOKEN_USER_DEFINED if i in added else TOKEN_NORMAL for i, t in enumerate(tokens)]
    w.add_tokenizer_model("gpt2")  # type: ignore[attr-defined]
    w.add_tokenizer_pre("gpt-2")  # type: ignore[attr-defined]
    w.add_token_list([f"[PAD{i}]" if t is None else t for i, t in enumerate(tokens)])  # type: ignore[attr-defined]
    w.add_token_types(types)  # type: ignore[attr-defined]
    w.add_token_merges([f"{a} {b}" for a, b in spec.merges])  # type: ignore[attr-defined]
    eos = sorted(cfg.eos_ids)
    if eos:
        w.add_eos_token_id(eos[0])  # type: ignore[attr-defined]
    if cfg.bos_token_id is not None:
        w.add_bos_token_id(cfg.bos_token_id)  # type: ignore[attr-defined]


def gpt2_gguf_bytes(model_dir: str | os.PathLike, outtype: str = "q8_0") -> bytes:
    """`write_gpt2` into memory: the GGUF file's bytes (written to a temporary file, then read)."""
    with tempfile.TemporaryDirectory(prefix="webtensor-gguf-") as td:
        path = write_gpt2(model_dir, Path(td) / f"model.{outtype}.gguf", outtype)
        try:
            return path.read_bytes()
        except OSError as e:  # pragma: no cover - the temporary folder vanished
            raise CheckpointError(f"the GGUF file written for {model_dir} could not be read back: {e}") from e
