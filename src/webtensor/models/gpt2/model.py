"""`GPT2`: a `LanguageModel` that is GPT-2, with the constructors GPT-2 users know (`from_pretrained`, `random`,
`from_arrays`) and its weights by role (`wte`, `blocks`, ...). Loading, generation and everything else are the
model-generic code's (`models.loader`, `models.base`, `runtime`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...device import Device
from ...errors import CheckpointError
from .. import loader
from ..base import LanguageModel
from .config import GPT2Config


class GPT2(LanguageModel):
    @classmethod
    def from_pretrained(cls, model: str | Path | None = None, device: Device | str | None = None,
                        dtype: Any = "float32", progress: bool | None = None, kv_dtype: str | None = None) -> GPT2:
        """Load a Hugging Face GPT-2: a directory, an id in the local HF cache ("gpt2", "gpt2-xl",
        "openai-community/gpt2"), or None for the small model shipped with webtensor; or a llama.cpp GGUF file
        (or a directory holding one). dtype "float32" (default), "float16", "int8" / "q8_0" (q8_0 matrices), or
        None (as stored: a Q8_0 GGUF stays q8_0); kv_dtype: the KV cache's (`webtensor.load_model`'s)."""
        dev = Device.parse(device)
        want = loader.check_dtype(dtype)
        if want == "float16" and not dev.has_f16:
            raise CheckpointError(f"{dev.describe()} has no shader-f16 feature: use dtype float32")
        ck = loader.open_checkpoint(model)
        if ck.family.name != "gpt2":
            raise CheckpointError(f"{ck.where} is a {ck.config.spec.architecture} model, not GPT-2: load it with "
                                  "webtensor.load_model")
        gpt2: GPT2 = loader.build(ck, dev, want, None, progress, cls=cls, kv_dtype=kv_dtype)
        return gpt2

    @classmethod
    def random(cls, cfg: GPT2Config, device: Device | str | None = None, dtype: Any = "float32", seed: int = 0,
               progress: bool | None = False) -> GPT2:
        """Random weights of GPT-2's shapes (benchmarks need no download); dtype "int8" quantizes them."""
        return cls.from_arrays(cfg, loader.random_arrays("gpt2", cfg, seed), device, dtype,
                               name=f"random-{cfg.n_layer}x{cfg.n_embd}")

    @classmethod
    def from_arrays(cls, cfg: GPT2Config, arrays: dict[str, Any], device: Device | str | None = None,
                    dtype: Any = "float32", progress: bool | None = False, name: str = "gpt2") -> GPT2:
        """A model of float32 numpy weights by HF name (no tokenizer); dtype "int8" quantizes them."""
        dev = Device.parse(device)
        want = loader.check_dtype(dtype)
        if want == "float16" and not dev.has_f16:
            raise CheckpointError(f"{dev.describe()} has no shader-f16 feature: use dtype float32")
        model: GPT2 = loader.build(loader.from_arrays("gpt2", cfg, arrays, name), dev, want, None, progress, cls=cls)
        return model

    # -- GPT-2's weights by role ----------------------------------------------------------------------
    @property
    def wte(self) -> Any:
        return self.weights.wte

    @property
    def wpe(self) -> Any:
        return self.weights.wpe

    @property
    def lm_head(self) -> Any:
        return self.weights.lm_head

    @property
    def ln_f(self) -> Any:
        return self.weights.ln_f

    @property
    def blocks(self) -> Any:
        return self.weights.blocks

    @property
    def quant(self) -> str | None:
        """"q8_0" where the matrices are q8_0 weights."""
        return "q8_0" if self.dtype == "q8_0" else None
