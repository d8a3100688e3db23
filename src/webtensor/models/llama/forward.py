"""The Llama family's forward pass, written once over webtensor ops for every path (a prompt, the captured decode
step, a batched server step; the CPU reference and WebGPU; natively and in the page):

    x = embed[ids]
    per layer:  h = rms_norm(x);  q, k, v = h @ Wqkv (+ bias);  (Qwen3: q, k = rms_norm per head)
                a = attention over the KV cache (grouped-query) of q, k rotated at the rows' positions
                x = x + a @ Wo;  h = rms_norm(x);  x = x + (silu(h @ Wgate) * (h @ Wup)) @ Wdown
    logits = rms_norm(x) @ lm_head.T   (lm_head: the embedding when tied)

Matrices arrive as the loader hands them: float matrices as (K, N) views (x @ W), quantized ones as (N, K)
`QuantWeight`s; q, k, v (and gate, up) fused into one matrix where they were stored alike. The rms norms run in
the products' prologues, the rotary embedding inside the attention step (`StepBatch.attend`), the gate
silu(g) * u of a fused gate_up output in the down product's prologue (`ops.linear(..., glu="swiglu")`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import dtypes as dt
from ... import ops
from ...runtime.batch import StepBatch, lm_head_weight
from ...runtime.cache import KVCache
from ...tensor import Tensor, from_buffer
from .config import LlamaConfig, inv_freq, rope_tables


@dataclass
class LlamaBlock:
    attn_norm: Tensor
    qkv: Any  # the fused (K, Q + 2 KV) matrix, or None where q, k, v are stored apart
    qkv_bias: Tensor | None
    q: Any
    k: Any
    v: Any
    q_bias: Tensor | None
    k_bias: Tensor | None
    v_bias: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    o: Any
    o_bias: Tensor | None
    mlp_norm: Tensor
    gate_up: Any  # the fused (K, 2F) matrix, or None
    gate_up_bias: Tensor | None
    gate: Any
    up: Any
    gate_bias: Tensor | None
    up_bias: Tensor | None
    down: Any
    down_bias: Tensor | None


class LlamaWeights:
    """The weights by role (`params`: by canonical name, fused names where the loader fused) and the rotary tables
    for `n_ctx` positions, on `device`; `forward(batch, cache)` runs the model."""

    def __init__(self, cfg: LlamaConfig, params: dict[str, Any], device: Any, n_ctx: int):
        self.config, self.device = cfg, device
        self.embed = params["embed_tokens.weight"]  # (V, C)
        self.head = lm_head_weight(params.get("lm_head.weight", self.embed))  # x @ head: (C, V)
        self.norm = params["norm.weight"]
        factors = params.get("rope_freqs.weight")
        freqs = inv_freq(cfg, None if factors is None else _floats(factors))
        cos, sin = rope_tables(freqs, n_ctx)
        # the cos and sin tables (n_ctx, R/2) as views of one (2, n_ctx, R/2) tensor: one binding in the
        # fused attention kernel
        tables = from_buffer(cos + sin, (2, n_ctx, len(freqs)), dt.float32, device)
        self.rope: ops.Rope = (tables[0], tables[1], cfg.rope_interleaved)
        self.blocks = [self._block(params, f"layers.{i}.") for i in range(cfg.num_hidden_layers)]

    @staticmethod
    def _block(p: dict[str, Any], pre: str) -> LlamaBlock:
        a, m = pre + "self_attn.", pre + "mlp."
        return LlamaBlock(
            p[pre + "input_layernorm.weight"], p.get(a + "qkv_proj.weight"), p.get(a + "qkv_proj.bias"),
            p.get(a + "q_proj.weight"), p.get(a + "k_proj.weight"), p.get(a + "v_proj.weight"),
            p.get(a + "q_proj.bias"), p.get(a + "k_proj.bias"), p.get(a + "v_proj.bias"),
            p.get(a + "q_norm.weight"), p.get(a + "k_norm.weight"), p[a + "o_proj.weight"], p.get(a + "o_proj.bias"),
            p[pre + "post_attention_layernorm.weight"], p.get(m + "gate_up_proj.weight"),
            p.get(m + "gate_up_proj.bias"),
            p.get(m + "gate_proj.weight"), p.get(m + "up_proj.weight"), p.get(m + "gate_proj.bias"),
            p.get(m + "up_proj.bias"), p[m + "down_proj.weight"], p.get(m + "down_proj.bias"))

    def forward(self, batch: StepBatch, cache: KVCache) -> Tensor:
        """Rows of (token, position, slot) -> logits (rows needing them, V) float32."""
        cfg = self.config
        T, C = batch.T, cfg.hidden_size
        H, KV, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        x = ops.embedding(self.embed, batch.ids)  # (T, C)
        if x.dtype is not dt.float32:
            x = ops.cast(x, dt.float32)  # the residual stream stays float32
        x = x.reshape(batch.rows(C))
        for kc, vc, b in zip(cache.k, cache.v, self.blocks, strict=True):
            norm = (b.attn_norm, eps)
            if b.qkv is not None:
                qkv = ops.linear(x, b.qkv, b.qkv_bias, rms=norm).reshape(T, H + 2 * KV, D)
                q, k, v = qkv[:, :H], qkv[:, H:H + KV], qkv[:, H + KV:]
            else:
                q, k, v = (ops.linear(x, w, bias, rms=norm).reshape(T, n, D)
                           for w, bias, n in ((b.q, b.q_bias, H), (b.k, b.k_bias, KV), (b.v, b.v_bias, KV)))
            if b.q_norm is not None and b.k_norm is not None:  # Qwen3's QK-norm: each head of q and k
                q, k = ops.rms_norm(q, b.q_norm, eps), ops.rms_norm(k, b.k_norm, eps)
            a = batch.attend(kc, vc, q, k, v, D ** -0.5, rope=self.rope)  # (T, H, D)
            x = ops.linear(a.reshape(batch.rows(H * D)), b.o, b.o_bias, residual=x)
            norm = (b.mlp_norm, eps)
            if b.gate_up is not None:  # (..., 2F) [gate | up]; the down product takes silu(gate) * up
                gu = ops.linear(x, b.gate_up, b.gate_up_bias, rms=norm)
                x = ops.linear(gu, b.down, b.down_bias, residual=x, glu="swiglu")
            else:
                h = ops.swiglu(ops.linear(x, b.gate, b.gate_bias, rms=norm), ops.linear(x, b.up, b.up_bias, rms=norm))
                x = ops.linear(h, b.down, b.down_bias, residual=x)
        return batch.logits(ops.linear(batch.head_input(x), self.head, rms=(self.norm, eps)))


def _floats(t: Tensor) -> list[float]:
    import struct

    raw = t.tobytes()
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))
