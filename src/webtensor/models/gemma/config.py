"""`GemmaConfig`: the Gemma family's hyper-parameters — what sets it apart from Llama's: the embedding scaled by
sqrt(hidden_size); RMS norms whose weight w multiplies as (1 + w); a GeGLU MLP (gelu_tanh); for Gemma 2 and 3 a
norm after attention and one after the MLP besides the pre-norms, the scores scaled by
`query_pre_attn_scalar` ** -0.5, sliding-window attention on alternating layers (Gemma 2: every other, Gemma 3:
five of six, or as `layer_types` says); Gemma 2's attention-logit and final-logit soft-capping; Gemma 3's QK-norm
and its sliding layers' own rope base (`rope_local_base_freq`, or `rope_parameters.sliding_attention`).

Read from a Hugging Face config.json (each default transformers' config class has) or from GGUF metadata as
llama.cpp's converter writes it (norm weights stored as 1 + w; llama.cpp's attention scale rule: 1 / sqrt(head_dim),
or 1 / sqrt(hidden / heads) for the 27B models, unless the file carries `attention.scale`); anything else refused
in one line naming the field. numpy-free (the page).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ..config_reader import JSONConfig
from ..decoder.config import (
    FULL,
    SLIDING,
    DecoderConfig,
    architecture,
    gguf_fields,
    gguf_layer_types,
    hf_fields,
    hf_layer_types,
    hf_window,
)
from ..decoder.rope import Rope, rope_from_hf

ARCHITECTURES = ("gemma", "gemma2", "gemma3_text")
GGUF_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_GGUF = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}
_PATTERN = {"gemma2": 2, "gemma3_text": 6}  # transformers' default: every n-th layer full, the others slide
_LARGE = {"gemma2": 46, "gemma3_text": 62}  # llama.cpp: the 27B models (by their layers) scale by hidden / heads


@dataclass(frozen=True, kw_only=True)
class GemmaConfig(DecoderConfig):
    FAMILY = "gemma"

    query_pre_attn_scalar: float  # the scores scale by its inverse square root
    attn_logit_softcapping: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    post_norms: bool = False  # Gemma 2 / 3: post_attention_layernorm and post_feedforward_layernorm after each part
    qk_norm: bool = False  # Gemma 3: an RMS norm over each head of q and k before rope
    attention_bias: bool = False
    norm_shift: float = 1.0  # the norms multiply by (norm_shift + w): 1 from HF, 0 from GGUF (stored as 1 + w)

    @property
    def attention_scale(self) -> float:
        return float(self.query_pre_attn_scalar ** -0.5)

    @property
    def embed_scale(self) -> float:
        """The embedding's multiplier: sqrt(hidden_size) (transformers' normalizer, in float32)."""
        return float(self.hidden_size ** 0.5)

    @property
    def gguf_architecture(self) -> str:
        return _GGUF[self.architecture]

    def check(self, where: str) -> None:
        super().check(where)
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise CheckpointError(f"{where}: {name} must be a finite number > 0 or null, got {v}")

    # -- Hugging Face config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> GemmaConfig:
        arch = architecture(raw, "model_type", ARCHITECTURES, "a Gemma-family architecture", where)
        req = JSONConfig(raw, where, null_as_default=True)
        if req.bool("use_bidirectional_attention", False):
            raise CheckpointError(f"{where}: use_bidirectional_attention = true: only causal attention is supported")
        act_key = "hidden_act" if arch == "gemma" else "hidden_activation"
        raw = dict(raw)
        if raw.get(act_key) is None or raw.get(act_key) == "gelu":  # (transformers reads "gelu" as the tanh form)
            raw[act_key] = "gelu_pytorch_tanh"
        fields = hf_fields(raw, where, max_positions=8192 if arch != "gemma3_text" else 131072, head_dim=256,
                           tie=True, acts=("gelu_pytorch_tanh",), act_key=act_key)
        n, D = fields["num_hidden_layers"], fields["head_dim"]
        if arch == "gemma":
            return cls._made(dict(**fields, rope=rope_from_hf(raw, where), query_pre_attn_scalar=D,
                                  attention_bias=req.bool("attention_bias", False)), where)
        window = hf_window(raw, where, 4096)
        pattern = req.int("sliding_window_pattern", 6) if arch == "gemma3_text" else _PATTERN[arch]
        types = hf_layer_types(raw, where, n, lambda i: SLIDING if (i + 1) % pattern else FULL)
        if window is None:
            types = ()
        gemma3 = arch == "gemma3_text"
        rope = rope_from_hf(raw, where, FULL, 1_000_000.0 if gemma3 else 10000.0, "rope_local_base_freq")
        local = rope_from_hf(raw, where, SLIDING, 10000.0, "rope_local_base_freq") if gemma3 else None
        soft = {k: (None if raw.get(k) is None else req.float(k)) for k in
                ("attn_logit_softcapping", "final_logit_softcapping")}
        if not gemma3:  # (Gemma 2's defaults: 50 and 30)
            soft = {k: req.float(k, d) if raw.get(k, d) is not None else None
                    for k, d in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0))}
        return cls._made(dict(
            **fields, rope=rope, rope_local=local if local != rope else None, sliding_window=window,
            layer_types=types, query_pre_attn_scalar=req.float("query_pre_attn_scalar", 256), **soft,
            post_norms=True, qk_norm=gemma3, attention_bias=req.bool("attention_bias", False)), where)

    # -- GGUF metadata --------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> GemmaConfig:
        gguf_arch = architecture(meta, "general.architecture", GGUF_ARCHITECTURES, "a Gemma-family architecture",
                                 where)
        arch = "gemma3_text" if gguf_arch == "gemma3" else gguf_arch
        m, fields = gguf_fields(meta, tensor_names, where)
        fields.update(architecture=arch, tie_word_embeddings=fields["tie_word_embeddings"] or arch == "gemma2",
                      norm_shift=0.0)  # (llama.cpp's gemma 2 always reads its head from the embedding)
        C, H, D, n = fields["hidden_size"], fields["num_attention_heads"], fields["head_dim"], \
            fields["num_hidden_layers"]
        scalar = (C // H) if n == _LARGE.get(arch) else D  # (llama.cpp: the scale's inverse square)
        if f"{gguf_arch}.attention.scale" in meta:
            scalar = m.float("attention.scale") ** -2
        names = set(tensor_names)
        if arch == "gemma":
            return cls._made(dict(**fields, query_pre_attn_scalar=scalar,
                                  attention_bias="blk.0.attn_q.bias" in names), where)
        window = m.int("attention.sliding_window", 4096 if arch == "gemma2" else None) or None
        types = gguf_layer_types(m, n, _PATTERN[arch]) if window else ()
        rope: Rope = fields["rope"]
        local = Rope(m.float("rope.freq_base_swa", rope.theta if arch == "gemma2" else 10000.0),
                     partial_rotary_factor=rope.partial_rotary_factor)
        soft = {k: m.float(k) if f"{gguf_arch}.{k}" in meta else None
                for k in ("attn_logit_softcapping", "final_logit_softcapping")}
        if arch == "gemma2":  # (llama.cpp's defaults for gemma 2)
            soft = {k: 50.0 if v is None and k.startswith("attn") else 30.0 if v is None else v
                    for k, v in soft.items()}
        return cls._made(dict(
            **fields, rope_local=local if local != rope else None, sliding_window=window, layer_types=types,
            query_pre_attn_scalar=scalar, **soft, post_norms=True, qk_norm="blk.0.attn_q_norm.weight" in names,
            attention_bias="blk.0.attn_q.bias" in names), where)

    @classmethod
    def _made(cls, fields: dict[str, Any], where: str) -> GemmaConfig:
        cfg = cls(**fields)
        cfg.check(where)
        return cfg
