"""Named shapes of the Llama family (random weights for benchmarks: `webtensor bench -m smollm2-135m`), each the
config.json its published checkpoint carries, abridged to the keys that shape the computation. numpy-free."""

from __future__ import annotations

from typing import Any

_LLAMA: dict[str, Any] = {"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
                          "tie_word_embeddings": True}

PRESETS: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m": {**_LLAMA, "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                     "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "max_position_embeddings": 8192, "rope_theta": 100000.0, "bos_token_id": 1, "eos_token_id": 2},
    # HuggingFaceTB/SmolLM2-360M-Instruct
    "smollm2-360m": {**_LLAMA, "vocab_size": 49152, "hidden_size": 960, "intermediate_size": 2560,
                     "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5,
                     "max_position_embeddings": 8192, "rope_theta": 100000.0, "bos_token_id": 1, "eos_token_id": 2},
    # Qwen/Qwen2.5-0.5B-Instruct: q, k, v biases
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_act": "silu", "vocab_size": 151936, "hidden_size": 896,
                     "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                     "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_sliding_window": False,
                     "bos_token_id": 151643, "eos_token_id": 151645},
    # Qwen/Qwen3-0.6B: QK-norm, head_dim 128 (16 x 128 = 2,048 > 1,024 wide)
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_act": "silu", "vocab_size": 151936, "hidden_size": 1024,
                   "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_sliding_window": False,
                   "bos_token_id": 151643, "eos_token_id": 151645},
    # meta-llama/Llama-3.2-1B-Instruct: llama3 rope scaling
    "llama-3.2-1b": {**_LLAMA, "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0,
                     "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                     "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
    # meta-llama/Llama-3.1-8B-Instruct: 32 layers, 8 KV heads of 128, llama3 rope scaling
    "llama-3.1-8b": {**_LLAMA, "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                     "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
}
