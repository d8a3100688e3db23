"""Rotary position embeddings as the decoder families configure them: the parameters (`Rope`: the base, the
scaling, the rotated fraction of a head) read from a Hugging Face config.json in either layout seen in the wild
(transformers 5's `rope_parameters`, possibly one per layer type, and the top-level `rope_theta` / `rope_scaling`
published files carry) or from GGUF metadata as llama.cpp's converter writes it, and the tables computed on the
host as transformers computes them (float32 steps), so that every scaling is only a table and the positions stay
on the device.

Scalings: "default", "linear" (positions divided by a factor), "llama3" (Llama 3.1's banded frequencies),
"longrope" (Phi-3's per-frequency short / long factors and an attention factor on cos / sin; "su" is its old
name). Anything else is refused with one line naming the field. numpy-free (the page).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError

ROPE_TYPES = ("default", "linear", "llama3", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' `layer_types` values


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies are scaled (transformers' `rope_parameters` without the base)."""

    type: str = "default"  # one of ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3, longrope
    short_factor: tuple[float, ...] = ()  # longrope: one per frequency, within the original context
    long_factor: tuple[float, ...] = ()  # longrope: beyond it
    attention_factor: float = 1.0  # longrope: cos and sin multiplied by it


@dataclass(frozen=True)
class Rope:
    """A layer's rotary embedding: base `theta`, `scaling`, and the fraction of each head it turns."""

    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling()
    partial_rotary_factor: float = 1.0

    def rotary_dim(self, head_dim: int) -> int:
        """The dims of a head of `head_dim` that rope turns (an even number <= head_dim)."""
        return int(head_dim * self.partial_rotary_factor) // 2 * 2

    def check(self, where: str) -> None:
        if not (math.isfinite(self.theta) and self.theta > 0):
            raise CheckpointError(f"{where}: rope_theta must be a finite number > 0, got {self.theta}")


# -- Hugging Face config.json ------------------------------------------------------------------------------
def rope_from_hf(raw: Mapping[str, Any], where: str, layer_type: str | None = None,
                 theta_default: float = 10000.0, local_theta_key: str | None = None) -> Rope:
    """The rope of a config.json, from either layout: `rope_parameters` (theta and type inside; per layer type
    where it is keyed by "full_attention" / "sliding_attention": `layer_type` picks one), or the top-level
    `rope_theta` + `rope_scaling`. `local_theta_key` (Gemma 3's `rope_local_base_freq`): the base of the
    sliding layers in the top-level layout, whose `rope_scaling` applies to the full layers only."""
    params: Any = raw.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = raw.get("rope_scaling"), "rope_scaling"
        if layer_type == "sliding_attention" and local_theta_key is not None:
            params = None  # (the sliding layers of the top-level layout: no scaling)
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{where}: {key} must be an object or null, got {json.dumps(params)}")
    params = dict(params or {})
    if set(params) & set(LAYER_TYPES):  # one set of parameters per layer type
        if layer_type is None or key != "rope_parameters":
            raise CheckpointError(f"{where}: {key} per layer type is not supported for this architecture")
        sub = params.get(layer_type)
        if sub is not None and not isinstance(sub, dict):
            raise CheckpointError(f"{where}: {key}.{layer_type} must be an object, got {json.dumps(sub)}")
        params, key = dict(sub or {}), f"{key}.{layer_type}"
    if layer_type == "sliding_attention" and local_theta_key:  # (the global rope_theta is not the local base)
        theta = params.get("rope_theta", raw.get(local_theta_key, theta_default))
    else:
        theta = params.get("rope_theta", raw.get("rope_theta", theta_default))
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        raise CheckpointError(f"{where}: rope_theta must be a number, got {theta!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind == "su" else kind
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

    max_pos = raw.get("max_position_embeddings", 8192)
    if kind == "default":
        scaling = RopeScaling()
    elif kind == "linear":
        scaling = RopeScaling("linear", num("factor"))
    elif kind == "llama3":
        scaling = RopeScaling("llama3", num("factor"), num("low_freq_factor"), num("high_freq_factor"),
                              int(num("original_max_position_embeddings", max_pos)))
        if scaling.high_freq_factor == scaling.low_freq_factor:
            raise CheckpointError(f"{where}: {key}: high_freq_factor must differ from low_freq_factor")
    else:
        original = int(num("original_max_position_embeddings", raw.get("original_max_position_embeddings", ...)))
        # (transformers: the factor is max_position_embeddings / original unless given; the attention factor
        # follows from it unless given)
        factor = num("factor") if params.get("factor") is not None else max_pos / original
        attn = params.get("attention_factor")
        attention = num("attention_factor") if attn is not None else \
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        scaling = RopeScaling("longrope", factor, original_max_position_embeddings=original,
                              short_factor=_factors(params, "short_factor", key, where),
                              long_factor=_factors(params, "long_factor", key, where), attention_factor=attention)
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, int | float) or not 0 < partial <= 1:
        raise CheckpointError(f"{where}: partial_rotary_factor must be in (0, 1], got {partial!r}")
    rope = Rope(float(theta), scaling, float(partial))
    rope.check(where)
    return rope


