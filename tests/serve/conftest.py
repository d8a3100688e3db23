"""The serving tests' shared server: `webtensor serve` on the CPU device with the shipped model and
the default (batched) engine, 32 slots, one process for the whole session (each module that needs
a differently configured server starts its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import Server  # noqa: E402


@pytest.fixture(scope="session")
def api_server():
    s = Server.cli("--device", "cpu", "--max-batch", "32")
    yield s
    s.stop()
