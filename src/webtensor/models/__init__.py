"""Language models: `load_model` (any source, any family, any device), the `LanguageModel` it returns, and the
families' registry. Each family lives in its own folder (`gpt2/`, `llama/`): its config, its tensor-name map and
its forward over ops. Names are imported on first use (PEP 562), so the numpy-free modules load in the page."""

from __future__ import annotations

from typing import Any

__all__ = ["LanguageModel", "load_model", "random_model"]


def load_model(source: Any = None, device: Any = None, dtype: Any = None, n_ctx: int | None = None,
               progress: Any = None, reader: str = "auto", kv_dtype: str | None = None) -> Any:
    """A model from `source` — a Hugging Face checkpoint directory, a .gguf file (or a directory holding one), an
    id in the local Hugging Face cache ("HuggingFaceTB/SmolLM2-135M-Instruct"), or None for the small model that
    ships with webtensor — on `device` (a Device, "cpu", "wgpu", "lavapipe", or None: the best one). `dtype`: None
    (as stored), "float32", "float16" or "q8_0" (see `models.loader`). `n_ctx`: positions per sequence (default:
    the model's trained context, at most 8,192: a sequence's KV cache holds up to that many). `kv_dtype`: the KV
    cache's type, "float32", "float16" or "q8_0" (None: float16 on WebGPU adapters with shader-f16, else float32;
    docs/design-kv.md)."""
    from .loader import load

    return load(source, device, dtype, n_ctx, progress, reader, kv_dtype)


def random_model(family: str, config: Any, device: Any = None, dtype: Any = None, seed: int = 0,
                 n_ctx: int | None = None, kv_dtype: str | None = None) -> Any:
    """A model of `family` ("gpt2", "llama") and `config` with random weights (benchmarks and tests need no
    download): matrices N(0, 0.02), norm weights 1, biases 0."""
    from .loader import random

    return random(family, config, device, dtype, seed, n_ctx, kv_dtype)


def __getattr__(name: str) -> Any:
    if name == "LanguageModel":
        from .base import LanguageModel

        return LanguageModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
