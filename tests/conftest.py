"""Shared fixtures: the CPU reference device and a WebGPU device.

Under CI=true the WebGPU tests must run: a missing adapter fails them loudly. Elsewhere they skip
with the reason. Tests accept a software adapter (lavapipe) here, unlike Device.default()."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences the Vulkan loader's complaint

import webtensor as wt  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
