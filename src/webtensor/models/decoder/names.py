"""The standard tensor map of the decoder families: each weight's canonical name (Hugging Face's, without the
"model." prefix), its shape and role, its name in llama.cpp's GGUF files (gguf-py's tensor_mapping), and the
fusions the loader makes (q, k, v -> one qkv matrix; gate, up -> one gate_up matrix) where the parts are stored
alike. A family lists its weights with the helpers below and names them through `gguf_names` with its own
overrides (Gemma's and OLMo-2's `post_attention_layernorm` is llama.cpp's `post_attention_norm`, not the
`ffn_norm` it is for Llama). numpy-free."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..spec import TensorSpec
from .config import DecoderConfig

_IGNORED = re.compile(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq")  # a buffer some old checkpoints stored

# canonical suffix under layers.{i}. -> GGUF suffix under blk.{i}.
BLOCK: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "self_attn.qkv_proj.bias": "attn_qkv.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # (Phi-3's fused gate | up: llama.cpp keeps it as ffn_up, 2F rows)
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.down_proj.bias": "ffn_down.bias",
}
# the post-norm layout (Gemma 2/3, OLMo-2): a norm after attention and one after the MLP
POST_NORMS: dict[str, str] = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
TOP: dict[str, str] = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                       "lm_head.weight": "output.weight", "rope_freqs.weight": "rope_freqs.weight",
                       "rope_factors_long.weight": "rope_factors_long.weight",
                       "rope_factors_short.weight": "rope_factors_short.weight"}


def canonical(key: str) -> str | None:
    """A checkpoint key's canonical name: "model." dropped; None for buffers that are not weights."""
    name = key.removeprefix("model.")
    return None if _IGNORED.fullmatch(name) else name


def gguf_names(names: Iterable[str], block: Mapping[str, str] = BLOCK) -> dict[str, str]:
    """canonical name -> GGUF name for each of `names`, block weights through `block`."""
    out = {}
    for name in names:
        m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
        out[name] = f"blk.{m.group(1)}.{block[m.group(2)]}" if m else TOP[name]
    return out


def attention(cfg: DecoderConfig, out: dict[str, TensorSpec], pre: str, *, bias: bool = False,
              o_bias: bool = False, qk_norm: int = 0, fused: bool = False) -> None:
    """Layer `pre`'s attention weights into `out`: q, k, v ((heads x head_dim, C) each; `fused`: one
    qkv_proj, as Phi-3 stores it) with biases where `bias`, o_proj (C, heads x head_dim) with a bias where
    `o_bias`, and `qk_norm` > 0: q_norm / k_norm weights (head_dim,) per head (Qwen3, Gemma 3), or over the
    whole projection where `qk_norm` is 2 (OLMo-2)."""
    C, D = cfg.hidden_size, cfg.head_dim
    Q, KV = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    a = pre + "self_attn."
    parts = (("qkv", Q + 2 * KV),) if fused else (("q", Q), ("k", KV), ("v", KV))
    for name, n in parts:
        out[a + f"{name}_proj.weight"] = TensorSpec((n, C), "linear")
        if bias:
            out[a + f"{name}_proj.bias"] = TensorSpec((n,), "float32")
    if qk_norm:
        out[a + "q_norm.weight"] = TensorSpec((Q if qk_norm == 2 else D,), "float32")
        out[a + "k_norm.weight"] = TensorSpec((KV if qk_norm == 2 else D,), "float32")
    out[a + "o_proj.weight"] = TensorSpec((C, Q), "linear")
    if o_bias:
        out[a + "o_proj.bias"] = TensorSpec((C,), "float32")


def mlp(cfg: DecoderConfig, out: dict[str, TensorSpec], pre: str, *, bias: bool = False,
        fused: bool = False) -> None:
    """Layer `pre`'s gated MLP into `out`: gate and up (F, C) (`fused`: one gate_up_proj (2F, C), Phi-3's), down
    (C, F), biases where `bias`."""
    C, F = cfg.hidden_size, cfg.intermediate_size
    m = pre + "mlp."
    parts = (("gate_up", (2 * F, C)), ("down", (C, F))) if fused else \
        (("gate", (F, C)), ("up", (F, C)), ("down", (C, F)))
    for name, shape in parts:
        out[m + f"{name}_proj.weight"] = TensorSpec(shape, "linear")
        if bias:
            out[m + f"{name}_proj.bias"] = TensorSpec((shape[0],), "float32")


def norms(cfg: DecoderConfig, out: dict[str, TensorSpec], pre: str, *names: str) -> None:
    """Norm weights (C,) of layer `pre` by their HF names ("input_layernorm", ...)."""
    for name in names:
        out[pre + f"{name}.weight"] = TensorSpec((cfg.hidden_size,), "float32")


def embeddings(cfg: DecoderConfig) -> dict[str, TensorSpec]:
    """The token embedding (V, C): the first weight every family loads."""
    return {"embed_tokens.weight": TensorSpec((cfg.vocab_size, cfg.hidden_size), "embedding")}


def head(cfg: DecoderConfig, out: dict[str, TensorSpec]) -> None:
    """The final norm (C,) and, where not tied, the LM head (V, C): the last weights of every family."""
    out["norm.weight"] = TensorSpec((cfg.hidden_size,), "float32")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = TensorSpec((cfg.vocab_size, cfg.hidden_size), "embedding")


def fusions(cfg: DecoderConfig, qkv_bias: bool = False, mlp_bias: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, parts): q, k, v (weights, and biases where `qkv_bias`) -> qkv_proj; gate, up -> gate_up_proj
    (and their biases where `mlp_bias`), per layer."""
    out = []
    for i in range(cfg.num_hidden_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        out.append((a + "qkv_proj.weight", tuple(a + f"{n}_proj.weight" for n in "qkv")))
        if qkv_bias:
            out.append((a + "qkv_proj.bias", tuple(a + f"{n}_proj.bias" for n in "qkv")))
        out.append((m + "gate_up_proj.weight", (m + "gate_proj.weight", m + "up_proj.weight")))
        if mlp_bias:
            out.append((m + "gate_up_proj.bias", (m + "gate_proj.bias", m + "up_proj.bias")))
    return out


_QK = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")


def qk_rows(cfg: DecoderConfig, name: str, arr: Any, to_interleaved: bool) -> Any:
    """Weight `name` (a numpy array, HF layout) with its Q / K rows (and biases) moved per head between HF's
    rotate-half pairs (i, i + R/2) and llama.cpp's interleaved pairs (2i, 2i + 1), as llama.cpp's converter
    permutes them for the architectures it runs with "normal" rope (`llama`, `granite`); `to_interleaved`
    False undoes it. Other weights as they are."""
    if not name.endswith(_QK):
        return arr
    heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
    n, shape = arr.shape[0] // heads // 2, arr.shape
    if to_interleaved:
        return arr.reshape(heads, 2, n, *shape[1:]).swapaxes(1, 2).reshape(shape)
    return arr.reshape(heads, n, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
