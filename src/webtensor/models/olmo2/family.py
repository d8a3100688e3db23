"""OLMo-2's record in the registry: what the loader and the runtime call."""

from __future__ import annotations

from typing import Any

from ..decoder.config import gguf_metadata, gguf_tensors
from ..registry import register
from ..spec import Family
from . import names
from .config import Olmo2Config
from .forward import Olmo2Weights

# allenai/OLMo-2-1124-7B-Instruct (abridged to the keys that shape the computation)
PRESETS: dict[str, dict[str, Any]] = {
    "olmo-2-7b": {"model_type": "olmo2", "hidden_act": "silu", "vocab_size": 100352, "hidden_size": 4096,
                  "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "rope_theta": 500000.0, "attention_bias": False, "tie_word_embeddings": False,
                  "bos_token_id": 100257, "eos_token_id": 100257, "pad_token_id": 100277},
}
# the conformance suite's tiny configs (tests/models/test_conformance.py): grouped-query, and with biases
_TINY: dict[str, Any] = {"model_type": "olmo2", "hidden_act": "silu", "vocab_size": 4096, "hidden_size": 64,
                         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                         "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
                         "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
EXAMPLES: dict[str, dict[str, Any]] = {
    "olmo2": {**_TINY, "num_key_value_heads": 2},
    "olmo2-bias": {**_TINY, "num_key_value_heads": 4, "attention_bias": True},
}


def _build(cfg: Olmo2Config, params: dict[str, Any], device: Any, n_ctx: int) -> Olmo2Weights:
    return Olmo2Weights(cfg, params, device, n_ctx)


FAMILY = register(Family(
    name="olmo2", hf_model_types=("olmo2",), gguf_architectures=("olmo2",),
    config_from_hf=Olmo2Config.from_hf, config_from_gguf=Olmo2Config.from_gguf,
    tensors=names.tensors, canonical=names.canonical, gguf_names=names.gguf_names, build=_build,
    fusions=names.fusions, gguf_metadata=gguf_metadata, gguf_tensors=gguf_tensors, presets=PRESETS,
    examples=EXAMPLES))
