"""GPT-2 (OpenAI, 2019) as a webtensor model family: its config (`config.py`), tensor map (`names.py`) and forward
over ops (`forward.py`), registered by `family.py`; `model.GPT2` is the `LanguageModel` with GPT-2's constructors.

The names below are imported on first use (PEP 562), so the numpy-free modules load in the page."""

from typing import Any

__all__ = ["GPT2", "GPT2Config", "GPT2Tokenizer"]
_WHERE = {"GPT2": ".model", "GPT2Config": ".config", "GPT2Tokenizer": "webtensor.text.tokenizer"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
