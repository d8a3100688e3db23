"""`LlamaConfig`: the Llama family's hyper-parameters — Llama 2/3.x and SmolLM2 (`llama`), Mistral-style configs
without a sliding window (`mistral`), Qwen2/2.5 (`qwen2`: q/k/v biases) and Qwen3 (`qwen3`: QK-norm, an explicit
head_dim) — read from a Hugging Face config.json (both layouts seen in the wild: top-level `rope_theta` /
`rope_scaling` as published Llama 3.x files have them, and transformers 5's `rope_parameters`) or from GGUF
metadata as llama.cpp's converter writes it: the standard keys through `models.decoder.config`, the family's own
here. What changes the computation and is not supported (another rope type, a sliding window, another
activation, ...) is refused with one line naming the field; keys transformers' own model ignores are ignored
here too. numpy-free (the page).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ..config_reader import JSONConfig
from ..decoder.config import DecoderConfig, gguf_fields, hf_fields
from ..decoder.rope import rope_from_hf

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    FAMILY = "llama"

    qkv_bias: bool = False  # biases on q, k, v (Qwen2; attention_bias in Llama / Qwen3)
    o_bias: bool = False  # a bias on o_proj (attention_bias in Llama / Qwen3)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMS norm over each head of q and k before rope

    @property
    def gguf_architecture(self) -> str:
        """Mistral's is llama's: llama.cpp's converter writes MistralForCausalLM as `llama`."""
        return "llama" if self.architecture == "mistral" else self.architecture

    # -- Hugging Face config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        arch = raw.get("model_type")
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"{where}: model_type {arch!r} is not a Llama-family architecture")
        req = JSONConfig(raw, where, null_as_default=True)
        fields = hf_fields(raw, where, max_positions=2048 if arch == "llama" else 32768,
                           head_dim=128 if arch == "qwen3" else None)  # (transformers' defaults)
        if arch in ("qwen2", "qwen3") and (raw.get("use_sliding_window") or "sliding_attention" in
                                           (raw.get("layer_types") or [])):
            raise CheckpointError(f"{where}: use_sliding_window = true: sliding-window attention is not supported")
        window = req.int("sliding_window", None)
        max_pos = fields["max_position_embeddings"]
        if arch == "mistral" and window is not None and window < max_pos:
            raise CheckpointError(f"{where}: sliding_window = {window}: sliding-window attention is not supported "
                                  f"(max_position_embeddings is {max_pos})")
        # transformers reads attention_bias for llama and qwen3 only (qwen2: q/k/v biases always, none on o_proj;
        # mistral: none), and mlp_bias for llama only: the other architectures ignore the keys, and so does this
        attention_bias = req.bool("attention_bias", False) if arch in ("llama", "qwen3") else False
        mlp_bias = req.bool("mlp_bias", False) if arch == "llama" else False
        cfg = cls(**fields, rope=rope_from_hf(raw, where),
                  qkv_bias=arch == "qwen2" or attention_bias, o_bias=attention_bias, mlp_bias=mlp_bias,
                  qk_norm=arch == "qwen3")
        cfg.check(where)
        return cfg

    # -- GGUF metadata --------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> LlamaConfig:
        arch = meta.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"{where}: general.architecture {arch!r} is not a Llama-family architecture")
        m, fields = gguf_fields(meta, tensor_names, where)
        if m.int("attention.sliding_window", None) is not None:
            raise CheckpointError(f"{where}: {arch}.attention.sliding_window is set: sliding-window attention is "
                                  "not supported")
        names = set(tensor_names)
        cfg = cls(
            **fields,
            rope_interleaved=arch in ("llama", "mistral"),  # llama.cpp's converter permutes Q/K rows for these
            rope_freq_factors="rope_freqs.weight" in names,
            qkv_bias="blk.0.attn_q.bias" in names, o_bias="blk.0.attn_output.bias" in names,
            mlp_bias="blk.0.ffn_up.bias" in names, qk_norm="blk.0.attn_q_norm.weight" in names)
        cfg.check(where)
        return cfg