def _factors(params: Mapping[str, Any], name: str, key: str, where: str) -> tuple[float, ...]:
    v = params.get(name)
    if not isinstance(v, list) or not v or not all(
            isinstance(f, int | float) and not isinstance(f, bool) and math.isfinite(f) and f > 0 for f in v):
        raise CheckpointError(f"{where}: {key}.{name} must be a list of numbers > 0 (rope_type 'longrope'), "
                              f"got {json.dumps(v)[:80]}")
    return tuple(float(f) for f in v)


def check_rope_dims(rope: Rope, head_dim: int, where: str) -> None:
    """A longrope's factors: one per rotated pair (none: a GGUF file's, read from its tensors at build)."""
    n = rope.rotary_dim(head_dim) // 2
    for name in ("short_factor", "long_factor"):
        got = getattr(rope.scaling, name)
        if rope.scaling.type == "longrope" and got and len(got) != n:
            raise CheckpointError(f"{where}: rope {name} has {len(got)} factors, the rotary dims need {n}")


# -- GGUF metadata -----------------------------------------------------------------------------------------
def rope_from_gguf(m: Any, head_dim: int, freq_base: str = "rope.freq_base", default_theta: float = 10000.0,
                   long_factors: Sequence[float] | None = None, short_factors: Sequence[float] | None = None) -> Rope:
    """The rope of GGUF metadata (`m` a `config_reader.GGUFMetadata`): `<arch>.rope.freq_base` (or `freq_base`),
    `rope.dimension_count`, `rope.scaling.type` ("none", "linear"), and for a longrope (Phi-3: its factors are
    tensors, `rope_factors_long` / `rope_factors_short`, read by the caller) `rope.scaling.attn_factor` and
    `rope.scaling.original_context_length`."""
    rot = m.int("rope.dimension_count", head_dim)
    theta = m.float(freq_base, default_theta)
    kind = m.raw.get(f"{m.arch}.rope.scaling.type", "none")
    if long_factors is not None and short_factors is not None:
        original = m.int("rope.scaling.original_context_length")
        scaling = RopeScaling("longrope", m.int("context_length") / original, original_max_position_embeddings=original,
                              short_factor=tuple(short_factors), long_factor=tuple(long_factors),
                              attention_factor=m.float("rope.scaling.attn_factor", 1.0))
    elif kind == "linear":
        scaling = RopeScaling("linear", m.float("rope.scaling.factor"))
    elif kind == "none":
        scaling = RopeScaling()
    else:
        raise CheckpointError(f"{m.where}: {m.arch}.rope.scaling.type {kind!r} is not supported (none, linear)")
    rope = Rope(theta, scaling, rot / head_dim if head_dim else 1.0)
    rope.check(m.where)
    return rope


def rope_gguf_metadata(arch: str, rope: Rope, head_dim: int) -> dict[str, Any]:
    """The GGUF keys llama.cpp's converter writes for `rope` (llama3's and longrope's factors are tensors:
    `rope_gguf_tensors`)."""
    out: dict[str, Any] = {f"{arch}.rope.freq_base": rope.theta,
                           f"{arch}.rope.dimension_count": rope.rotary_dim(head_dim)}
    s = rope.scaling
    if s.type == "linear":
        out[f"{arch}.rope.scaling.type"] = "linear"
        out[f"{arch}.rope.scaling.factor"] = s.factor
    elif s.type == "longrope":
        out[f"{arch}.rope.scaling.attn_factor"] = s.attention_factor
        out[f"{arch}.rope.scaling.original_context_length"] = s.original_max_position_embeddings
    return out


