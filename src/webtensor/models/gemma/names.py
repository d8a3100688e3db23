"""The Gemma family's tensor map over the standard decoder names (`models.decoder.names`): Gemma's layers are
Llama's (input_layernorm, q / k / v, o_proj, post_attention_layernorm, gate / up / down); Gemma 2 and 3 add
pre_feedforward_layernorm and post_feedforward_layernorm, and their post_attention_layernorm is a post-norm
(llama.cpp's `post_attention_norm`, not the `ffn_norm` it is for Gemma and Llama); Gemma 3 adds q_norm and k_norm
over each head. The loader fuses q, k, v and gate, up where they are stored alike. numpy-free."""

from __future__ import annotations

from ..decoder import names as std
from ..decoder.names import canonical
from ..spec import TensorSpec
from .config import GemmaConfig

__all__ = ["canonical", "fusions", "gguf_names", "is_norm", "tensors"]


def tensors(cfg: GemmaConfig) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order (HF layout)."""
    out = std.embeddings(cfg)
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        std.norms(cfg, out, p, "input_layernorm")
        std.attention(cfg, out, p, bias=cfg.attention_bias, o_bias=cfg.attention_bias, qk_norm=int(cfg.qk_norm))
        if cfg.post_norms:
            std.norms(cfg, out, p, "post_attention_layernorm", "pre_feedforward_layernorm",
                      "post_feedforward_layernorm")
        else:
            std.norms(cfg, out, p, "post_attention_layernorm")
        std.mlp(cfg, out, p)
    std.head(cfg, out)
    return out


def gguf_names(cfg: GemmaConfig) -> dict[str, str]:
    """canonical name -> GGUF name, for every tensor of `tensors(cfg)`."""
    return std.gguf_names(tensors(cfg), {**std.BLOCK, **std.POST_NORMS} if cfg.post_norms else std.BLOCK)


def fusions(cfg: GemmaConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, parts): q, k, v (and their biases) -> qkv_proj; gate, up -> gate_up_proj, per layer."""
    return std.fusions(cfg, cfg.attention_bias)


def is_norm(name: str) -> bool:
    """Whether weight `name` is an RMS norm's (multiplying as 1 + w: llama.cpp's converter stores 1 + w)."""
    return name.endswith("norm.weight")
