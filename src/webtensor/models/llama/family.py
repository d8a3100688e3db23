"""The Llama family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..registry import register
from ..spec import Family
from . import names
from .config import ARCHITECTURES, LlamaConfig
from .forward import LlamaWeights


def _build(cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int) -> LlamaWeights:
    return LlamaWeights(cfg, params, device, n_ctx)


FAMILY = register(Family(
    name="llama", hf_model_types=ARCHITECTURES, gguf_architectures=ARCHITECTURES,
    config_from_hf=LlamaConfig.from_hf, config_from_gguf=LlamaConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions))
