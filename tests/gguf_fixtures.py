"""GGUF files of a Hugging Face GPT-2 checkpoint, written with the `gguf` package's own GGUFWriter
the way llama.cpp's convert_hf_to_gguf.py lays them out: block matrices transposed to (out, in),
1-D tensors and the position embedding in F32, the other matrices in the chosen type (quantized by
`gguf.quants`, not by webtensor), a copy of token_embd as `output`, the vocabulary padded to the
model's size with [PAD{i}] tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
         "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
TOP = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm"}


def gguf_name(hf: str) -> str:
    stem, kind = hf.rsplit(".", 1)
    if stem in TOP:
        return f"{TOP[stem]}.{kind}"
    _, n, rest = stem.split(".", 2)
    return f"blk.{n}.{BLOCK[rest]}.{kind}"


def hf_tensors(d: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for k, v in load_file(str(d / "model.safetensors")).items():
        k = k.removeprefix("transformer.")
        if k.endswith((".attn.bias", ".attn.masked_bias")) or k.startswith("lm_head"):
            continue
        out[k] = v.astype(np.float32)
    return out


def write_gguf(d: Path, out: Path, outtype: str = "f32", *, metadata: dict[str, Any] | None = None,
               skip: tuple[str, ...] = (), extra: dict[str, np.ndarray] | None = None) -> Path:
    """Convert HF checkpoint `d` to `out` (outtype "f32", "f16", "q8_0", "q4_0", "q5_0", or "i8" that webtensor
    refuses). `metadata` overrides or adds keys (a value None drops the key); tensors named in
    `skip` are left out, those in `extra` (GGUF name -> float32 array) added in F32."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    cfg = json.loads((d / "config.json").read_text())
    tj = json.loads((d / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(str(out), "gpt2")
    C, V = cfg["n_embd"], cfg["vocab_size"]
    kv: dict[str, Any] = {
        "gpt2.block_count": cfg["n_layer"], "gpt2.context_length": cfg["n_positions"],
        "gpt2.embedding_length": C, "gpt2.feed_forward_length": 4 * C,
        "gpt2.attention.head_count": cfg["n_head"], "gpt2.attention.layer_norm_epsilon": cfg["layer_norm_epsilon"],
        "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2, "q5_0": 8, "i8": 0}[outtype],
    }
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    by_id.update(special)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(V)]
    types = [3 if i in special else (1 if i in by_id else 5) for i in range(V)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    kv.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
               "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
               "tokenizer.ggml.bos_token_id": cfg["bos_token_id"], "tokenizer.ggml.eos_token_id": cfg["eos_token_id"]})
    kv.update(metadata or {})
    writers = {"gpt2.block_count": w.add_block_count, "gpt2.context_length": w.add_context_length,
               "gpt2.embedding_length": w.add_embedding_length, "gpt2.feed_forward_length": w.add_feed_forward_length,
               "gpt2.attention.head_count": w.add_head_count, "gpt2.attention.layer_norm_epsilon": w.add_layer_norm_eps,
               "general.file_type": w.add_file_type, "tokenizer.ggml.model": w.add_tokenizer_model,
               "tokenizer.ggml.pre": w.add_tokenizer_pre, "tokenizer.ggml.tokens": w.add_token_list,
               "tokenizer.ggml.token_type": w.add_token_types, "tokenizer.ggml.merges": w.add_token_merges,
               "tokenizer.ggml.bos_token_id": w.add_bos_token_id, "tokenizer.ggml.eos_token_id": w.add_eos_token_id}
    for key, value in kv.items():
        if value is None:
            continue
        if key in writers and key not in (metadata or {}):
            writers[key](value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, value)

    def add(name: str, arr: np.ndarray) -> None:
        if name in skip:
            return
        if arr.ndim == 1 or name.startswith("position_embd") or outtype == "f32":
            w.add_tensor(name, arr.astype(np.float32))
        elif outtype == "f16":
            w.add_tensor(name, arr.astype(np.float16))
        elif outtype == "i8":
            w.add_tensor(name, np.clip(arr * 100, -127, 127).astype(np.int8))
        else:
            qtype = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q5_0": Q.Q5_0}[outtype]
            data = gguf.quants.quantize(arr, qtype)
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    for hf, arr in hf_tensors(d).items():
        g = gguf_name(hf)
        add(g, np.ascontiguousarray(arr.T) if arr.ndim == 2 and g.startswith("blk.") else arr)  # to (out, in)
        if g == "token_embd.weight":
            add("output.weight", arr)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_gguf_metadata(path: Path, meta: dict[str, Any], arch: str = "llama") -> Path:
    """A GGUF file holding only metadata (no tensors): what a tokenizer or config reader needs."""
    import gguf

    from webtensor.formats.gguf_writer import add_value

    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if key != "general.architecture":
            add_value(w, key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
