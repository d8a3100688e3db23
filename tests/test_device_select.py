"""One adapter of several: `--device wgpu:N` / `Device.wgpu(adapter=N)` takes adapter N as `webtensor devices` lists
them (how one `webtensor serve` per GPU is started: README, "Beyond one device"). Names are checked before any device
is made; an index past the machine's adapters is one line naming how many there are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import webtensor as wt
from webtensor.backends.wgpu.gpu_api import NativeGpu
from webtensor.device import device_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, kind", [("wgpu:0", "wgpu:0"), (" GPU:01 ", "wgpu:1"), ("webgpu:12", "wgpu:12"),
                                        ("wgpu", "wgpu"), ("cpu", "cpu")])
def test_names(name, kind):
    assert device_spec(name) == kind


@pytest.mark.parametrize("name", ["wgpu:", "wgpu:-1", "wgpu:1.5", "wgpu:x", "cpu:0", "lavapipe:0", "auto:1", ":0",
                                  "wgpu:0:1", "wgpu:١"])
def test_bad_names(name):
    with pytest.raises(wt.UsageError, match=r"unknown device .*expected cpu, wgpu, wgpu:N"):
        device_spec(name)


@pytest.mark.parametrize("index", [-1, 1.0, True, "0"])
def test_bad_adapter_argument(index):
    with pytest.raises(wt.UsageError, match="adapter must be an int >= 0"):
        wt.Device.wgpu(adapter=index)


def test_each_adapter_by_index():
    adapters = NativeGpu.enumerate()
    if not adapters:
        pytest.skip("no WebGPU adapter")  # (CI has lavapipe: the other device tests fail there without one)
    for i, a in enumerate(adapters):
        dev = wt.Device.parse(f"wgpu:{i}")
        assert dev is wt.Device.wgpu(adapter=i)  # one Device per adapter, however it is asked for
        assert dev.ctx.info.name == str(a.info.get("device") or a.info.get("description"))
        x = wt.tensor([1.0, 2.0], device=dev)
        assert (x + x).numpy().tolist() == [2.0, 4.0]
    with pytest.raises(wt.NoAdapterError, match=rf"no WebGPU adapter {len(adapters)}: this machine has "
                                                rf"{len(adapters)} \(`webtensor devices` lists them, from 0\)"):
        wt.Device.parse(f"wgpu:{len(adapters)}")


def test_cli_adapter_past_the_end_is_one_line():
    n = len(NativeGpu.enumerate())
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", "generate", "-n", "1", "--device", f"wgpu:{n + 3}",
                        "hi"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [f"webtensor: error: no WebGPU adapter {n + 3}: this machine has {n} "
                                             "(`webtensor devices` lists them, from 0)"], r.stderr
