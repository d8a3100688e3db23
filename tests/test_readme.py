"""The README's Python examples as a user copies them: each block is valid in a script (no top-level
`await`), and the first one runs as it stands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_block_is_valid_in_a_script(i):
    compile(BLOCKS[i], f"README.md python block {i}", "exec")  # SyntaxError for a top-level await


def test_readme_first_example_runs(gpu, capsys):
    exec(compile(BLOCKS[0], "README.md python block 0", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("WebGPU: ") and "(4, 768) {'dispatches':" in out
