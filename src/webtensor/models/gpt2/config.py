"""GPT2Config: the hyper-parameters of a GPT-2 checkpoint, read from Hugging Face's config.json.

Every key a config.json may hold is in FIELDS, with what webtensor does with it: "used" (it changes
what webtensor computes, and is implemented), "checked" (only the value that means plain GPT-2
inference is accepted; any other is refused with a CheckpointError naming the key and value), or
"ignored" (it does not change the model's output: training, other heads, metadata, or defaults for
Hugging Face's own generate()). A key not in the table is refused too: webtensor cannot know what
it would change. The numpy-free browser page reads checkpoints through this module as well.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ..config_reader import GGUFMetadata, JSONConfig, token_id, token_ids
from ..spec import ModelSpec

# The four released sizes, for benchmarks with random weights (no download).
PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}

# Hugging Face's ACT2FN names -> webtensor.activations names (the fused `linear` epilogue)
ACTIVATIONS = {
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_accurate": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu_erf", "gelu_python": "gelu_erf", "gelu_10": "gelu_erf_clip10",
    "quick_gelu": "quick_gelu", "relu": "relu", "relu2": "relu2", "relu6": "relu6", "leaky_relu": "leaky_relu",
    "sigmoid": "sigmoid", "tanh": "tanh", "silu": "silu", "swish": "silu", "hardswish": "hardswish",
    "mish": "mish", "laplace": "laplace", "sqrtsoftplus": "sqrt_softplus", "linear": None,
}
REFUSED_ACTIVATIONS = {"prelu": "it has a learned slope", "xielu": "it has learned parameters"}

_GENERATION = "a default for Hugging Face's generate(); webtensor's sampling is set per call (API / CLI)"
_IO = "what Hugging Face's forward() returns; no effect on the logits"
_HEADS = "configures a classification head, which webtensor does not run"
_META = "metadata"


@dataclass(frozen=True)
class Field:
    kind: str  # "used", "checked" or "ignored"
    note: str


def used(note: str) -> Field:
    return Field("used", note)


def checked(note: str) -> Field:
    return Field("checked", note)


def ignored(note: str) -> Field:
    return Field("ignored", note)


def _fields() -> dict[str, Field]:
    table = {
        # the architecture
        "model_type": checked('must be "gpt2"'),
        "vocab_size": used("rows of wte (and lm_head); checked against the tensors and the tokenizer"),
        "n_positions": used("rows of wpe: the context length; checked against the tensors"),
        "n_ctx": checked("legacy name of the context length: must equal n_positions"),
        "n_embd": used("the width; checked against the tensors"),
        "n_layer": used("the number of blocks; checked against the tensors"),
        "n_head": used("attention heads (n_embd must be a multiple)"),
        "n_inner": used("the MLP width, null meaning 4 * n_embd; checked against the tensors"),
        "activation_function": used("the MLP activation, fused into the linear epilogue: "
                                    + ", ".join(ACTIVATIONS) + "; refused: " + ", ".join(REFUSED_ACTIVATIONS)),
        "layer_norm_epsilon": used("the eps of every layer norm"),
        "scale_attn_weights": used("false: attention scores are not divided by sqrt(head_dim)"),
        "scale_attn_by_inverse_layer_idx": used("true: layer i's scores are also divided by i + 1"),
        "reorder_and_upcast_attn": used("accepted: it reorders the scaling and upcasts to float32 for mixed-"
                                        "precision training; webtensor's attention already runs in float32 "
                                        "with the same scale, so the result is the same up to rounding"),
        "tie_word_embeddings": used("true: the LM head is wte; false: the checkpoint's lm_head.weight"),
        "eos_token_id": used("generation stops at it (an id, a list of ids, or null); must be < vocab_size"),
        "bos_token_id": used("checked to be < vocab_size; not prepended to prompts (nor by Hugging Face)"),
        "add_cross_attention": checked("must be false: webtensor runs decoder-only GPT-2, no encoder"),
        "is_encoder_decoder": checked("must be false"),
        "pruned_heads": checked("must be empty: pruned attention heads are not supported"),
        "quantization_config": checked("must be absent: quantized checkpoints are not supported"),
        "auto_map": checked("must be absent: custom modelling code is not run"),
        # training only
        "resid_pdrop": ignored("dropout: training only"),
        "embd_pdrop": ignored("dropout: training only"),
        "attn_pdrop": ignored("dropout: training only"),
        "initializer_range": ignored("weight initialisation: training only"),
        "gradient_checkpointing": ignored("training only"),
        "use_cache": ignored("webtensor always decodes with its KV cache (the same logits)"),
        # GPT2DoubleHeadsModel's multiple-choice head (its multiple_choice_head.* tensors are skipped)
        "summary_type": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        "summary_use_proj": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        "summary_activation": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        "summary_proj_to_labels": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        "summary_first_dropout": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        "summary_last_dropout": ignored("GPT2DoubleHeadsModel's multiple-choice head, not run"),
        # other heads, and what a forward() call returns
        "id2label": ignored(_HEADS), "label2id": ignored(_HEADS), "num_labels": ignored(_HEADS),
        "problem_type": ignored(_HEADS), "finetuning_task": ignored(_HEADS),
        "output_hidden_states": ignored(_IO), "output_attentions": ignored(_IO), "return_dict": ignored(_IO),
        "torchscript": ignored("torch export option (unties weights by copying: the same values)"),
        "output_past": ignored("legacy name of use_cache"),
        "chunk_size_feed_forward": ignored("GPT-2's MLP does not chunk; chunking would not change the result"),
        "is_decoder": ignored("GPT-2 is always causal"),
        "cross_attention_hidden_size": ignored("cross attention is refused (add_cross_attention)"),
        "tie_encoder_decoder": ignored("encoder-decoder models only (is_encoder_decoder is refused)"),
        "_attn_implementation": ignored("eager / sdpa / flash: the same attention, up to rounding"),
        "_attn_implementation_autoset": ignored(_META),
        # dtypes: webtensor's dtype argument decides; weights are converted as they load
        "dtype": ignored("the dtype of the stored weights; webtensor's dtype argument decides"),
        "torch_dtype": ignored("legacy name of dtype"),
        "use_bfloat16": ignored("legacy TensorFlow option"),
        "tf_legacy_loss": ignored("TensorFlow training only"),
        "xla_device": ignored("legacy TensorFlow option"),
        # token ids other than bos / eos
        "pad_token_id": ignored("webtensor generates one unpadded sequence"),
        "sep_token_id": ignored("not used by GPT-2"),
        "decoder_start_token_id": ignored("encoder-decoder models only"),
        # metadata
        "architectures": ignored(_META + ": the tensors decide (extra heads' tensors are refused)"),
        "transformers_version": ignored(_META), "_name_or_path": ignored(_META), "_commit_hash": ignored(_META),
        "tokenizer_class": ignored(_META + ": the tokenizer files decide"),
        "prefix": ignored("a prompt prefix for Hugging Face pipelines"),
        # legacy keys of the released checkpoints' configs (gpt2-medium / -large, distilgpt2)
        "n_special": ignored("an OpenAI-GPT field; Hugging Face's GPT-2 does not read it"),
        "predict_special_tokens": ignored("an OpenAI-GPT field; Hugging Face's GPT-2 does not read it"),
        "_num_labels": ignored(_HEADS),
        "task_specific_params": ignored("defaults for Hugging Face pipelines"),
    }
    for key in ("max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
                "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
                "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
                "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
                "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
                "suppress_tokens", "begin_suppress_tokens"):
        table[key] = ignored(_GENERATION)
    return table


FIELDS: dict[str, Field] = _fields()

# "checked" fields: the values accepted (absent is always fine)
_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "add_cross_attention": (False,), "is_encoder_decoder": (False,), "pruned_heads": ({},),
    "quantization_config": (), "auto_map": (),
}


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | tuple[int, ...] | None = 50256
    bos_token_id: int | None = 50256
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def inner_dim(self) -> int:
        """The MLP width: n_inner, or 4 * n_embd when it is null."""
        return 4 * self.n_embd if self.n_inner is None else self.n_inner

    @property
    def act(self) -> str | None:
        """The MLP activation as a `webtensor.activations` name (None: identity)."""
        return ACTIVATIONS[self.activation_function]

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id generation stops at (empty when eos_token_id is null)."""
        e = self.eos_token_id
        return frozenset() if e is None else frozenset((e,) if isinstance(e, int) else e)

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec("gpt2", "gpt2", self.n_positions, self.vocab_size, self.n_layer, self.n_head, self.n_head,
                         self.head_dim, self.n_embd, self.eos_ids, self.bos_token_id)

    def attn_scale(self, layer: int) -> float:
        """What layer `layer`'s (0-based) attention multiplies q . k by, as Hugging Face's GPT2Attention."""
        scale = self.head_dim ** -0.5 if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    @classmethod
    def preset(cls, name: str, **overrides: int) -> GPT2Config:
        key = name.split("/")[-1]
        if key not in PRESETS:
            raise CheckpointError(f"unknown GPT-2 size {name!r}: expected one of {', '.join(PRESETS)}")
        sizes: dict[str, Any] = {**PRESETS[key], **overrides}
        return cls(**sizes)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> GPT2Config:
        """Parse and validate a config.json's object; CheckpointError names the key and value refused."""
        if raw.get("model_type", "gpt2") != "gpt2":
            raise CheckpointError(f"{where}: model_type is {raw.get('model_type')!r}, not 'gpt2'")
        missing = [k for k in ("vocab_size", "n_embd", "n_layer", "n_head") if k not in raw]
        if missing:
            raise CheckpointError(f"{where} lacks required keys: {', '.join(missing)}")
        for key, value in raw.items():
            _check_known(key, value, where)
        act = raw.get("activation_function", "gelu_new")
        if not isinstance(act, str):  # (a list or an object cannot be looked up: refused by name, not a TypeError)
            raise CheckpointError(f"{where}: activation_function = {_show(act)} is not supported: expected one of "
                                  f"{', '.join(ACTIVATIONS)}")
        if act in REFUSED_ACTIVATIONS:
            raise CheckpointError(f"{where}: activation_function {act!r} is not supported ({REFUSED_ACTIVATIONS[act]})")
        if act not in ACTIVATIONS:
            raise CheckpointError(f"{where}: activation_function {act!r} is not supported: expected one of "
                                  f"{', '.join(ACTIVATIONS)}")
        req = JSONConfig(raw, where)
        eos = raw.get("eos_token_id")
        eos_ids = token_ids(eos, "eos_token_id", where)
        cfg = cls(
            vocab_size=req.int("vocab_size"), n_positions=req.int("n_positions", 1024), n_embd=req.int("n_embd"),
            n_layer=req.int("n_layer"), n_head=req.int("n_head"),
            layer_norm_epsilon=req.float("layer_norm_epsilon", 1e-5),
            eos_token_id=eos_ids if isinstance(eos, list) else (eos_ids[0] if eos_ids else None),
            bos_token_id=token_id(raw.get("bos_token_id"), "bos_token_id", where),
            n_inner=req.int("n_inner", None), activation_function=act,
            scale_attn_weights=req.bool("scale_attn_weights", True),
            scale_attn_by_inverse_layer_idx=req.bool("scale_attn_by_inverse_layer_idx", False),
            reorder_and_upcast_attn=req.bool("reorder_and_upcast_attn", False),
            tie_word_embeddings=req.bool("tie_word_embeddings", True),
        )
        cfg._check_sizes(raw, where)
        return cfg

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], tensor_names: Sequence[str], where: str) -> GPT2Config:
        """The config of a GGUF file's `gpt2.*` metadata (llama.cpp's converter's keys)."""
        m = GGUFMetadata(meta, "gpt2", where)
        cfg = cls(vocab_size=m.vocab_size(), n_positions=m.int("context_length"), n_embd=m.int("embedding_length"),
                  n_layer=m.int("block_count"), n_head=m.int("attention.head_count"),
                  layer_norm_epsilon=m.float("attention.layer_norm_epsilon"),
                  eos_token_id=m.token_id("tokenizer.ggml.eos_token_id"),
                  bos_token_id=m.token_id("tokenizer.ggml.bos_token_id"))
        if min(cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) <= 0 or cfg.n_embd % cfg.n_head:
            raise CheckpointError(f"{where}: inconsistent sizes (embedding_length={cfg.n_embd} must be a positive "
                                  f"multiple of head_count={cfg.n_head}, all sizes > 0)")
        if not 0 <= cfg.layer_norm_epsilon < math.inf:
            raise CheckpointError(f"{where}: layer_norm_epsilon must be finite and >= 0, got {cfg.layer_norm_epsilon}")
        ff = m.int("feed_forward_length", None)
        if ff is not None and ff != cfg.inner_dim:  # (llama.cpp reads any MLP width)
            if ff <= 0:
                raise CheckpointError(f"{where}: feed_forward_length must be a positive integer, got {ff}")
            cfg = dataclasses.replace(cfg, n_inner=ff)
        return cfg

    def _check_sizes(self, raw: dict[str, Any], where: str) -> None:
        eps = self.layer_norm_epsilon
        if not 0 <= eps < math.inf:
            raise CheckpointError(f"{where}: layer_norm_epsilon must be a finite number >= 0, got {eps}")
        sizes = (self.vocab_size, self.n_positions, self.n_embd, self.n_layer, self.n_head)
        if min(sizes) <= 0 or self.n_embd % self.n_head:
            raise CheckpointError(f"{where}: inconsistent sizes (n_embd={self.n_embd} must be a positive multiple "
                                  f"of n_head={self.n_head}, all sizes > 0)")
        if self.inner_dim <= 0:
            raise CheckpointError(f"{where}: n_inner must be a positive integer or null, got {self.n_inner}")
        if "n_ctx" in raw and raw["n_ctx"] != self.n_positions:
            raise CheckpointError(f"{where}: n_ctx = {json.dumps(raw['n_ctx'])} disagrees with n_positions = "
                                  f"{self.n_positions}{'' if 'n_positions' in raw else ' (the default)'}")
        ids = {"bos_token_id": set() if self.bos_token_id is None else {self.bos_token_id},
               "eos_token_id": self.eos_ids}
        for key, values in ids.items():
            if any(not 0 <= i < self.vocab_size for i in values):
                raise CheckpointError(f"{where}: {key} = {json.dumps(raw[key])} is out of range for "
                                      f"vocab_size = {self.vocab_size}")


def _check_known(key: str, value: Any, where: str) -> None:
    field = FIELDS.get(key)
    if field is None:
        raise CheckpointError(f"{where}: unknown key {key!r} = {_show(value)}: it is not a GPT2Config field "
                              "webtensor knows, so it cannot tell what it changes; the checkpoint is refused")
    if field.kind == "checked" and key in _ACCEPTED and value not in _ACCEPTED[key]:
        raise CheckpointError(f"{where}: {key} = {_show(value)} is not supported: {field.note}")


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
