"""The Llama family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..decoder.config import gguf_metadata, gguf_tensors
from ..decoder.names import qk_rows
from ..registry import register
from ..spec import Family
from . import names
from .config import ARCHITECTURES, GGUF_ARCHITECTURES, LlamaConfig
from .forward import LlamaWeights
from .presets import EXAMPLES, PRESETS


def _build(cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int) -> LlamaWeights:
    return LlamaWeights(cfg, params, device, n_ctx)


def _gguf_metadata(cfg: LlamaConfig) -> dict[str, Any]:
    """The standard keys, Phi-3's sliding window (0 for none, as its converter writes it) and Granite's scales."""
    meta = gguf_metadata(cfg)
    a = cfg.gguf_architecture
    if a == "phi3":
        meta[f"{a}.attention.sliding_window"] = cfg.sliding_window or 0
        meta.pop(f"{a}.attention.sliding_window_pattern", None)  # (every layer slides)
    if a == "granite":
        meta.update({f"{a}.attention.scale": cfg.attention_scale, f"{a}.embedding_scale": cfg.embedding_multiplier,
                     f"{a}.residual_scale": cfg.residual_multiplier, f"{a}.logit_scale": cfg.logits_scaling})
    return meta


def _to_gguf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """llama.cpp's converter: the `llama` and `granite` architectures' Q and K rows (and biases) permuted from
    rotate-half pairs (i, i + D/2) to interleaved pairs (2i, 2i + 1), per head (Mistral written as llama's)."""
    return qk_rows(cfg, name, arr, True) if cfg.gguf_architecture in ("llama", "granite") else arr


def _to_hf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """`_to_gguf` undone where the config says the rows are llama.cpp's (a GGUF file's `llama` model)."""
    return qk_rows(cfg, name, arr, False) if cfg.rope_interleaved else arr


FAMILY = register(Family(
    name="llama", hf_model_types=ARCHITECTURES, gguf_architectures=GGUF_ARCHITECTURES,
    config_from_hf=LlamaConfig.from_hf, config_from_gguf=LlamaConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=_gguf_metadata, gguf_tensors=gguf_tensors, to_gguf=_to_gguf, to_hf=_to_hf,
    gguf_architecture=lambda cfg: cfg.gguf_architecture, presets=PRESETS, examples=EXAMPLES))
