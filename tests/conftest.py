"""Shared fixtures and the suite's tiers.

- Devices: the CPU reference and WebGPU. Under CI=true the WebGPU tests must run: a missing adapter
  fails them loudly. Elsewhere they skip with the reason. Tests accept a software adapter
  (lavapipe) here, unlike Device.default().
- Tiers: a test that needs torch or transformers (the parity checks against Hugging Face) is
  marked `hf` (`@pytest.mark.hf`; a module of them: `pytestmark = pytest.mark.hf`), so that
  `pytest -m "not hf"` is the core tier, which needs neither (its checkpoints are written with
  numpy and safetensors, gpt2_fixtures.py), and `pytest -m hf` the parity tier; CI runs both.
  WEBTENSOR_TEST_NO_HF=1 makes torch and transformers unimportable and fails an unmarked test that
  wants them: `WEBTENSOR_TEST_NO_HF=1 pytest -m "not hf"` proves the core tier needs neither.
- Hypothesis: under CI=true the `ci` profile (derandomized: the same examples every run, no example
  database); elsewhere `dev` (fresh random examples, the database in .hypothesis/ replays failures).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import settings

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences the Vulkan loader's complaint

import webtensor as wt  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev")
settings.load_profile("ci" if IN_CI else "dev")  # (before the test modules: their @settings inherit it)

HF_MODULES = ("torch", "transformers")
NO_HF = os.environ.get("WEBTENSOR_TEST_NO_HF", "") == "1"
if NO_HF:
    for _name in HF_MODULES:
        sys.modules[_name] = None  # type: ignore[assignment]  # `import torch` raises ImportError


def _wants_hf(text: str) -> bool:
    return any(f"'{m}'" in text or f"{m} " in text for m in HF_MODULES)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """With WEBTENSOR_TEST_NO_HF=1, a test module that skips for want of torch or transformers
    fails unless it is marked `hf` (`pytestmark = pytest.mark.hf`)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    path = getattr(collector, "path", None)
    if NO_HF and report.outcome == "skipped" and path is not None and path.suffix == ".py":
        if _wants_hf(str(report.longrepr)) and "pytestmark = pytest.mark.hf" not in path.read_text():
            report.outcome = "failed"
            report.longrepr = f"{path} needs torch or transformers but is not marked hf: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """With WEBTENSOR_TEST_NO_HF=1, a test not marked `hf` that skips or fails for want of torch or
    transformers fails, naming the mark it lacks."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if NO_HF and report.outcome != "passed" and item.get_closest_marker("hf") is None:
        text = str(report.longrepr)
        if _wants_hf(text):
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} needs torch or transformers but is not marked hf: {text[:300]}"


def _wgpu(**kw) -> wt.Device:
    try:
        return wt.Device.wgpu(**kw)
    except wt.NoAdapterError as e:
        if IN_CI:
            pytest.fail(f"CI=true but no WebGPU adapter was found: {e}")
        pytest.skip(f"no WebGPU adapter: {e}")


@pytest.fixture(scope="session")
def cpu() -> wt.Device:
    return wt.Device.cpu()


@pytest.fixture(scope="session")
def gpu() -> wt.Device:
    return _wgpu()


@pytest.fixture(scope="session")
def gpu_small() -> wt.Device:
    """A WebGPU device whose binding limit is 64 KiB, to exercise row-chunking."""
    return _wgpu(max_binding_bytes=64 * 1024)


@pytest.fixture(params=["cpu", "wgpu"])
def device(request) -> wt.Device:
    return wt.Device.cpu() if request.param == "cpu" else _wgpu()


def rel_err(got, want) -> float:
    """Norm-wise relative error ||got - want|| / ||want|| (0 when both are 0)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    denom = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    return float(diff / denom) if denom > 0 else float(diff)
