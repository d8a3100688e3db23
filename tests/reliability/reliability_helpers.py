"""Shared pieces of the reliability suite: a tiny random GPT-2 checkpoint built once per session
(with tests/gpt2_fixtures.make_checkpoint), copies of it to break, a subprocess runner, and a
watchdog that turns a hang into a failure with tracebacks instead of a stuck CI job."""

from __future__ import annotations

import atexit
import faulthandler
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

TINY = dict(vocab_size=320, n_embd=32, n_layer=2, n_head=2, n_positions=64)


@functools.cache
def tiny_checkpoint() -> Path:
    """A random GPT-2 (2 layers, 32 wide, 320 tokens, 64 positions) with a trained byte-level BPE
    tokenizer.json; built once per process, never modified (tests copy it with `copy_checkpoint`)."""
    from gpt2_fixtures import make_checkpoint

    root = Path(tempfile.mkdtemp(prefix="wt-reliability-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    d = make_checkpoint(root / "tiny", seed=1, **TINY)
    (d / "generation_config.json").unlink(missing_ok=True)
    return d


def copy_checkpoint(dst: Path) -> Path:
    shutil.copytree(tiny_checkpoint(), dst)
    return dst


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter of this venv (src/ importable), return the completed process."""
    e = dict(os.environ)
    e.setdefault("XDG_RUNTIME_DIR", "/tmp")
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(TESTS), str(TESTS / "reliability"),
                                     e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout)


@contextmanager
def watchdog(seconds: float = 60):
    """Dump every thread's traceback and exit if the block runs longer than `seconds` (a hang)."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def is_software(device) -> bool:
    """True on a software WebGPU adapter (lavapipe): the NaN / inf behaviour documented for WebGPU
    in docs/numerics.md was observed there; WGSL lets other implementations differ."""
    return device.kind == "wgpu" and device.ctx.info.is_software
