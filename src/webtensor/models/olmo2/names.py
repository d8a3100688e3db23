"""OLMo-2's tensor map over the standard decoder names (`models.decoder.names`): per layer q / k / v and o_proj,
q_norm and k_norm over the whole projections (H x D and KV x D), post_attention_layernorm and
post_feedforward_layernorm (post-norms: llama.cpp's `post_attention_norm` and `post_ffw_norm`; there is no
pre-norm), the gated MLP. The loader fuses q, k, v and gate, up where they are stored alike. numpy-free."""

from __future__ import annotations

from ..decoder import names as std
from ..decoder.names import canonical
from ..spec import TensorSpec
from .config import Olmo2Config

__all__ = ["canonical", "fusions", "gguf_names", "tensors"]


def tensors(cfg: Olmo2Config) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order (HF layout)."""
    out = std.embeddings(cfg)
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        std.attention(cfg, out, p, bias=cfg.attention_bias, o_bias=cfg.attention_bias, qk_norm=2)
        std.norms(cfg, out, p, "post_attention_layernorm")
        std.mlp(cfg, out, p)
        std.norms(cfg, out, p, "post_feedforward_layernorm")
    std.head(cfg, out)
    return out


def gguf_names(cfg: Olmo2Config) -> dict[str, str]:
    return std.gguf_names(tensors(cfg), {**std.BLOCK, **std.POST_NORMS})


def fusions(cfg: Olmo2Config) -> list[tuple[str, tuple[str, ...]]]:
    return std.fusions(cfg, cfg.attention_bias)
