"""`Olmo2Config`: OLMo-2's hyper-parameters — the standard decoder keys (`models.decoder.config`) with
transformers' Olmo2Config defaults (2,048 positions, RMS eps 1e-5, untied head); q, k, v and o biases where
`attention_bias`. Read from a Hugging Face config.json or from GGUF metadata as llama.cpp's converter writes it
(`olmo2.*`); anything else refused in one line naming the field. numpy-free (the page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ..config_reader import JSONConfig
from ..decoder.config import DecoderConfig, architecture, gguf_fields, hf_fields
from ..decoder.rope import rope_from_hf


@dataclass(frozen=True, kw_only=True)
class Olmo2Config(DecoderConfig):
    FAMILY = "olmo2"

    attention_bias: bool = False

    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> Olmo2Config:
        architecture(raw, "model_type", ("olmo2",), "OLMo-2's", where)
        fields = hf_fields(raw, where, max_positions=2048, rms_norm_eps=1e-5)
        cfg = cls(**fields, rope=rope_from_hf(raw, where),
                  attention_bias=JSONConfig(raw, where, null_as_default=True).bool("attention_bias", False))
        cfg.check(where)
        return cfg

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> Olmo2Config:
        architecture(meta, "general.architecture", ("olmo2",), "OLMo-2's", where)
        m, fields = gguf_fields(meta, tensor_names, where)
        if m.int("attention.sliding_window", None):
            raise CheckpointError(f"{where}: olmo2.attention.sliding_window is set: that is OLMo 3, which webtensor "
                                  "does not run")
        cfg = cls(**fields, attention_bias="blk.0.attn_q.bias" in set(tensor_names))
        cfg.check(where)
        return cfg
