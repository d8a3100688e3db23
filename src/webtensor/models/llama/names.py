"""The Llama family's tensor map over the standard decoder names (`models.decoder.names`): each layer's norms,
q / k / v (biases for Qwen2 and where attention_bias; one qkv_proj for Phi-3), QK-norm (Qwen3), o_proj and the
gated MLP (one gate_up_proj for Phi-3); the loader fuses q, k, v and gate, up where they are stored apart and
alike. A GGUF file's llama3 `rope_freqs` and Phi-3 `rope_factors_*` are tensors too. numpy-free.

llama.cpp's converter permutes the rows of Q and K for the `llama` and `granite` architectures (rotate-half
pairs become interleaved pairs); the weights are taken as stored and `LlamaConfig.rope_interleaved` tells rope
which pairing the rows are in, so a GGUF file and its Hugging Face original give the same logits without a
permutation."""

from __future__ import annotations

from ..decoder import names as std
from ..decoder.names import canonical
from ..spec import TensorSpec
from .config import LlamaConfig

__all__ = ["canonical", "fusions", "gguf_names", "tensors"]


def tensors(cfg: LlamaConfig) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order (HF layout)."""
    out = std.embeddings(cfg)
    half = (cfg.rotary_dim // 2,)
    if cfg.rope_freq_factors:
        out["rope_freqs.weight"] = TensorSpec(half, "float32")
    if cfg.rope.scaling.type == "longrope" and not cfg.rope.scaling.short_factor:  # (a GGUF file's)
        out["rope_factors_long.weight"] = TensorSpec(half, "float32")
        out["rope_factors_short.weight"] = TensorSpec(half, "float32")
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        std.norms(cfg, out, p, "input_layernorm")
        std.attention(cfg, out, p, bias=cfg.qkv_bias, o_bias=cfg.o_bias, qk_norm=int(cfg.qk_norm),
                      fused=cfg.fused_qkv)
        std.norms(cfg, out, p, "post_attention_layernorm")
        std.mlp(cfg, out, p, bias=cfg.mlp_bias, fused=cfg.fused_gate_up)
    std.head(cfg, out)
    return out


def gguf_names(cfg: LlamaConfig) -> dict[str, str]:
    """canonical name -> GGUF name, for every tensor of `tensors(cfg)`."""
    return std.gguf_names(tensors(cfg))


def fusions(cfg: LlamaConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, parts): q, k, v (weights and biases) -> qkv_proj; gate, up -> gate_up_proj, per layer (where
    they are stored apart)."""
    return [(fused, parts) for fused, parts in std.fusions(cfg, cfg.qkv_bias, cfg.mlp_bias)
            if not (cfg.fused_qkv and ".self_attn." in fused) and not (cfg.fused_gate_up and ".mlp." in fused)]
