"""The Gemma family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..decoder.config import gguf_metadata, gguf_tensors
from ..registry import register
from ..spec import Family
from . import names
from .config import _LARGE, ARCHITECTURES, GGUF_ARCHITECTURES, GemmaConfig
from .forward import GemmaWeights
from .presets import EXAMPLES, PRESETS


def _build(cfg: GemmaConfig, params: dict[str, Any], device: Any, n_ctx: int) -> GemmaWeights:
    return GemmaWeights(cfg, params, device, n_ctx)


def _gguf_metadata(cfg: GemmaConfig) -> dict[str, Any]:
    """The standard keys, the soft-caps, and `attention.scale` where query_pre_attn_scalar is not what llama.cpp
    derives (1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the 27B models)."""
    meta = gguf_metadata(cfg)
    a = cfg.gguf_architecture
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, key) is not None:
            meta[f"{a}.{key}"] = getattr(cfg, key)
    rule = cfg.hidden_size // cfg.num_attention_heads if cfg.num_hidden_layers == _LARGE.get(cfg.architecture) \
        else cfg.head_dim
    if cfg.query_pre_attn_scalar != rule:
        meta[f"{a}.attention.scale"] = cfg.attention_scale
    return meta


def _to_gguf(cfg: GemmaConfig, name: str, arr: Any) -> Any:
    """llama.cpp's converter: every norm weight stored as 1 + w (Gemma's RMS norm multiplies by it)."""
    return arr + 1 if cfg.norm_shift and names.is_norm(name) else arr


def _to_hf(cfg: GemmaConfig, name: str, arr: Any) -> Any:
    """`_to_gguf` undone where the weights came from a GGUF file (the config's norm_shift 0)."""
    return arr - 1 if not cfg.norm_shift and names.is_norm(name) else arr


FAMILY = register(Family(
    name="gemma", hf_model_types=ARCHITECTURES, gguf_architectures=GGUF_ARCHITECTURES,
    config_from_hf=GemmaConfig.from_hf, config_from_gguf=GemmaConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=_gguf_metadata, gguf_tensors=gguf_tensors, to_gguf=_to_gguf, to_hf=_to_hf,
    gguf_architecture=lambda cfg: cfg.gguf_architecture, presets=PRESETS, examples=EXAMPLES))
