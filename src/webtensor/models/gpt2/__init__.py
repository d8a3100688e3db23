"""GPT-2: Hugging Face checkpoints, tokenizer, KV-cached generation, sampling, CLI.

The names below are imported on first use (PEP 562), so the numpy-free modules (config,
tokenizer, weights, forward, sampling, validate) load in the browser, where the numpy model cannot."""

from typing import Any

__all__ = ["GPT2", "GPT2Config", "GPT2Tokenizer"]
_WHERE = {"GPT2": ".model", "GPT2Config": ".config", "GPT2Tokenizer": "...text.tokenizer"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
