"""The model families webtensor runs, found by a Hugging Face `model_type` or a GGUF `general.architecture`.
A family registers itself here from its own folder (`models/<name>/__init__.py` calls `register`); the table
below lists where they live, imported on first use so the page loads only numpy-free modules."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..errors import CheckpointError
from .spec import Family

# (the mixture-of-experts family before Llama's: a GGUF `llama` file with experts is Mixtral's)
FAMILY_MODULES = ("webtensor.models.gpt2.family", "webtensor.models.moe.family", "webtensor.models.llama.family",
                  "webtensor.models.gemma.family", "webtensor.models.olmo2.family")
_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    _FAMILIES[family.name] = family
    return family


def families() -> list[Family]:
    for m in FAMILY_MODULES:
        importlib.import_module(m)
    return list(_FAMILIES.values())


def by_name(name: str) -> Family:
    for f in families():
        if f.name == name:
            return f
    raise CheckpointError(f"unknown model family {name!r}: webtensor runs {', '.join(f.name for f in families())}")


def for_hf(model_type: object, where: str) -> Family:
    """The family of a config.json's `model_type` (a missing one is read as GPT-2's, as old GPT-2 files have none)."""
    model_type = "gpt2" if model_type is None else model_type
    for f in families():
        if model_type in f.hf_model_types:
            return f
    known = sorted(t for f in families() for t in f.hf_model_types)
    raise CheckpointError(f"{where}: model_type {model_type!r} is not supported (webtensor runs {', '.join(known)})")


def for_gguf(architecture: object, where: str, meta: Mapping[str, Any] | None = None) -> Family:
    """The family of a GGUF file's `general.architecture`: the first that names it and accepts the file's
    metadata (`Family.gguf_accepts`; without it, the architecture alone)."""
    meta = {"general.architecture": architecture} if meta is None else meta
    for f in families():
        if architecture in f.gguf_architectures and f.gguf_accepts(meta):
            return f
    known = sorted(a for f in families() for a in f.gguf_architectures)
    raise CheckpointError(f"{where}: general.architecture {architecture!r} is not supported (webtensor runs "
                          f"{', '.join(known)})")


def presets() -> dict[str, tuple[Family, dict[str, Any]]]:
    """Every family's named shapes (random weights, for benchmarks): name -> (family, config.json dict)."""
    return {name: (f, dict(raw)) for f in families() for name, raw in f.presets.items()}


def preset(name: str) -> tuple[Family, Any, dict[str, Any]] | None:
    """(family, config, config.json dict) of a preset name ("gpt2", "smollm2-135m"), or None where `name` is none."""
    found = presets().get(name)
    if found is None:
        return None
    family, raw = found
    return family, family.config_from_hf(raw, f"preset {name!r}"), raw
