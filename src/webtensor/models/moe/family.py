"""The mixture-of-experts family's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..decoder.config import gguf_metadata, gguf_tensors
from ..decoder.names import qk_rows
from ..registry import register
from ..spec import Family
from . import names
from .config import ARCHITECTURES, MoEConfig, gguf_accepts
from .forward import MoEWeights
from .presets import EXAMPLES, PRESETS


def _build(cfg: MoEConfig, params: dict[str, Any], device: Any, n_ctx: int) -> MoEWeights:
    return MoEWeights(cfg, params, device, n_ctx)


def _metadata(cfg: MoEConfig) -> dict[str, Any]:
    """The standard keys and the experts': count, used count, each expert's width and whether the top-k weights
    are renormalized (`expert_weights_norm`)."""
    a = cfg.gguf_architecture
    meta = gguf_metadata(cfg)
    meta.update({f"{a}.expert_count": cfg.num_experts, f"{a}.expert_used_count": cfg.num_experts_per_tok,
                 f"{a}.expert_feed_forward_length": cfg.moe_intermediate_size,
                 f"{a}.expert_weights_norm": cfg.norm_topk_prob})
    return meta


def _to_gguf(cfg: MoEConfig, name: str, arr: Any) -> Any:
    """llama.cpp's converter: Mixtral (written as `llama`) gets Llama's Q / K row permutation."""
    return qk_rows(cfg, name, arr, True) if cfg.architecture == "mixtral" else arr


def _to_hf(cfg: MoEConfig, name: str, arr: Any) -> Any:
    return qk_rows(cfg, name, arr, False) if cfg.rope_interleaved else arr


FAMILY = register(Family(
    name="moe", hf_model_types=ARCHITECTURES, gguf_architectures=("qwen3moe", "olmoe", "llama"),
    config_from_hf=MoEConfig.from_hf, config_from_gguf=MoEConfig.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=_metadata, gguf_tensors=gguf_tensors, to_gguf=_to_gguf, to_hf=_to_hf,
    gguf_architecture=lambda cfg: cfg.gguf_architecture, gguf_accepts=gguf_accepts, presets=PRESETS,
    examples=EXAMPLES))
