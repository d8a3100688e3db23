"""`LlamaConfig`: the Llama family's hyper-parameters — the architectures whose forward is Llama's (pre-norm
blocks, rotary attention, a SwiGLU MLP) with options:

- `llama` (Llama 2/3.x, SmolLM2: llama3 / linear rope scaling, attention and MLP biases);
- `mistral` and `ministral` (a sliding window on every layer, or on the layers `layer_types` says);
- `qwen2` (q/k/v biases) and `qwen3` (QK-norm, an explicit head_dim), with `use_sliding_window`'s windows on
  the layers from `max_window_layers` on;
- `phi3` (Phi-3 / 3.5 / Phi-4-mini: q, k, v stored as one qkv_proj and gate, up as one gate_up_proj;
  longrope scaling with short and long factors; a partial rotary factor; a sliding window);
- `granite` (IBM Granite 3.x: embedding, residual and attention multipliers, logits divided by a scale).

Read from a Hugging Face config.json (both layouts seen in the wild: the top-level `rope_theta` / `rope_scaling`
published files carry, and transformers 5's `rope_parameters`) or from GGUF metadata as llama.cpp's converter
writes it: the standard keys through `models.decoder.config`, the family's own here, each default the one
transformers' config class has. What changes the computation and is not supported is refused with one line
naming the field; keys transformers' own model ignores are ignored here too. numpy-free (the page).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from ..decoder.rope import Rope, RopeScaling, rope_from_hf

ARCHITECTURES = ("llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "granite")
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite")  # (mistral: webtensor's older files)
# transformers' defaults where config.json is silent: max_position_embeddings, rms_norm_eps
_DEFAULTS = {"llama": (2048, 1e-6), "mistral": (32768, 1e-6), "ministral": (32768, 1e-6), "qwen2": (32768, 1e-6),
             "qwen3": (32768, 1e-6), "phi3": (4096, 1e-5), "granite": (2048, 1e-6)}


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    FAMILY = "llama"

    qkv_bias: bool = False  # biases on q, k, v (Qwen2; attention_bias in Llama / Qwen3 / Granite)
    o_bias: bool = False  # a bias on o_proj (attention_bias in Llama / Qwen3 / Granite)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMS norm over each head of q and k before rope
    fused_qkv: bool = False  # Phi-3: q, k, v stored as one qkv_proj (N = Q + 2 KV rows)
    fused_gate_up: bool = False  # Phi-3: gate and up stored as one gate_up_proj (2F rows)
    attention_multiplier: float | None = None  # the scores' scale (Granite's); None: head_dim ** -0.5
    embedding_multiplier: float = 1.0  # Granite: the embedding times this
    residual_multiplier: float = 1.0  # Granite: each block's output times this before the residual add
    logits_scaling: float = 1.0  # Granite: the logits divided by this

    @property
    def attention_scale(self) -> float:
        return self.head_dim ** -0.5 if self.attention_multiplier is None else self.attention_multiplier

    @property
    def gguf_architecture(self) -> str:
        """llama.cpp's converter writes MistralForCausalLM (and Ministral) as `llama`."""
        return "llama" if self.architecture in ("mistral", "ministral") else self.architecture

    # -- Hugging Face config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        arch = architecture(raw, "model_type", ARCHITECTURES, "a Llama-family architecture", where)
        req = JSONConfig(raw, where, null_as_default=True)
        max_pos, eps = _DEFAULTS[arch]
        fields = hf_fields(raw, where, max_positions=max_pos, rms_norm_eps=eps,
                           head_dim=128 if arch == "qwen3" else None)  # (transformers' defaults)
        n = fields["num_hidden_layers"]
        if arch == "granite":  # (transformers' Granite takes hidden_size / heads whatever head_dim says)
            fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
        window, types = _windows(raw, req, where, arch, n)
        # transformers reads attention_bias for llama, qwen3 and granite only (qwen2: q/k/v biases always, none
        # on o_proj; mistral, phi3: none), and mlp_bias for llama and granite: the others ignore the keys, as here
        attention_bias = req.bool("attention_bias", False) if arch in ("llama", "qwen3", "granite") else False
        mlp_bias = req.bool("mlp_bias", False) if arch in ("llama", "granite") else False
        cfg = cls(**fields, rope=_rope(raw, where, arch), sliding_window=window, layer_types=types,
                  qkv_bias=arch == "qwen2" or attention_bias, o_bias=attention_bias, mlp_bias=mlp_bias,
                  qk_norm=arch == "qwen3",
                  fused_qkv=arch == "phi3", fused_gate_up=arch == "phi3",
                  **(_granite(req) if arch == "granite" else {}))
        cfg.check(where)
        return cfg

    # -- GGUF metadata --------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> LlamaConfig:
        arch = architecture(meta, "general.architecture", GGUF_ARCHITECTURES, "a Llama-family architecture", where)
        names = set(tensor_names)
        m, fields = gguf_fields(meta, tensor_names, where, key_length=arch != "granite")
        if "rope_factors_long.weight" in names:  # Phi-3's longrope: the factors are tensors, read at build
            s = m.int("rope.scaling.original_context_length")
            rope: Rope = fields["rope"]
            fields["rope"] = Rope(rope.theta, RopeScaling(
                "longrope", fields["max_position_embeddings"] / s, original_max_position_embeddings=s,
                attention_factor=m.float("rope.scaling.attn_factor", 1.0)), rope.partial_rotary_factor)
        window = m.int("attention.sliding_window", None) or None  # (0: none, as the Phi-3 converter writes it)
        types = gguf_layer_types(m, fields["num_hidden_layers"], 0) if window else ()
        granite: dict[str, Any] = {}
        if arch == "granite":  # (no attention.scale: llama.cpp's 1 / sqrt(head_dim))
            granite = dict(attention_multiplier=m.float("attention.scale") if f"{arch}.attention.scale" in meta
                           else None, embedding_multiplier=m.float("embedding_scale", 1.0),
                           residual_multiplier=m.float("residual_scale", 1.0),
                           logits_scaling=m.float("logit_scale", 1.0))
        cfg = cls(
            **fields, sliding_window=window, layer_types=types,
            rope_interleaved=arch in ("llama", "mistral", "granite"),  # llama.cpp's converter permutes their Q/K
            rope_freq_factors="rope_freqs.weight" in names,
            qkv_bias="blk.0.attn_q.bias" in names or "blk.0.attn_qkv.bias" in names,
            o_bias="blk.0.attn_output.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names, fused_qkv="blk.0.attn_qkv.weight" in names,
            fused_gate_up=arch == "phi3", **granite)
        cfg.check(where)
        return cfg


