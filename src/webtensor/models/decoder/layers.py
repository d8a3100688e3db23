"""The pieces of a decoder layer the families' forwards are written with, over webtensor ops:

- `rope_per_layer`: each layer's rotary tables on the device (one (2, n_ctx, R/2) tensor per distinct rope, so
  the fused attention kernel binds cos and sin as one buffer);
- `Attention` (the q, k, v / fused qkv projections, their biases, QK-norms, o_proj) and `attention_qkv`: the
  rows' q, k, v (T, heads, D) with the norm in the product's prologue and the QK-norm after;
- `GatedMLP` (gate and up, or one fused gate_up, and down) and `gated_mlp`: down(act(gate) * up), the gate
  applied in the down product's prologue where gate and up are one matrix;
- `DecoderWeights`: the weights every family has (embedding, LM head, final norm, rotary tables, attention), and
  the steps every forward takes: `embed_rows` (the float32 residual stream), `self_attention` (qkv -> attend ->
  output projection, the residual in its epilogue where given), `final_logits` (final norm + LM head).

Matrices arrive as the loader hands them: float matrices as (K, N) views (x @ W), quantized ones as (N, K)
`QuantWeight`s; q, k, v (and gate, up) fused where they were stored alike.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any

from ... import dtypes as dt
from ... import ops
from ...runtime.batch import StepBatch, lm_head_weight
from ...tensor import Tensor, from_buffer
from .config import DecoderConfig
from .rope import Rope, rope_tables

Norm = tuple[Tensor, float]  # an RMS norm's (weight, eps), as `ops.linear(..., rms=...)` takes it


def rope_per_layer(cfg: DecoderConfig, params: dict[str, Any], device: Any, n_ctx: int) -> list[ops.Rope]:
    """Each layer's (cos, sin, interleaved) for `n_ctx` positions: the tables of `cfg.layer_rope(i)` (divided by a
    GGUF `rope_freqs` tensor where the file has one; a longrope's factors from a GGUF file's `rope_factors_*`
    tensors), each distinct rope uploaded once."""
    factors = params.get("rope_freqs.weight")
    made: dict[Rope, ops.Rope] = {}
    out = []
    for i in range(cfg.num_hidden_layers):
        rope = cfg.layer_rope(i)
        if rope.scaling.type == "longrope" and not rope.scaling.short_factor:  # a GGUF file's: from its tensors
            rope = replace(rope, scaling=replace(rope.scaling, short_factor=tuple(floats(
                params["rope_factors_short.weight"])), long_factor=tuple(floats(params["rope_factors_long.weight"]))))
        if rope not in made:
            cos, sin, half = rope_tables(rope, cfg.head_dim, n_ctx, None if factors is None else floats(factors))
            # the cos and sin tables (n_ctx, R/2) as views of one (2, n_ctx, R/2) tensor: one binding in the
            # fused attention kernel
            tables = from_buffer(cos + sin, (2, n_ctx, half), dt.float32, device)
            made[rope] = (tables[0], tables[1], cfg.rope_interleaved)
        out.append(made[rope])
    return out


def floats(t: Tensor) -> list[float]:
    """A small float32 tensor's values (read back once, at build time)."""
    raw = t.tobytes()
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@dataclass
class Attention:
    """One layer's attention weights (`params` names under `pre` = "layers.{i}.self_attn.")."""

    qkv: Any  # the fused (K, Q + 2 KV) matrix, or None where q, k, v are stored apart
    qkv_bias: Tensor | None
    q: Any
    k: Any
    v: Any
    q_bias: Tensor | None
    k_bias: Tensor | None
    v_bias: Tensor | None
    q_norm: Tensor | None  # (D,) per head, or (H x D,) over the projection
    k_norm: Tensor | None
    o: Any
    o_bias: Tensor | None

    @classmethod
    def of(cls, p: dict[str, Any], pre: str) -> Attention:
        return cls(p.get(pre + "qkv_proj.weight"), p.get(pre + "qkv_proj.bias"), p.get(pre + "q_proj.weight"),
                   p.get(pre + "k_proj.weight"), p.get(pre + "v_proj.weight"), p.get(pre + "q_proj.bias"),
                   p.get(pre + "k_proj.bias"), p.get(pre + "v_proj.bias"), p.get(pre + "q_norm.weight"),
                   p.get(pre + "k_norm.weight"), p[pre + "o_proj.weight"], p.get(pre + "o_proj.bias"))


