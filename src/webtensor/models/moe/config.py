"""`MoEConfig`: the mixture-of-experts family's hyper-parameters — Qwen3-MoE (`qwen3_moe`: QK-norm per head,
`norm_topk_prob`, `moe_intermediate_size`, dense layers by `mlp_only_layers` / `decoder_sparse_step`), Mixtral
(`mixtral`: the top-k weights renormalized, as its softmax over the top-k logits is) and OLMoE (`olmoe`: QK-norm
over the whole projection, `norm_topk_prob`) — from a Hugging Face config.json (both layouts) or from GGUF
metadata as llama.cpp's converter writes it (`qwen3moe`, `olmoe`; Mixtral as `llama` with `llama.expert_count`).
The standard keys through `models.decoder.config`, the experts' here; what is not supported (a sliding window,
OLMoE's clip_qkv, ...) is refused with one line naming the field. numpy-free (the page).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ..config_reader import JSONConfig
from ..decoder.config import DecoderConfig, architecture, gguf_fields, hf_fields
from ..decoder.rope import rope_from_hf

ARCHITECTURES = ("qwen3_moe", "mixtral", "olmoe")
GGUF_ARCHITECTURES = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "olmoe": "olmoe"}
_FROM_GGUF = {"qwen3moe": "qwen3_moe", "olmoe": "olmoe", "llama": "mixtral"}


@dataclass(frozen=True, kw_only=True)
class MoEConfig(DecoderConfig):
    FAMILY = "moe"

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # each expert's hidden width (Mixtral / OLMoE: intermediate_size)
    norm_topk_prob: bool  # the top-k weights divided by their sum
    sparse: tuple[bool, ...]  # per layer: experts (True) or a dense gated MLP of intermediate_size
    qk_norm: int = 0  # 1: RMS norm over each head of q and k (Qwen3-MoE); 2: over the whole projection (OLMoE)
    stacked_experts: bool = False  # the experts stored as one (E, N, K) tensor per projection (GGUF's ffn_*_exps)

    @property
    def gguf_architecture(self) -> str:
        return GGUF_ARCHITECTURES[self.architecture]

    def check(self, where: str) -> None:
        super().check(where)
        if self.num_experts < 1 or not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise CheckpointError(f"{where}: num_experts_per_tok = {self.num_experts_per_tok} must be in 1 .. "
                                  f"num_experts = {self.num_experts}")
        if self.moe_intermediate_size < 1:
            raise CheckpointError(f"{where}: moe_intermediate_size must be a positive integer, got "
                                  f"{self.moe_intermediate_size}")

    # -- Hugging Face config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> MoEConfig:
        arch = architecture(raw, "model_type", ARCHITECTURES, "a mixture-of-experts architecture", where)
        req = JSONConfig(raw, where, null_as_default=True)
        fields = hf_fields(raw, where, max_positions={"qwen3_moe": 32768, "mixtral": 4096 * 32, "olmoe": 4096}[arch],
                           head_dim=128 if arch == "qwen3_moe" else None,
                           rms_norm_eps={"qwen3_moe": 1e-6, "mixtral": 1e-5, "olmoe": 1e-5}[arch])
        # transformers' names: Qwen3-MoE / OLMoE `num_experts` (transformers 5 saves it as `num_local_experts`),
        # Mixtral `num_local_experts`
        n_exp = req.int("num_experts", None) if "num_experts" in raw else None
        E = n_exp if n_exp is not None else req.int("num_local_experts", 8 if arch == "mixtral" else 64)
        window = req.int("sliding_window", None)
        if window is not None and (arch != "mixtral" or window < fields["max_position_embeddings"]):
            raise CheckpointError(f"{where}: sliding_window = {window}: sliding-window attention is not supported")
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{where}: use_sliding_window = true: sliding-window attention is not supported")
        if arch == "olmoe" and raw.get("clip_qkv") is not None:
            raise CheckpointError(f"{where}: clip_qkv = {raw['clip_qkv']!r}: clipping q, k, v is not supported")
        if req.bool("attention_bias", False):
            raise CheckpointError(f"{where}: attention_bias = true is not supported for {arch}")
        n = fields["num_hidden_layers"]
        if arch == "qwen3_moe":
            step = req.int("decoder_sparse_step", 1)
            dense = set(raw.get("mlp_only_layers") or [])
            if step < 1:
                raise CheckpointError(f"{where}: decoder_sparse_step must be a positive integer, got {step}")
            sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(n))
            width = req.int("moe_intermediate_size", 768)
        else:
            sparse, width = (True,) * n, fields["intermediate_size"]
        cfg = cls(**fields, rope=rope_from_hf(raw, where), num_experts=E,
                  num_experts_per_tok=req.int("num_experts_per_tok", 2 if arch == "mixtral" else 8),
                  moe_intermediate_size=width,
                  norm_topk_prob=True if arch == "mixtral" else req.bool("norm_topk_prob", False),
                  sparse=sparse, qk_norm={"qwen3_moe": 1, "mixtral": 0, "olmoe": 2}[arch])
        cfg.check(where)
        return cfg

    # -- GGUF metadata --------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> MoEConfig:
        garch = architecture(meta, "general.architecture", _FROM_GGUF, "a mixture-of-experts architecture", where)
        arch = _FROM_GGUF[garch]
        m, fields = gguf_fields(meta, tensor_names, where)
        fields["architecture"] = arch
        if m.int("attention.sliding_window", None) is not None:
            raise CheckpointError(f"{where}: {garch}.attention.sliding_window is set: sliding-window attention is "
                                  "not supported")
        names = set(tensor_names)
        n = fields["num_hidden_layers"]
        sparse = tuple(f"blk.{i}.ffn_gate_inp.weight" in names for i in range(n))
        width = m.int("expert_feed_forward_length", fields["intermediate_size"])
        # llama.cpp: qwen3moe renormalizes by `expert_weights_norm` (its converter writes norm_topk_prob there;
        # absent: true, as llama.cpp's default for the architecture); olmoe does not; Mixtral always does
        norm = {"qwen3_moe": m.bool("expert_weights_norm", True), "mixtral": True,
                "olmoe": m.bool("expert_weights_norm", False)}[arch]
        cfg = cls(**fields, rope_interleaved=arch == "mixtral", num_experts=m.int("expert_count"),
                  num_experts_per_tok=m.int("expert_used_count"), moe_intermediate_size=width, norm_topk_prob=norm,
                  sparse=sparse, qk_norm={"qwen3_moe": 1, "mixtral": 0, "olmoe": 2}[arch], stacked_experts=True)
        cfg.check(where)
        return cfg


def gguf_accepts(meta: Mapping[str, Any]) -> bool:
    """Whether a GGUF file is this family's: its architecture's, and (Mixtral is written as `llama`) with experts."""
    arch = meta.get("general.architecture")
    return arch in _FROM_GGUF and (arch != "llama" or bool(meta.get("llama.expert_count")))
