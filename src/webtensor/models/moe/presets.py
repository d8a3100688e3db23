"""Named shapes of the mixture-of-experts family (random weights for benchmarks: `webtensor bench -m
qwen3-30b-a3b`), each the config.json its published checkpoint carries, abridged to the keys that shape the
computation and cut to a few layers (a layer's decode and prefill cost is the published model's; the whole would
not fit a benchmark's random weights), and the tiny examples the conformance suite runs. numpy-free."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-30B-A3B, 4 of its 48 layers: 128 experts of width 768, 8 a token, renormalized; QK-norm
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_act": "silu", "vocab_size": 151936, "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 4,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                      "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "mlp_only_layers": [], "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                      "rope_theta": 1000000.0, "tie_word_embeddings": False, "use_sliding_window": False,
                      "bos_token_id": 151643, "eos_token_id": 151645},
    # mistralai/Mixtral-8x7B-Instruct-v0.1, 2 of its 32 layers: 8 experts of width 14336, 2 a token
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_act": "silu", "vocab_size": 32000, "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 2, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                     "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                     "sliding_window": None, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2},
}

# Tiny configs of every architecture and option, for the conformance suite (tests/models/test_conformance.py)
_TINY: dict[str, Any] = {"hidden_act": "silu", "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 96,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                         "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0}
EXAMPLES: dict[str, dict[str, Any]] = {
    # 7 experts, 3 a token, renormalized; layer 1 a dense MLP (mlp_only_layers)
    "qwen3_moe": {**_TINY, "model_type": "qwen3_moe", "head_dim": 32, "num_experts": 7, "num_experts_per_tok": 3,
                  "moe_intermediate_size": 32, "norm_topk_prob": True, "mlp_only_layers": [1]},
    "mixtral": {**_TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": None},
    # not renormalized; QK-norm over the projection
    "olmoe": {**_TINY, "model_type": "olmoe", "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": False},
}
