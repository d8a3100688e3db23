"""The mixture-of-experts family's tensor map over the standard decoder names (`models.decoder.names`): each
layer's norms and attention (QK-norm per head for Qwen3-MoE, over the projection for OLMoE), then on a sparse
layer the router (E, C) and the experts, on a dense one (Qwen3-MoE's `mlp_only_layers`) the gated MLP.

Experts, as Hugging Face checkpoints store them, are one (N, K) matrix per expert and projection
(`mlp.experts.{e}.gate_proj.weight`; Mixtral's `block_sparse_moe.experts.{e}.w1 / w3 / w2`); the loader stacks
each projection's E matrices along the rows into one (E x N, K) stack (`fusions`), which `ops.expert_linear`
reads. GGUF files store the stack itself (`ffn_gate_exps` / `ffn_up_exps` / `ffn_down_exps`, (E, N, K)), named
here `mlp.experts.{gate,up,down}_proj.weight` (the config's `stacked_experts`); `formats.gguf_writer` stacks the
per-expert matrices that share a GGUF name. Canonical names are Qwen3-MoE's: Mixtral's are renamed on the way in
(`canonical`) and out (`gguf_names` only names the canonical ones). numpy-free."""

from __future__ import annotations

import re

from ..decoder import names as std
from ..spec import TensorSpec
from .config import MoEConfig

PROJECTIONS = ("gate", "up", "down")
_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_GGUF = {"mlp.gate.weight": "ffn_gate_inp.weight", **{f"mlp.experts.{p}_proj.weight": f"ffn_{p}_exps.weight"
                                                      for p in PROJECTIONS}}


def canonical(key: str) -> str | None:
    """A checkpoint key's canonical name: Mixtral's `block_sparse_moe.` is `mlp.` and its w1 / w3 / w2 are
    gate_proj / up_proj / down_proj."""
    name = std.canonical(key)
    if name is None:
        return None
    m = re.fullmatch(r"(layers\.\d+\.)block_sparse_moe\.(gate\.weight|experts\.\d+\.)(w[123])?(\.weight)?", name)
    if m is None:
        return name
    return m.group(1) + "mlp." + m.group(2) + (_MIXTRAL[m.group(3)] + m.group(4) if m.group(3) else "")


def expert_parts(cfg: MoEConfig, layer: int, proj: str) -> tuple[str, ...]:
    """Layer `layer`'s per-expert matrices of projection `proj` ("gate", "up", "down"), in expert order."""
    return tuple(f"layers.{layer}.mlp.experts.{e}.{proj}_proj.weight" for e in range(cfg.num_experts))


def tensors(cfg: MoEConfig) -> dict[str, TensorSpec]:
    """Every weight the model reads, in load order (HF layout; the experts stacked where the file stacks them)."""
    out = std.embeddings(cfg)
    C, F, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        std.norms(cfg, out, p, "input_layernorm")
        std.attention(cfg, out, p, qk_norm=cfg.qk_norm)
        std.norms(cfg, out, p, "post_attention_layernorm")
        if not cfg.sparse[i]:
            std.mlp(cfg, out, p)
            continue
        out[p + "mlp.gate.weight"] = TensorSpec((E, C), "linear")
        for proj in PROJECTIONS:
            shape = (F, C) if proj != "down" else (C, F)
            if cfg.stacked_experts:
                out[p + f"mlp.experts.{proj}_proj.weight"] = TensorSpec((E, *shape), "experts")
            else:
                out.update({name: TensorSpec(shape, "experts") for name in expert_parts(cfg, i, proj)})
    std.head(cfg, out)
    return out


def gguf_names(cfg: MoEConfig) -> dict[str, str]:
    """canonical name -> GGUF name, for every tensor of `tensors(cfg)`: each expert's matrix named by the stack
    it goes into (`formats.gguf_writer` stacks those that share a name, in order)."""
    out = {}
    for name in tensors(cfg):
        m = re.fullmatch(r"layers\.(\d+)\.mlp\.experts\.(?:\d+\.)?(\w+)_proj\.weight", name)
        if m is not None:
            out[name] = f"blk.{m.group(1)}.ffn_{m.group(2)}_exps.weight"
        elif (g := re.fullmatch(r"layers\.(\d+)\.(mlp\.gate\.weight)", name)) is not None:
            out[name] = f"blk.{g.group(1)}.{_GGUF[g.group(2)]}"
        else:
            out.update(std.gguf_names([name]))
    return out


def fusions(cfg: MoEConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(fused name, parts): q, k, v -> qkv_proj; a dense layer's gate, up -> gate_up_proj; per-expert matrices ->
    each projection's stack `mlp.experts.{proj}_proj.weight` (E x N, K)."""
    out = [f for f in std.fusions(cfg) if ".mlp." not in f[0]]
    for i in range(cfg.num_hidden_layers):
        if not cfg.sparse[i]:
            m = f"layers.{i}.mlp."
            out.append((m + "gate_up_proj.weight", (m + "gate_proj.weight", m + "up_proj.weight")))
        elif not cfg.stacked_experts:
            out += [(f"layers.{i}.mlp.experts.{proj}_proj.weight", expert_parts(cfg, i, proj))
                    for proj in PROJECTIONS]
    return out
