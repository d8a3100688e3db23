"""Shared fixtures: the CPU reference device and a WebGPU device.

Under CI=true the WebGPU tests must run: a missing adapter fails them loudly. Elsewhere they skip
with the reason. Tests accept a software adapter (lavapipe) here, unlike Device.default().

Shader runtime checks: the WebGPU device compiles webtensor's kernels without the shader
compiler's bounds checks and loop bounding (the product default). The kernel parity suites
(BOTH_WAYS) run twice, once so and once with the checks (`Device.wgpu(shader_checks=True)`): a
kernel whose result depended on a clamped out-of-bounds index would differ between the two. The
checked run is a regression run, so it keeps a few derandomized hypothesis examples (CHECKED_EXAMPLES).
`--shader-checks off|on|both` (default both) picks which of the two those suites run.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences the Vulkan loader's complaint

import webtensor as wt  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


BOTH_WAYS = {"test_ops_parity", "test_kv_ops", "test_matmul_engine", "test_q8_kernels", "test_gemv_stack"}
CHECKED_EXAMPLES = 3  # hypothesis examples a test keeps in the checked run (derandomized)
GPU_FIXTURES = {"gpu", "gpu_small", "device"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shader-checks", choices=("off", "on", "both"), default="both",
                     help="run the kernel parity suites without the shader runtime checks (off), with them (on) "
                          "or both ways (default)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module not in BOTH_WAYS or not GPU_FIXTURES & set(metafunc.fixturenames):
        return
    mode = metafunc.config.getoption("--shader-checks")
    ways = {"off": [False], "on": [True], "both": [False, True]}[mode]
    metafunc.parametrize("shader_checks", ways, ids=["trusted" if w is False else "checked" for w in ways],
                         indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Items of the checked run keep CHECKED_EXAMPLES derandomized examples. Hypothesis reads a test's
    settings from `_hypothesis_internal_use_settings` when it runs, so each checked item gets its own
    wrapper with the reduced settings (the trusted item keeps the original function and settings)."""
    from hypothesis import settings

    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("shader_checks") is not True:
            continue
        fn = getattr(item, "obj", None)
        old = getattr(fn, "_hypothesis_internal_use_settings", None)
        if old is None:
            continue
        reduced = settings(old, max_examples=min(old.max_examples, CHECKED_EXAMPLES), derandomize=True,
                           database=None)
        item.obj = _with_settings(fn, reduced)


def _with_settings(fn: Any, reduced: Any) -> Any:
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        saved = fn._hypothesis_internal_use_settings
        fn._hypothesis_internal_use_settings = reduced
        try:
            return fn(*args, **kwargs)
        finally:
            fn._hypothesis_internal_use_settings = saved

    return run


@pytest.fixture(scope="session")
def shader_checks(request: pytest.FixtureRequest) -> bool:
    """Whether the WebGPU fixtures compile kernels with the shader runtime checks (see the module
    docstring); False (the product default) outside the BOTH_WAYS suites."""
    return bool(getattr(request, "param", False))


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
def gpu(shader_checks: bool) -> wt.Device:
    dev = _wgpu(shader_checks=shader_checks)
    assert dev.ctx.shader_checks is shader_checks, dev.describe()
    return dev


@pytest.fixture(scope="session")
def gpu_small(shader_checks: bool) -> wt.Device:
    """A WebGPU device whose binding limit is 64 KiB, to exercise row-chunking."""
    return _wgpu(max_binding_bytes=64 * 1024, shader_checks=shader_checks)


@pytest.fixture(params=["cpu", "wgpu"])
def device(request, shader_checks: bool) -> wt.Device:
    return wt.Device.cpu() if request.param == "cpu" else _wgpu(shader_checks=shader_checks)


def set_policy(monkeypatch: pytest.MonkeyPatch, *devices: wt.Device, **changes: Any) -> None:
    """Override fields of each WebGPU device's kernel policy (`Device.kernel_policy`) for the test:
    how tests force a kernel variant (gpu_style=True: the GPU kernels on lavapipe)."""
    for dev in devices:
        if dev.kind == "wgpu":
            monkeypatch.setattr(dev.ctx, "policy", dev.ctx.policy.replace(**changes))


def rel_err(got, want) -> float:
    """Norm-wise relative error ||got - want|| / ||want|| (0 when both are 0)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    denom = np.linalg.norm(want)
    diff = np.linalg.norm(got - want)
    return float(diff / denom) if denom > 0 else float(diff)
