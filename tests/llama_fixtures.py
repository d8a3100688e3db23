"""Random Llama-family checkpoints written by transformers itself (config.json in the layout transformers 5 writes,
or rewritten to the top-level `rope_theta` / `rope_scaling` layout published Llama 3.x files carry), with a small
byte-level BPE tokenizer: what the Llama-family tests read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "webtensor" / "models" / "shipped"
VOCAB = 4096  # the shipped tokenizer's ids fit

# architecture and option -> config overrides (over a small base: 2 layers, width 64, 4 heads, 2 KV heads)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-gqa": ("llama", {}),
    "llama-mqa-tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-mha-bias": ("llama", dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True)),
    "llama3-rope": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_max_position_embeddings=32))),
    "llama-linear-rope": ("llama", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "mistral": ("mistral", dict(sliding_window=None)),
    # keys transformers' model ignores for the architecture (mistral: every bias; qwen2: attention_bias, mlp_bias;
    # qwen3: mlp_bias): written to config.json all the same, and ignored by webtensor as by transformers
    "mistral-bias-keys": ("mistral", dict(sliding_window=None, attention_bias=True, mlp_bias=True)),
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2-bias-keys": ("qwen2", dict(attention_bias=True, mlp_bias=True)),
    "qwen3": ("qwen3", dict(head_dim=32)),
    "qwen3-bias": ("qwen3", dict(head_dim=32, attention_bias=True, mlp_bias=True)),
    "qwen3-hd128": ("qwen3", dict(head_dim=128, num_key_value_heads=1)),
}


def make_llama(out: Path, variant: str, legacy_rope: bool = False, seed: int = 0, **overrides: Any) -> Path:
    """A random checkpoint of `variant` (VARIANTS) in `out`; `legacy_rope`: config.json with top-level
    `rope_theta` / `rope_scaling` (as Llama 3.x's published files) instead of `rope_parameters`; `overrides`:
    more config fields (a larger vocabulary or context)."""
    import torch
    import transformers

    arch, extra = VARIANTS[variant]
    torch.manual_seed(seed)
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    kw: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                              rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    kw.update(extra)
    kw.update(overrides)
    model = transformers.AutoModelForCausalLM.from_config(cls(**kw)).eval()
    with torch.no_grad():  # norms and biases away from their init (1 and 0), so that they matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        if (SHIPPED / f).exists():
            shutil.copy(SHIPPED / f, out / f)
    if legacy_rope:
        cfg = json.loads((out / "config.json").read_text())
        rope = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