def rope_gguf_tensors(rope: Rope, head_dim: int) -> dict[str, list[float]]:
    """The tensors llama.cpp's converter derives from a rope's scaling: llama3's `rope_freqs` (per frequency, the
    divisor that turns the base frequency into the scaled one: `LlamaModel.generate_extra_tensors`), longrope's
    `rope_factors_long` / `rope_factors_short` (Phi-3's lists)."""
    s = rope.scaling
    if s.type == "longrope":  # (none where a GGUF source's tensors hold them: written as its other tensors)
        return {"rope_factors_long.weight": list(s.long_factor), "rope_factors_short.weight": list(s.short_factor)} \
            if s.short_factor else {}
    if s.type != "llama3":
        return {}
    base = Rope(rope.theta, RopeScaling(), rope.partial_rotary_factor)
    low, high = (s.original_max_position_embeddings / f for f in (s.low_freq_factor, s.high_freq_factor))
    factors = []
    for f in inv_freq(base, head_dim):
        wavelen = 2 * math.pi / f
        if wavelen < high:
            factors.append(1.0)
        elif wavelen > low:
            factors.append(s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / \
                (s.high_freq_factor - s.low_freq_factor)
            factors.append(1 / ((1 - smooth) / s.factor + smooth))
    return {"rope_freqs.weight": factors}


# -- rotary tables -----------------------------------------------------------------------------------------
def _f32(x: float) -> float:
    """x rounded to float32 (a float32 operation's result, from the exact or double-precision value)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def inv_freq(rope: Rope, head_dim: int, freq_factors: Sequence[float] | None = None,
             long: bool = False) -> list[float]:
    """The rotary inverse frequencies (rotary_dim / 2 of them), each step in float32 as transformers computes them
    (`_compute_default_rope_parameters`, `..._linear_scaling_...`, `..._llama3_...`, `..._longrope_...`);
    `freq_factors` (a GGUF `rope_freqs` tensor) divides them as llama.cpp does. A longrope's with its short
    factors, or its long ones where `long`."""
    dim = rope.rotary_dim(head_dim)
    base = _f32(rope.theta)
    out = [_f32(1.0 / _f32(base ** _f32(_f32(float(i)) / dim))) for i in range(0, dim, 2)]
    s = rope.scaling
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
    elif s.type == "longrope":  # 1 / (ext * base ** (i / dim)): the pow's float32 result, then the product
        ext = s.long_factor if long else s.short_factor
        if len(ext) != len(out):
            raise CheckpointError(f"rope factors: {len(ext)} given, the rotary dims need {len(out)}")
        out = [_f32(1.0 / _f32(_f32(e) * _f32(base ** _f32(_f32(float(i)) / dim))))
               for e, i in zip(ext, range(0, dim, 2), strict=True)]
    if freq_factors is not None:
        if len(freq_factors) != len(out):
            raise CheckpointError(f"rope_freqs has {len(freq_factors)} factors, the rotary dims need {len(out)}")
        out = [_f32(f / _f32(k)) for f, k in zip(out, freq_factors, strict=True)]
    return out


def rope_tables(rope: Rope, head_dim: int, n_pos: int, freq_factors: Sequence[float] | None = None
                ) -> tuple[bytes, bytes, int]:
    """(cos, sin, R/2): the rope's float32 tables (n_pos, R/2) as little-endian bytes, row p for position p. A
    longrope's rows below its original context come from its short factors, the rest from its long ones (what
    transformers computes for every prompt within the original context and every token decoded after it: it
    switches to the long factors once a sequence outgrows the original context; a prompt longer than that it
    rotates wholly with the long ones), both times its attention factor."""
    s = rope.scaling
    short = inv_freq(rope, head_dim, freq_factors)
    cos, sin = angle_tables(short, n_pos, s.attention_factor)
    if s.type == "longrope" and n_pos > s.original_max_position_embeddings:
        cut = s.original_max_position_embeddings * len(short) * 4  # (bytes of the rows below the original context)
        cos_l, sin_l = angle_tables(inv_freq(rope, head_dim, freq_factors, long=True), n_pos, s.attention_factor)
        cos, sin = cos[:cut] + cos_l[cut:], sin[:cut] + sin_l[cut:]
    return cos, sin, len(short)


def angle_tables(freqs: Sequence[float], n_pos: int, scale: float = 1.0) -> tuple[bytes, bytes]:
    """(cos, sin) float32 tables (n_pos, len(freqs)) as little-endian bytes: row p holds cos / sin of the float32
    angle p * f (as transformers' float32 `inv_freq @ position_ids`), times `scale` (a longrope's attention
    factor: transformers multiplies its cos and sin)."""
    np: Any
    try:
        import numpy as np
    except ImportError:
        np = None
    s32 = _f32(scale)
    if np is not None:  # the same numbers, faster: float32 angles, cos / sin in float64 rounded to float32
        ang = np.arange(n_pos, dtype=np.float32)[:, None] * np.asarray(freqs, np.float32)[None, :]
        cos = np.cos(ang.astype(np.float64)).astype(np.float32)
        sin = np.sin(ang.astype(np.float64)).astype(np.float32)
        if scale != 1.0:
            cos, sin = cos * np.float32(s32), sin * np.float32(s32)
        return cos.astype("<f4").tobytes(), sin.astype("<f4").tobytes()
    cos, sin = [], []
    for p in range(n_pos):
        for f in freqs:
            a = _f32(f * p)
            cos.append(_f32(math.cos(a)) * s32 if scale != 1.0 else math.cos(a))
            sin.append(_f32(math.sin(a)) * s32 if scale != 1.0 else math.sin(a))
    fmt = f"<{len(cos)}f"
    return struct.pack(fmt, *cos), struct.pack(fmt, *sin)
