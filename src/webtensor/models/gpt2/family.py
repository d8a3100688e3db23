"""GPT-2's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..registry import register
from ..spec import Family
from . import names
from .config import PRESETS, GPT2Config
from .forward import GPT2Weights


def _from_hf(raw: dict[str, Any], where: str) -> GPT2Config:
    return GPT2Config.from_dict(raw, where)


def _check(cfg: GPT2Config, shapes: Any, where: str) -> None:
    names.check_shapes(shapes, cfg, where)


def _gguf_metadata(cfg: GPT2Config) -> dict[str, Any]:
    return {"gpt2.context_length": cfg.n_positions, "gpt2.embedding_length": cfg.n_embd,
            "gpt2.feed_forward_length": cfg.inner_dim, "gpt2.block_count": cfg.n_layer,
            "gpt2.attention.head_count": cfg.n_head, "gpt2.attention.layer_norm_epsilon": cfg.layer_norm_epsilon}


def _preset(shape: dict[str, int]) -> dict[str, Any]:
    """A preset size as the config.json of OpenAI's GPT-2 checkpoints (Hugging Face's defaults spelled out)."""
    return {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, **shape, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50256,
            "eos_token_id": 50256, "tie_word_embeddings": True}


# tiny configs for the conformance suite (tests/models/test_conformance.py): tied, and an untied head with a
# narrower MLP (what a GGUF file can say: llama.cpp's GPT-2 knows no other activation or attention scale)
EXAMPLES = {
    "gpt2": {"model_type": "gpt2", "vocab_size": 4096, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
             "bos_token_id": 0, "eos_token_id": 0},
    "gpt2-untied": {"model_type": "gpt2", "vocab_size": 4096, "n_positions": 128, "n_embd": 64, "n_layer": 2,
                    "n_head": 2, "n_inner": 96, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0},
}


def _build(cfg: GPT2Config, params: dict[str, Any], device: Any, n_ctx: int) -> GPT2Weights:
    return GPT2Weights(cfg, params, device, n_ctx)


FAMILY = register(Family(
    name="gpt2", hf_model_types=("gpt2",), gguf_architectures=("gpt2",),
    config_from_hf=_from_hf, config_from_gguf=GPT2Config.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    check=_check, gguf_metadata=_gguf_metadata, presets={name: _preset(p) for name, p in PRESETS.items()},
    examples=EXAMPLES))