def _rope(raw: dict[str, Any], where: str, arch: str) -> Rope:
    """The rope of any architecture; Phi-3 reads "su" and "yarn" as longrope (as transformers' Phi3Config does)
    and takes an `original_max_position_embeddings` of 4,096 where config.json gives none."""
    if arch == "phi3":
        raw = dict(raw)
        raw.setdefault("original_max_position_embeddings", 4096)
        for key in ("rope_scaling", "rope_parameters"):
            p = raw.get(key)
            if isinstance(p, dict) and p.get("rope_type", p.get("type")) in ("su", "yarn"):
                raw[key] = {**{k: v for k, v in p.items() if k != "type"}, "rope_type": "longrope"}
    return rope_from_hf(raw, where)


def _windows(raw: dict[str, Any], req: JSONConfig, where: str, arch: str, n: int) -> tuple[int | None, tuple[str, ...]]:
    """(sliding_window, layer_types) as transformers' config of `arch` reads them."""
    if arch in ("llama", "granite"):
        return None, ()
    if arch in ("qwen2", "qwen3"):  # windows on the layers from max_window_layers on, where use_sliding_window
        window = hf_window(raw, where, 4096) if req.bool("use_sliding_window", False) else None
        first = req.int("max_window_layers", 28)
        types = hf_layer_types(raw, where, n, lambda i: SLIDING if window is not None and i >= first else FULL)
        return (window, types) if SLIDING in types else (None, ())
    window = hf_window(raw, where, 4096 if arch in ("mistral", "ministral") else None)
    if window is None:
        return None, ()
    if arch == "ministral":
        return window, hf_layer_types(raw, where, n, lambda i: SLIDING)
    return window, (SLIDING,) * n  # (Mistral and Phi-3 slide on every layer, whatever layer_types says)


def _granite(req: JSONConfig) -> dict[str, Any]:
    return dict(attention_multiplier=req.float("attention_multiplier", 1.0),
                embedding_multiplier=req.float("embedding_multiplier", 1.0),
                residual_multiplier=req.float("residual_multiplier", 1.0),
                logits_scaling=req.float("logits_scaling", 1.0))
