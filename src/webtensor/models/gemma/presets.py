"""Named shapes of the Gemma family (random weights for benchmarks: `webtensor bench -m gemma-2-2b`), each the
config.json its published checkpoint carries, abridged to the keys that shape the computation; and the tiny
example configs the conformance suite runs. numpy-free."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # google/gemma-2-2b-it: soft-capped scores and logits, every other layer in a 4,096 window
    "gemma-2-2b": {"model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh", "vocab_size": 256000,
                   "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                   "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "bos_token_id": 2,
                   "eos_token_id": [1, 107], "pad_token_id": 0},
    # google/gemma-3-1b-it: QK-norm, five of six layers in a 512 window with a rope base of 10,000
    "gemma-3-1b": {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh", "vocab_size": 262144,
                   "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                   "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                   "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "rope_local_base_freq": 10000.0, "rope_scaling": None, "query_pre_attn_scalar": 256,
                   "sliding_window": 512, "sliding_window_pattern": 6, "final_logit_softcapping": None,
                   "attn_logit_softcapping": None, "tie_word_embeddings": True, "bos_token_id": 2,
                   "eos_token_id": [1, 106], "pad_token_id": 0},
}

# Tiny configs for the conformance suite (tests/models/test_conformance.py): windows shorter than the prompts,
# soft-caps low enough to bend the random model's scores and logits, a scalar other than head_dim.
_TINY: dict[str, Any] = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                         "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 0,
                         "pad_token_id": 0, "initializer_range": 0.2}
EXAMPLES: dict[str, dict[str, Any]] = {
    "gemma": {**_TINY, "model_type": "gemma", "hidden_act": "gelu", "num_key_value_heads": 1,
              "rope_theta": 10000.0},
    "gemma2": {**_TINY, "model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 10000.0,
               "query_pre_attn_scalar": 24, "sliding_window": 4, "attn_logit_softcapping": 2.0,
               "final_logit_softcapping": 3.0, "tie_word_embeddings": True},
    "gemma3": {**_TINY, "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
               "num_hidden_layers": 3, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 32,
               "sliding_window": 5, "sliding_window_pattern": 3, "tie_word_embeddings": True},
}
