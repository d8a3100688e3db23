"""The Llama family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..registry import register
from ..spec import Family
from . import names
from .config import ARCHITECTURES, LlamaConfig
from .forward import LlamaWeights
from .presets import PRESETS


def _build(cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int) -> LlamaWeights:
    return LlamaWeights(cfg, params, device, n_ctx)


def _gguf_metadata(cfg: LlamaConfig) -> dict[str, Any]:
    a = cfg.architecture
    meta: dict[str, Any] = {
        f"{a}.context_length": cfg.max_position_embeddings, f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size, f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.attention.head_count": cfg.num_attention_heads, f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps, f"{a}.rope.freq_base": cfg.rope_theta,
        f"{a}.rope.dimension_count": cfg.rotary_dim, f"{a}.vocab_size": cfg.vocab_size}
    if cfg.rope_scaling.type == "linear":
        meta[f"{a}.rope.scaling.type"] = "linear"
        meta[f"{a}.rope.scaling.factor"] = cfg.rope_scaling.factor
    return meta


def _to_gguf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """llama.cpp's converter: the `llama` architecture's Q and K rows (and biases) permuted from rotate-half pairs
    (i, i + D/2) to interleaved pairs (2i, 2i + 1), per head."""
    if cfg.architecture not in ("llama", "mistral") or not name.endswith(("q_proj.weight", "q_proj.bias",
                                                                            "k_proj.weight", "k_proj.bias")):
        return arr
    heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
    return arr.reshape(heads, 2, arr.shape[0] // heads // 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)


def _to_hf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """`_to_gguf` undone where the config says the rows are llama.cpp's (a GGUF file's `llama` model)."""
    if not cfg.rope_interleaved or not name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight",
                                                      "k_proj.bias")):
        return arr
    heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
    return arr.reshape(heads, arr.shape[0] // heads // 2, 2, *arr.shape[1:]).swapaxes(1, 2).reshape(arr.shape)


FAMILY = register(Family(
    name="llama", hf_model_types=ARCHITECTURES, gguf_architectures=ARCHITECTURES,
    config_from_hf=LlamaConfig.from_hf, config_from_gguf=LlamaConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=_gguf_metadata, to_gguf=_to_gguf, to_hf=_to_hf, presets=PRESETS))
