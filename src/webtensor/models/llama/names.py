"""The Llama family's tensor map: each weight's canonical name (Hugging Face's, without the "model." prefix), its
shape and role, its name in llama.cpp's GGUF files, and the fusions the loader makes (q, k, v -> one qkv matrix;
gate, up -> one gate_up matrix) where the parts are stored alike. numpy-free.

llama.cpp's converter permutes the rows of Q and K for the `llama` architecture (rotate-half pairs become
interleaved pairs); the weights are taken as stored and `LlamaConfig.rope_interleaved` tells rope which pairing
the rows are in, so a GGUF file and its Hugging Face original give the same logits without a permutation."""

from __future__ import annotations

import re

from ..spec import TensorSpec
from .config import LlamaConfig

_IGNORED = re.compile(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq")  # a buffer some old checkpoints stored

# canonical suffix under layers.{i}. -> GGUF suffix under blk.{i}.
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.down_proj.bias": "ffn_down.bias",
}
_TOP = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight", "rope_freqs.weight": "rope_freqs.weight"}


def canonical(key: str) -> str | None:
    """A checkpoint key's canonical name: "model." dropped; None for buffers that are not weights."""
    name = key.removeprefix("model.")
    return None if _IGNORED.fullmatch(name) else name


def tensors(cfg: LlamaConfig) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order (HF layout)."""
    C, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    Q, KV = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    out = {"embed_tokens.weight": TensorSpec((V, C), "embedding")}
    if cfg.rope_freq_factors:
        out["rope_freqs.weight"] = TensorSpec((cfg.rotary_dim // 2,), "float32")
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = TensorSpec((C,), "float32")
        for name, n in (("q", Q), ("k", KV), ("v", KV)):
            out[p + f"self_attn.{name}_proj.weight"] = TensorSpec((n, C), "linear")
            if cfg.qkv_bias:
                out[p + f"self_attn.{name}_proj.bias"] = TensorSpec((n,), "float32")
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = TensorSpec((cfg.head_dim,), "float32")
            out[p + "self_attn.k_norm.weight"] = TensorSpec((cfg.head_dim,), "float32")
        out[p + "self_attn.o_proj.weight"] = TensorSpec((C, Q), "linear")
        if cfg.o_bias:
            out[p + "self_attn.o_proj.bias"] = TensorSpec((C,), "float32")
        out[p + "post_attention_layernorm.weight"] = TensorSpec((C,), "float32")
        for name, shape in (("gate", (F, C)), ("up", (F, C)), ("down", (C, F))):
            out[p + f"mlp.{name}_proj.weight"] = TensorSpec(shape, "linear")
            if cfg.mlp_bias:
                out[p + f"mlp.{name}_proj.bias"] = TensorSpec((shape[0],), "float32")
    out["norm.weight"] = TensorSpec((C,), "float32")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = TensorSpec((V, C), "embedding")
    return out


def gguf_names(cfg: LlamaConfig) -> dict[str, str]:
    """canonical name -> GGUF name, for every tensor of `tensors(cfg)`."""
    out = {}
    for name in tensors(cfg):
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        out[name] = f"blk.{m.group(1)}.{_BLOCK[m.group(2)]}" if m else _TOP[name]
    return out


def fusions(cfg: LlamaConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, parts): q, k, v (weights and biases) -> qkv_proj; gate, up -> gate_up_proj, per layer."""
    out = []
    for i in range(cfg.num_hidden_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        out.append((a + "qkv_proj.weight", tuple(a + f"{n}_proj.weight" for n in "qkv")))
        if cfg.qkv_bias:
            out.append((a + "qkv_proj.bias", tuple(a + f"{n}_proj.bias" for n in "qkv")))
        out.append((m + "gate_up_proj.weight", (m + "gate_proj.weight", m + "up_proj.weight")))
        if cfg.mlp_bias:
            out.append((m + "gate_up_proj.bias", (m + "gate_proj.bias", m + "up_proj.bias")))
    return out
