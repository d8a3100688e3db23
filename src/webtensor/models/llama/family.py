"""The Llama family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..decoder.config import gguf_metadata, gguf_tensors
from ..decoder.names import qk_rows
from ..registry import register
from ..spec import Family
from . import names
from .config import ARCHITECTURES, LlamaConfig
from .forward import LlamaWeights
from .presets import EXAMPLES, PRESETS


def _build(cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int) -> LlamaWeights:
    return LlamaWeights(cfg, params, device, n_ctx)


def _to_gguf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """llama.cpp's converter: the `llama` architecture's Q and K rows (and biases) permuted from rotate-half pairs
    (i, i + D/2) to interleaved pairs (2i, 2i + 1), per head (`mistral` written as llama's)."""
    return qk_rows(cfg, name, arr, True) if cfg.architecture in ("llama", "mistral") else arr


def _to_hf(cfg: LlamaConfig, name: str, arr: Any) -> Any:
    """`_to_gguf` undone where the config says the rows are llama.cpp's (a GGUF file's `llama` model)."""
    return qk_rows(cfg, name, arr, False) if cfg.rope_interleaved else arr


FAMILY = register(Family(
    name="llama", hf_model_types=ARCHITECTURES, gguf_architectures=ARCHITECTURES,
    config_from_hf=LlamaConfig.from_hf, config_from_gguf=LlamaConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=gguf_metadata, gguf_tensors=gguf_tensors, to_gguf=_to_gguf, to_hf=_to_hf,
    gguf_architecture=lambda cfg: cfg.gguf_architecture, presets=PRESETS, examples=EXAMPLES))
