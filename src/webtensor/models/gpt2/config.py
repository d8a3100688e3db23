"""GPT2Config: the hyper-parameters of a GPT-2 checkpoint, read from Hugging Face's config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError

# The four released sizes, for benchmarks with random weights (no download).
PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),
}


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256
    bos_token_id: int | None = 50256

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides: int) -> GPT2Config:
        key = name.split("/")[-1]
        if key not in PRESETS:
            raise CheckpointError(f"unknown GPT-2 size {name!r}: expected one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[key], **overrides})

    @classmethod
    def from_file(cls, path: Path) -> GPT2Config:
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: a GPT-2 checkpoint directory needs config.json")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path} must hold a JSON object, got {type(raw).__name__}")
        if raw.get("model_type", "gpt2") != "gpt2":
            raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, not 'gpt2'")
        missing = [k for k in ("vocab_size", "n_embd", "n_layer", "n_head") if k not in raw]
        if missing:
            raise CheckpointError(f"{path} lacks required keys: {', '.join(missing)}")
        act = raw.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise CheckpointError(f"{path}: activation_function {act!r} is not supported (GPT-2 uses gelu_new)")
        try:
            cfg = cls(
                vocab_size=int(raw["vocab_size"]),
                n_positions=int(raw.get("n_positions", raw.get("n_ctx", 1024))),
                n_embd=int(raw["n_embd"]),
                n_layer=int(raw["n_layer"]),
                n_head=int(raw["n_head"]),
                layer_norm_epsilon=float(raw.get("layer_norm_epsilon", 1e-5)),
                eos_token_id=raw.get("eos_token_id"),
                bos_token_id=raw.get("bos_token_id"),
            )
        except (TypeError, ValueError, OverflowError) as e:  # OverflowError: int(1e999) (JSON's inf)
            raise CheckpointError(f"{path}: a hyper-parameter has the wrong type: {e}") from e
        eps = cfg.layer_norm_epsilon
        if not 0 <= eps < float("inf"):
            raise CheckpointError(f"{path}: layer_norm_epsilon must be a finite number >= 0, got {eps}")
        for key in ("eos_token_id", "bos_token_id"):
            v = getattr(cfg, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise CheckpointError(f"{path}: {key} must be an integer token id or null, got {v!r}")
        if min(cfg.vocab_size, cfg.n_positions, cfg.n_embd, cfg.n_layer, cfg.n_head) <= 0 or cfg.n_embd % cfg.n_head:
            raise CheckpointError(f"{path}: inconsistent sizes (n_embd={cfg.n_embd} must be a positive multiple "
                                  f"of n_head={cfg.n_head}, all sizes > 0)")
        return cfg
