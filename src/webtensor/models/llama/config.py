"""`LlamaConfig`: the Llama family's hyper-parameters — Llama 2/3.x and SmolLM2 (`llama`), Mistral-style configs
without a sliding window (`mistral`), Qwen2/2.5 (`qwen2`: q/k/v biases) and Qwen3 (`qwen3`: QK-norm, an explicit
head_dim) — read from a Hugging Face config.json (both layouts seen in the wild: top-level `rope_theta` /
`rope_scaling` as published Llama 3.x files have them, and transformers 5's `rope_parameters`) or from GGUF
metadata as llama.cpp's converter writes it. What changes the computation and is not supported (another rope type,
a sliding window, another activation, ...) is refused with one line naming the field; keys transformers' own
model ignores are ignored here too.

`rope_tables` computes the rotary cos / sin tables on the host the way transformers does (float32 steps), so that
every rope scaling is only a table and the positions stay on the device. numpy-free (the page).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CheckpointError
from ..config_reader import GGUFMetadata, JSONConfig, token_id, token_ids
from ..spec import ModelSpec

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies are scaled (transformers' `rope_parameters`)."""

    type: str = "default"  # "default", "linear" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3


@dataclass(frozen=True)
class LlamaConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    partial_rotary_factor: float = 1.0
    rope_interleaved: bool = False  # llama.cpp's GGUF llama files: Q/K rows permuted for interleaved pairs
    rope_freq_factors: bool = False  # GGUF llama 3.1+: a `rope_freqs` tensor divides the frequencies
    qkv_bias: bool = False  # biases on q, k, v (Qwen2; attention_bias in Llama / Qwen3)
    o_bias: bool = False  # a bias on o_proj (attention_bias in Llama / Qwen3)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: an RMS norm over each head of q and k before rope
    tie_word_embeddings: bool = False
    eos_token_id: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rope turns (an even number <= head_dim)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec("llama", self.architecture, self.max_position_embeddings, self.vocab_size,
                         self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                         self.hidden_size, frozenset(self.eos_token_id), self.bos_token_id)

    # -- Hugging Face config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf(cls, raw: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        arch = raw.get("model_type")
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"{where}: model_type {arch!r} is not a Llama-family architecture")
        req = JSONConfig(raw, where, null_as_default=True)
        C = req.int("hidden_size")
        H = req.int("num_attention_heads")
        KV = H if raw.get("num_key_value_heads") is None else req.int("num_key_value_heads")
        D = req.int("head_dim", None) or (128 if arch == "qwen3" else C // H if H else 0)  # (transformers' defaults)
        act = raw.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise CheckpointError(f"{where}: hidden_act {act!r} is not supported (the Llama family's MLP is SwiGLU: "
                                  "silu)")
        if arch in ("qwen2", "qwen3") and (raw.get("use_sliding_window") or "sliding_attention" in
                                           (raw.get("layer_types") or [])):
            raise CheckpointError(f"{where}: use_sliding_window = true: sliding-window attention is not supported")
        window = req.int("sliding_window", None)
        max_pos = req.int("max_position_embeddings", 2048 if arch == "llama" else 32768)
        if arch == "mistral" and window is not None and window < max_pos:
            raise CheckpointError(f"{where}: sliding_window = {window}: sliding-window attention is not supported "
                                  f"(max_position_embeddings is {max_pos})")
        if raw.get("quantization_config") is not None:
            raise CheckpointError(f"{where}: quantization_config is set: pre-quantized HF checkpoints are not "
                                  "supported (use a GGUF file, or dtype='q8_0' on a float checkpoint)")
        theta, scaling, partial = _rope_from_hf(raw, where)
        # transformers reads attention_bias for llama and qwen3 only (qwen2: q/k/v biases always, none on o_proj;
        # mistral: none), and mlp_bias for llama only: the other architectures ignore the keys, and so does this
        attention_bias = req.bool("attention_bias", False) if arch in ("llama", "qwen3") else False
        mlp_bias = req.bool("mlp_bias", False) if arch == "llama" else False
        cfg = cls(
            architecture=arch, vocab_size=req.int("vocab_size"), hidden_size=C,
            intermediate_size=req.int("intermediate_size"), num_hidden_layers=req.int("num_hidden_layers"),
            num_attention_heads=H, num_key_value_heads=KV, head_dim=D, max_position_embeddings=max_pos,
            rms_norm_eps=req.float("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=scaling,
            partial_rotary_factor=partial,
            qkv_bias=arch == "qwen2" or attention_bias, o_bias=attention_bias, mlp_bias=mlp_bias,
            qk_norm=arch == "qwen3",
            tie_word_embeddings=req.bool("tie_word_embeddings", False),
            eos_token_id=token_ids(raw.get("eos_token_id"), "eos_token_id", where),
            bos_token_id=token_id(raw.get("bos_token_id"), "bos_token_id", where))
        cfg.check(where)
        return cfg

    # -- GGUF metadata --------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> LlamaConfig:
        arch = meta.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"{where}: general.architecture {arch!r} is not a Llama-family architecture")
        m = GGUFMetadata(meta, arch, where)
        C, H = m.int("embedding_length"), m.int("attention.head_count")
        KV = m.int("attention.head_count_kv", H)
        D = m.int("attention.key_length", C // H if H else 0)
        rot = m.int("rope.dimension_count", D)
        kind = meta.get(f"{arch}.rope.scaling.type", "none")
        if kind not in ("none", "linear"):
            raise CheckpointError(f"{where}: {arch}.rope.scaling.type {kind!r} is not supported (none, linear)")
        scaling = RopeScaling("linear", m.float("rope.scaling.factor")) if kind == "linear" else RopeScaling()
        if m.int("attention.sliding_window", None) is not None:
            raise CheckpointError(f"{where}: {arch}.attention.sliding_window is set: sliding-window attention is "
                                  "not supported")
        names = set(tensor_names)
        cfg = cls(
            architecture=arch, vocab_size=m.vocab_size(), hidden_size=C,
            intermediate_size=m.int("feed_forward_length"),
            num_hidden_layers=m.int("block_count"), num_attention_heads=H, num_key_value_heads=KV, head_dim=D,
            max_position_embeddings=m.int("context_length"),
            rms_norm_eps=m.float("attention.layer_norm_rms_epsilon"),
            rope_theta=m.float("rope.freq_base", 10000.0), rope_scaling=scaling,
            partial_rotary_factor=rot / D if D else 1.0,
            rope_interleaved=arch in ("llama", "mistral"),  # llama.cpp's converter permutes Q/K rows for these
            rope_freq_factors="rope_freqs.weight" in names,
            qkv_bias="blk.0.attn_q.bias" in names, o_bias="blk.0.attn_output.bias" in names,
            mlp_bias="blk.0.ffn_up.bias" in names, qk_norm="blk.0.attn_q_norm.weight" in names,
            tie_word_embeddings="output.weight" not in names,
            eos_token_id=m.token_ids("tokenizer.ggml.eos_token_id"),
            bos_token_id=m.token_id("tokenizer.ggml.bos_token_id"))
        cfg.check(where)
        return cfg

    def check(self, where: str) -> None:
        sizes = dict(vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                     num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                     num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                     max_position_embeddings=self.max_position_embeddings)
        for k, v in sizes.items():
            if v <= 0:
                raise CheckpointError(f"{where}: {k} must be a positive integer, got {v}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(f"{where}: num_attention_heads = {self.num_attention_heads} is not a multiple of "
                                  f"num_key_value_heads = {self.num_key_value_heads}")
        if self.head_dim % 2 or self.rotary_dim <= 0:
            raise CheckpointError(f"{where}: head_dim = {self.head_dim} (rotary dims {self.rotary_dim}) must be even "
                                  "and rotate at least one pair")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise CheckpointError(f"{where}: rms_norm_eps must be a finite number >= 0, got {self.rms_norm_eps}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise CheckpointError(f"{where}: rope_theta must be a finite number > 0, got {self.rope_theta}")
        for name, ids in (("eos_token_id", self.eos_token_id),
                          ("bos_token_id", () if self.bos_token_id is None else (self.bos_token_id,))):
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise CheckpointError(f"{where}: {name} = {bad[0]} is out of range for vocab_size = {self.vocab_size}")


def _rope_from_hf(raw: dict[str, Any], where: str) -> tuple[float, RopeScaling, float]:
    """(theta, scaling, partial rotary factor) from either layout: transformers 5's `rope_parameters` (theta and
    type inside), or the top-level `rope_theta` + `rope_scaling` published Llama 3.x configs carry."""
    params = raw.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = raw.get("rope_scaling"), "rope_scaling"
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{where}: {key} must be an object or null, got {json.dumps(params)}")
    params = dict(params or {})
    if "sliding_attention" in params or "full_attention" in params:  # per-layer-type parameters
        raise CheckpointError(f"{where}: {key} per layer type is not supported")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        raise CheckpointError(f"{where}: rope_theta must be a number, got {theta!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise CheckpointError(f"{where}: {key}.rope_type {kind!r} is not supported (webtensor runs "
                              f"{', '.join(ROPE_TYPES)})")

    def num(name: str, default: Any = ...) -> float:
        v = params.get(name, default)
        if v is ...:
            raise CheckpointError(f"{where}: {key}.{name} is needed for rope_type {kind!r}")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise CheckpointError(f"{where}: {key}.{name} must be a finite number > 0, got {v!r}")
        return float(v)

    if kind == "default":
        scaling = RopeScaling()
    elif kind == "linear":
        scaling = RopeScaling("linear", num("factor"))
    else:
        scaling = RopeScaling("llama3", num("factor"), num("low_freq_factor"), num("high_freq_factor"),
                              int(num("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))))
        if scaling.high_freq_factor == scaling.low_freq_factor:
            raise CheckpointError(f"{where}: {key}: high_freq_factor must differ from low_freq_factor")
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, int | float) or not 0 < partial <= 1:
        raise CheckpointError(f"{where}: partial_rotary_factor must be in (0, 1], got {partial!r}")
    return float(theta), scaling, float(partial)


# -- rotary tables ------------------------------------------------------------------------------------------
def _f32(x: float) -> float:
    """x rounded to float32 (a float32 operation's result, from the exact or double-precision value)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def inv_freq(cfg: LlamaConfig, freq_factors: Sequence[float] | None = None) -> list[float]:
    """The rotary inverse frequencies (rotary_dim / 2 of them), each step in float32 as transformers computes them
    (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`);
    `freq_factors` (a GGUF `rope_freqs` tensor) divides them as llama.cpp does."""
    dim = cfg.rotary_dim
    base = _f32(cfg.rope_theta)
    out = [_f32(1.0 / _f32(base ** _f32(_f32(float(i)) / dim))) for i in range(0, dim, 2)]
    s = cfg.rope_scaling
    if s.type == "linear":
        out = [_f32(f / _f32(s.factor)) for f in out]
    elif s.type == "llama3":
        low_wavelen = _f32(s.original_max_position_embeddings / s.low_freq_factor)
        high_wavelen = _f32(s.original_max_position_embeddings / s.high_freq_factor)
        two_pi, span = _f32(2 * math.pi), _f32(s.high_freq_factor - s.low_freq_factor)
        scaled = []
        for f in out:
            wavelen = _f32(two_pi / f)
            g = _f32(f / _f32(s.factor)) if wavelen > low_wavelen else f
            if not wavelen < high_wavelen and not wavelen > low_wavelen:  # the medium band: interpolate
                smooth = _f32(_f32(_f32(s.original_max_position_embeddings / wavelen) - _f32(s.low_freq_factor))
                              / span)
                g = _f32(_f32(_f32(_f32(1.0 - smooth) * g) / _f32(s.factor)) + _f32(smooth * g))
            scaled.append(g)
        out = scaled
    if freq_factors is not None:
        if len(freq_factors) != len(out):
            raise CheckpointError(f"rope_freqs has {len(freq_factors)} factors, the rotary dims need {len(out)}")
        out = [_f32(f / _f32(k)) for f, k in zip(out, freq_factors, strict=True)]
    return out


def rope_tables(freqs: Sequence[float], n_pos: int) -> tuple[bytes, bytes]:
    """(cos, sin) float32 tables (n_pos, len(freqs)) as little-endian bytes: row p holds cos / sin of the float32
    angle p * f (as transformers' float32 `inv_freq @ position_ids`)."""
    np: Any
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:  # the same numbers, faster: float32 angles, cos / sin in float64 rounded to float32
        ang = np.arange(n_pos, dtype=np.float32)[:, None] * np.asarray(freqs, np.float32)[None, :]
        return (np.cos(ang.astype(np.float64)).astype("<f4").tobytes(),
                np.sin(ang.astype(np.float64)).astype("<f4").tobytes())
    cos, sin = [], []
    for p in range(n_pos):
        for f in freqs:
            a = _f32(f * p)
            cos.append(math.cos(a))
            sin.append(math.sin(a))
    fmt = f"<{len(cos)}f"
    return struct.pack(fmt, *cos), struct.pack(fmt, *sin)