def attention_qkv(x: Tensor, w: Attention, heads: tuple[int, int, int], norm: Norm | None,
                  eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """q (T, H, D), k and v (T, KV, D) of rows x (T, ..., C), RMS-normed by `norm` in the products' prologue
    (None: as they are). QK-norm where the layer has one (`eps`): over each head where its weight is (D,)
    (Qwen3, Gemma 3), over the whole projection before the split into heads where it is (H x D,) (OLMo-2)."""
    H, KV, D = heads
    T = x.shape[0]
    if w.qkv is not None:
        qkv = ops.linear(x, w.qkv, w.qkv_bias, rms=norm).reshape(T, H + 2 * KV, D)
        q, k, v = qkv[:, :H], qkv[:, H:H + KV], qkv[:, H + KV:]
    else:
        q, k, v = (ops.linear(x, m, bias, rms=norm).reshape(T, n, D)
                   for m, bias, n in ((w.q, w.q_bias, H), (w.k, w.k_bias, KV), (w.v, w.v_bias, KV)))
    if w.q_norm is not None and w.k_norm is not None:
        if w.q_norm.shape[0] == D:  # each head of q and k
            q, k = ops.rms_norm(q, w.q_norm, eps), ops.rms_norm(k, w.k_norm, eps)
        else:  # the whole projection (a (T, H x D) view of the heads)
            q = ops.rms_norm(q.reshape(T, H * D), w.q_norm, eps).reshape(T, H, D)
            k = ops.rms_norm(k.reshape(T, KV * D), w.k_norm, eps).reshape(T, KV, D)
    return q, k, v


@dataclass
class GatedMLP:
    """One layer's gated MLP (`params` names under `pre` = "layers.{i}.mlp.")."""

    gate_up: Any  # the fused (K, 2F) matrix [gate | up], or None
    gate_up_bias: Tensor | None
    gate: Any
    up: Any
    gate_bias: Tensor | None
    up_bias: Tensor | None
    down: Any
    down_bias: Tensor | None

    @classmethod
    def of(cls, p: dict[str, Any], pre: str) -> GatedMLP:
        return cls(p.get(pre + "gate_up_proj.weight"), p.get(pre + "gate_up_proj.bias"),
                   p.get(pre + "gate_proj.weight"), p.get(pre + "up_proj.weight"), p.get(pre + "gate_proj.bias"),
                   p.get(pre + "up_proj.bias"), p[pre + "down_proj.weight"], p.get(pre + "down_proj.bias"))


def gated_mlp(x: Tensor, w: GatedMLP, norm: Norm | None, residual: Tensor | None = None,
              glu: str = "swiglu") -> Tensor:
    """down(act(gate(h)) * up(h)) (+ residual) of h = x RMS-normed by `norm` (None: x itself), act silu (`glu`
    "swiglu") or gelu_tanh ("geglu"): with gate and up one matrix, the gate runs in the down product's prologue
    (`ops.linear(..., glu=...)`)."""
    if w.gate_up is not None:  # (..., 2F) [gate | up]
        gu = ops.linear(x, w.gate_up, w.gate_up_bias, rms=norm)
        return ops.linear(gu, w.down, w.down_bias, residual=residual, glu=glu)
    gate = ops.swiglu if glu == "swiglu" else ops.geglu
    h = gate(ops.linear(x, w.gate, w.gate_bias, rms=norm), ops.linear(x, w.up, w.up_bias, rms=norm))
    return ops.linear(h, w.down, w.down_bias, residual=residual)


class DecoderWeights:
    """The weights every decoder family has, on `device` (`params`: by canonical name, fused names where the loader
    fused): the embedding, the LM head, the final norm, each layer's rotary tables for `n_ctx` positions and its
    attention. A family's weights class adds its own (norms, MLPs) and its `forward`."""

    def __init__(self, cfg: DecoderConfig, params: dict[str, Any], device: Any, n_ctx: int):
        self.device, self.width, self.eps = device, cfg.hidden_size, cfg.rms_norm_eps  # (C; every RMS norm's eps)
        self.heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)  # (H, KV, D)
        self.embed = params["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(params.get("lm_head.weight", self.embed))  # x @ head: (C, V); tied: the embedding
        self.norm: Tensor = params["norm.weight"]  # (C,)
        self.rope = rope_per_layer(cfg, params, device, n_ctx)
        self.attns = [Attention.of(params, f"layers.{i}.self_attn.") for i in range(cfg.num_hidden_layers)]

    @staticmethod
    def per_layer(params: dict[str, Any], n_layers: int, name: str) -> list[Tensor]:
        """Each layer's `layers.{i}.{name}.weight` (a norm's (C,) weight)."""
        return [params[f"layers.{i}.{name}.weight"] for i in range(n_layers)]


def embed_rows(w: DecoderWeights, batch: StepBatch, scale: Tensor | None = None) -> Tensor:
    """The residual stream of the step's rows: embed[ids] (T, C) in float32 (whatever the table's type), times
    `scale` where given, shaped as the step's rows (T, ..., C)."""
    x = ops.embedding(w.embed, batch.ids)  # (T, C)
    if x.dtype is not dt.float32:
        x = ops.cast(x, dt.float32)
    if scale is not None:
        x = ops.mul(x, scale)
    return x.reshape(batch.rows(w.width))


def self_attention(x: Tensor, w: Attention, batch: StepBatch, kv: tuple[Tensor, Tensor], heads: tuple[int, int, int],
                   norm: Norm | None, eps: float, scale: float, rope: ops.Rope, window: int | None = None,
                   softcap: float | None = None, residual: Tensor | None = None) -> Tensor:
    """One layer's attention of rows x (T, ..., C): q, k, v of x RMS-normed by `norm` (`attention_qkv`), the rows'
    attention over the layer's cache `kv` (`StepBatch.attend`: q, k rotated by `rope`, scores times `scale`, in
    `window`, soft-capped by `softcap`) and its output projection (T, ..., C), `residual` added in the product's
    epilogue where given."""
    H, _, D = heads
    q, k, v = attention_qkv(x, w, heads, norm, eps)  # (T, H, D), (T, KV, D) x 2
    a = batch.attend(kv[0], kv[1], q, k, v, scale, rope=rope, window=window, softcap=softcap)  # (T, H, D)
    return ops.linear(a.reshape(batch.rows(H * D)), w.o, w.o_bias, residual=residual)  # (T, ..., C)


def final_logits(x: Tensor, w: DecoderWeights, batch: StepBatch) -> Tensor:
    """The logits (rows needing them, V) float32 of the residual stream x (T, ..., C): RMS-normed by the final
    norm in the LM head product's prologue."""
    return batch.logits(ops.linear(batch.head_input(x), w.head, rms=(w.norm, w.eps)))
