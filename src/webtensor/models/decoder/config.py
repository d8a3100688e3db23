"""`DecoderConfig`: the hyper-parameters every decoder-only family of the Llama lineage shares — sizes, norm
epsilon, rope (per layer type where the layers differ), sliding windows per layer, the tied head, the EOS / BOS ids
— and their standard reads: from a Hugging Face config.json (`hf_fields`) and from GGUF metadata as llama.cpp's
converter writes it (`gguf_fields`), and back to GGUF metadata (`gguf_metadata`). A family's config subclasses it
with its own fields and reads them after the standard ones; anything it does not support is refused with one
line naming the field. numpy-free (the page).

Sliding windows: layer i attends to the keys of positions p - window + 1 .. p (transformers' `sliding_window`;
llama.cpp's n_swa with the standard mask) where `layer_types[i]` is "sliding_attention", to every earlier
position otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...errors import CheckpointError
from ..config_reader import GGUFMetadata, JSONConfig, token_id, token_ids
from ..spec import ModelSpec
from .rope import LAYER_TYPES, Rope, check_rope_dims, rope_from_gguf, rope_gguf_metadata, rope_gguf_tensors

FULL, SLIDING = LAYER_TYPES


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    FAMILY: ClassVar[str] = "decoder"  # the registry's name of the family (each subclass sets its own)

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
    rope: Rope = field(default_factory=Rope)  # the full-attention layers' (all layers' where rope_local is None)
    rope_local: Rope | None = None  # the sliding layers' where it differs (Gemma 3: another base)
    rope_interleaved: bool = False  # llama.cpp's GGUF llama files: Q/K rows permuted for interleaved pairs
    rope_freq_factors: bool = False  # GGUF llama 3.1+: a `rope_freqs` tensor divides the frequencies
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # per layer, FULL or SLIDING; () every layer full
    tie_word_embeddings: bool = False
    eos_token_id: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rope turns (an even number <= head_dim)."""
        return self.rope.rotary_dim(self.head_dim)

    @property
    def gguf_architecture(self) -> str:
        """The `general.architecture` llama.cpp's converter writes for this architecture."""
        return self.architecture

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window (positions each query sees, itself included), or None: every one."""
        return self.sliding_window if self.layer_types and self.layer_types[layer] == SLIDING else None

    def layer_rope(self, layer: int) -> Rope:
        return self.rope_local if self.rope_local is not None and self.window(layer) is not None else self.rope

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.FAMILY, self.architecture, self.max_position_embeddings, self.vocab_size,
                         self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                         self.hidden_size, frozenset(self.eos_token_id), self.bos_token_id, self.kv_window)

    @property
    def kv_window(self) -> int | None:
        """The largest window among the layers where every layer slides (what the KV cache must keep behind a
        query), else None."""
        windows = [self.window(i) for i in range(self.num_hidden_layers)]
        return None if None in windows else max(w for w in windows if w is not None)

    def check(self, where: str) -> None:
        """The standard checks: positive sizes, heads that group, an even rotated part, finite eps and bases, token
        ids within the vocabulary, a window per sliding layer."""
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
        for rope in (self.rope, self.rope_local):
            if rope is None:
                continue
            if self.head_dim % 2 or rope.rotary_dim(self.head_dim) <= 0:
                raise CheckpointError(f"{where}: head_dim = {self.head_dim} (rotary dims "
                                      f"{rope.rotary_dim(self.head_dim)}) must be even and rotate at least one pair")
            rope.check(where)
            check_rope_dims(rope, self.head_dim, where)
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps >= 0):
            raise CheckpointError(f"{where}: rms_norm_eps must be a finite number >= 0, got {self.rms_norm_eps}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise CheckpointError(f"{where}: layer_types lists {len(self.layer_types)} layers, the model has "
                                  f"{self.num_hidden_layers}")
        if SLIDING in self.layer_types and (self.sliding_window is None or self.sliding_window < 1):
            raise CheckpointError(f"{where}: sliding_window must be a positive integer where a layer slides, got "
                                  f"{self.sliding_window}")
        for name, ids in (("eos_token_id", self.eos_token_id),
                          ("bos_token_id", () if self.bos_token_id is None else (self.bos_token_id,))):
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise CheckpointError(f"{where}: {name} = {bad[0]} is out of range for vocab_size = {self.vocab_size}")


def architecture(source: Mapping[str, Any], key: str, known: Collection[str], family: str, where: str) -> str:
    """`source[key]` (config.json's model_type, a GGUF file's general.architecture) where it is one of a family's
    `known` names; else a CheckpointError naming the key and its value (`family`: what it is not, e.g. "a
    Llama-family architecture")."""
    arch = source.get(key)
    if arch not in known:
        raise CheckpointError(f"{where}: {key} {arch!r} is not {family}")
    return str(arch)


# -- Hugging Face config.json ------------------------------------------------------------------------------
def hf_fields(raw: Mapping[str, Any], where: str, *, max_positions: int, head_dim: int | None = None,
              rms_norm_eps: float = 1e-6, tie: bool = False, acts: Sequence[str] = ("silu", "swish"),
              act_key: str = "hidden_act", eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    """The standard keys of a config.json as `DecoderConfig` fields (`architecture` from `model_type`; rope,
    windows and anything family-specific left to the family): each default where the key is absent is the
    family's transformers default (`max_positions`, `head_dim` (None: hidden_size / heads), `rms_norm_eps`,
    `tie`). `acts`: the MLP activations the family runs (`act_key` names another refused in one line); a
    `quantization_config` is refused."""
    req = JSONConfig(raw, where, null_as_default=True)
    C, H = req.int("hidden_size"), req.int("num_attention_heads")
    KV = H if raw.get("num_key_value_heads") is None else req.int("num_key_value_heads")
    D = req.int("head_dim", None) or (head_dim if head_dim is not None else C // H if H else 0)
    act = raw.get(act_key, acts[0])
    if act not in acts:
        raise CheckpointError(f"{where}: {act_key} {act!r} is not supported (this family's MLP runs "
                              f"{' / '.join(acts)})")
    if raw.get("quantization_config") is not None:
        raise CheckpointError(f"{where}: quantization_config is set: pre-quantized HF checkpoints are not "
                              "supported (use a GGUF file, or dtype='q8_0' on a float checkpoint)")
    return dict(
        architecture=raw.get("model_type"), vocab_size=req.int("vocab_size"), hidden_size=C,
        intermediate_size=req.int("intermediate_size"), num_hidden_layers=req.int("num_hidden_layers"),
        num_attention_heads=H, num_key_value_heads=KV, head_dim=D,
        max_position_embeddings=req.int("max_position_embeddings", max_positions),
        rms_norm_eps=req.float(eps_key, rms_norm_eps), tie_word_embeddings=req.bool("tie_word_embeddings", tie),
        eos_token_id=token_ids(raw.get("eos_token_id"), "eos_token_id", where),
        bos_token_id=token_id(raw.get("bos_token_id"), "bos_token_id", where))


def hf_layer_types(raw: Mapping[str, Any], where: str, n_layer: int,
                   default: Callable[[int], str] | None = None) -> tuple[str, ...]:
    """Each layer's attention type: config.json's `layer_types` where given (each "full_attention" or
    "sliding_attention"), else `default(i)` per layer (the family's pattern), else () (every layer full)."""
    types = raw.get("layer_types")
    if types is None:
        return tuple(default(i) for i in range(n_layer)) if default is not None else ()
    if not isinstance(types, list) or not all(t in LAYER_TYPES for t in types):
        raise CheckpointError(f"{where}: layer_types must be a list of {' / '.join(map(repr, LAYER_TYPES))}, "
                              f"got {str(types)[:80]}")
    return tuple(types)


def hf_window(raw: Mapping[str, Any], where: str, default: int | None = None) -> int | None:
    """config.json's `sliding_window` (a positive integer, or null), `default` where absent."""
    if raw.get("sliding_window", default) is None:  # (null: no window, as transformers writes Mistral's)
        return None
    w = JSONConfig(raw, where).int("sliding_window", default) if "sliding_window" in raw else default
    if w is not None and w < 1:
        raise CheckpointError(f"{where}: sliding_window must be a positive integer or null, got {w}")
    return w


# -- GGUF metadata -----------------------------------------------------------------------------------------
def gguf_fields(meta: Mapping[str, Any], tensor_names: Sequence[str], where: str,
                key_length: bool = True) -> tuple[GGUFMetadata, dict[str, Any]]:
    """(the metadata reader, the standard fields) of GGUF metadata as llama.cpp's converter writes it:
    `<arch>.embedding_length`, `.block_count`, `.attention.head_count(_kv)`, `.attention.key_length` (the head
    dim, `key_length` False: embedding / heads only, as llama.cpp's granite), `.context_length`,
    `.attention.layer_norm_rms_epsilon`, the rope, the vocabulary, the token ids; the head is tied where no
    `output.weight` is stored."""
    arch = meta.get("general.architecture")
    m = GGUFMetadata(meta, str(arch), where)
    C, H = m.int("embedding_length"), m.int("attention.head_count")
    D = m.int("attention.key_length", C // H if H else 0) if key_length else C // H if H else 0
    return m, dict(
        architecture=arch, vocab_size=m.vocab_size(), hidden_size=C, intermediate_size=m.int("feed_forward_length"),
        num_hidden_layers=m.int("block_count"), num_attention_heads=H,
        num_key_value_heads=m.int("attention.head_count_kv", H), head_dim=D,
        max_position_embeddings=m.int("context_length"), rms_norm_eps=m.float("attention.layer_norm_rms_epsilon"),
        rope=rope_from_gguf(m, D), tie_word_embeddings="output.weight" not in set(tensor_names),
        eos_token_id=m.token_ids("tokenizer.ggml.eos_token_id"), bos_token_id=m.token_id("tokenizer.ggml.bos_token_id"))


def gguf_layer_types(m: GGUFMetadata, n_layer: int, pattern: int) -> tuple[str, ...]:
    """Each layer's attention type from `<arch>.attention.sliding_window_pattern`: a list of booleans (True:
    sliding), or a period n (every n-th layer full, the others sliding: llama.cpp's `set_swa_pattern`), or
    `pattern` (the family's period) where absent."""
    v = m.raw.get(f"{m.arch}.attention.sliding_window_pattern", pattern)
    if isinstance(v, list):
        if len(v) != n_layer or not all(isinstance(b, bool) for b in v):
            raise CheckpointError(f"{m.where}: metadata '{m.arch}.attention.sliding_window_pattern' must list one "
                                  f"boolean per layer ({n_layer})")
        return tuple(SLIDING if b else FULL for b in v)
    n = m.int("attention.sliding_window_pattern", pattern)
    return tuple(SLIDING if n == 0 or i % n < n - 1 else FULL for i in range(n_layer))


def gguf_metadata(cfg: DecoderConfig) -> dict[str, Any]:
    """The standard GGUF keys of `cfg` as llama.cpp's converter writes them (the family adds its own)."""
    a = cfg.gguf_architecture
    meta: dict[str, Any] = {
        f"{a}.context_length": cfg.max_position_embeddings, f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size, f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.attention.head_count": cfg.num_attention_heads, f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps, f"{a}.vocab_size": cfg.vocab_size,
        **rope_gguf_metadata(a, cfg.rope, cfg.head_dim)}
    if cfg.sliding_window is not None and SLIDING in cfg.layer_types:
        meta[f"{a}.attention.sliding_window"] = cfg.sliding_window
        meta[f"{a}.attention.sliding_window_pattern"] = [t == SLIDING for t in cfg.layer_types]
    if cfg.rope_local is not None:
        meta[f"{a}.rope.freq_base_swa"] = cfg.rope_local.theta
    return meta


def gguf_tensors(cfg: DecoderConfig) -> dict[str, list[float]]:
    """The tensors llama.cpp's converter derives from `cfg`'s rope (`rope.rope_gguf_tensors`)."""
    return rope_gguf_tensors(cfg.rope, cfg.head_dim)
