"""The kernel policy (`backends/wgpu/policy.py`): derived from each adapter, frozen, overridable per
Device, and what the planners read: two devices in one process each plan by their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor.backends.wgpu.context import WgpuContext
from webtensor.backends.wgpu.gpu_api import AdapterInfo
from webtensor.backends.wgpu.policy import KernelPolicy


def info(name: str, kind: str) -> AdapterInfo:
    return AdapterInfo(name=name, backend="Vulkan", adapter_type=kind)


def test_policy_from_the_adapter() -> None:
    h200 = KernelPolicy.for_adapter(info("NVIDIA H200", "DiscreteGPU"))
    assert h200.gpu_style and h200.compute_units == 132
    assert KernelPolicy.for_adapter(info("NVIDIA H100 PCIe", "DiscreteGPU")).compute_units == 114
    assert KernelPolicy.for_adapter(info("NVIDIA A100-SXM4-80GB", "DiscreteGPU")).compute_units == 108
    assert KernelPolicy.for_adapter(info("Apple M2 Pro", "IntegratedGPU")).compute_units == 18
    assert KernelPolicy.for_adapter(info("Some New GPU", "DiscreteGPU")).compute_units == 64
    assert KernelPolicy.for_adapter(info("Intel(R) Graphics", "IntegratedGPU")).compute_units == 16
    assert KernelPolicy.for_adapter(info("ANGLE (Apple, ...)", "Unknown")).compute_units == 16  # a browser
    for sw in (info("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU"), info("SwiftShader Device", "Unknown")):
        assert not KernelPolicy.for_adapter(sw).gpu_style
        assert not KernelPolicy.for_adapter(sw).gemv_quant_dot4  # (int8 activations: GPUs only)
    assert h200.gemv_quant_dot4


def test_overrides_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """WEBTENSOR_POLICY="field=value,...": each value read as its field's type, anything else one line naming the
    item; a WebGPU context opened with it set plans by it."""
    p = KernelPolicy().with_overrides(" gemv_quant_dot4=0, gemv_dot4_nr=4,gemv_stack_f16_max_rows=none,"
                                      "engine_f16_math=f16")
    assert (p.gemv_quant_dot4, p.gemv_dot4_nr, p.gemv_stack_f16_max_rows, p.engine_f16_math) == (False, 4, None, "f16")
    assert KernelPolicy().with_overrides("") == KernelPolicy()
    for bad, match in (("nope=1", "'nope=1' is not field=value"), ("gemv_dot4_nr", "is not field=value"),
                       ("gemv_dot4_nr=x", "'x' is not a value of gemv_dot4_nr"),
                       ("gemv_quant_dot4=2", "'2' is not a value of gemv_quant_dot4"),
                       ("tiled_keys=1", "not a value of tiled_keys"), ("gemv_dot4_nr=3", "gemv_dot4_nr must be")):
        with pytest.raises(ValueError, match=match):
            KernelPolicy().with_overrides(bad)
    monkeypatch.setenv("WEBTENSOR_POLICY", "gemv_dot4_waves=7")
    dev = wt.Device.wgpu(max_binding_bytes=12345 * 16)  # (a device of its own: the cached ones keep theirs)
    assert dev.kernel_policy.gemv_dot4_waves == 7
    dev.release()


def test_policy_is_frozen_and_checked() -> None:
    p = KernelPolicy()
    with pytest.raises(AttributeError):
        p.gemv_max_rows = 4  # type: ignore[misc]
    assert p.replace(gemv_max_rows=4).gemv_max_rows == 4 and p.gemv_max_rows == 8
    with pytest.raises(ValueError, match="no field"):
        p.replace(GEMV_MAX_ROWS=4)
    with pytest.raises(ValueError, match="compute_units"):
        p.replace(compute_units=0)


def test_two_devices_plan_by_their_own_policy(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same product on two devices of one adapter (runtime checks off / on): one told to run the
    GPU kernels (gpu_style), the other left as its adapter says; each launch follows its device's
    policy, and both give the reference's numbers."""
    other = wt.Device.wgpu(shader_checks=not gpu.ctx.shader_checks)
    assert other is not gpu and other.kernel_policy == gpu.kernel_policy  # (same adapter, same policy)
    names: list[tuple[int, str]] = []
    launch = WgpuContext.launch

    def spy(self: WgpuContext, kernel: Any, *args: Any) -> None:
        names.append((id(self), kernel.name.split("-")[0]))
        launch(self, kernel, *args)

    monkeypatch.setattr(WgpuContext, "launch", spy)
    native = gpu.kernel_policy.gpu_style
    monkeypatch.setattr(other.ctx, "policy", other.ctx.policy.replace(gpu_style=not native, engine=True))
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((40, 64)).astype(np.float32), rng.standard_normal((64, 48)).astype(np.float32)
    want = a.astype(np.float64) @ w
    for dev in (gpu, other):
        wk = wt.tensor(np.ascontiguousarray(w.T), device=dev).T  # k-major, as models store weights
        got = wt.matmul(wt.tensor(a, device=dev), wk).numpy()
        assert_close(got, want, linear_scale(a, w))
    ran = {i: n for i, n in names if n.startswith("matmul")}
    gpu_kernel = {True: "matmul_engine", False: "matmul_regs"}
    assert ran[id(gpu.ctx)] == gpu_kernel[native] and ran[id(other.ctx)] == gpu_kernel[not native]
    assert gpu.kernel_policy.gpu_style == native  # (the first device untouched)


def test_kernel_policy_on_devices(gpu: wt.Device, cpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu.kernel_policy is None
    with pytest.raises(wt.UsageError, match="no kernel policy"):
        cpu.kernel_policy = KernelPolicy()
    with pytest.raises(wt.UsageError, match="must be a KernelPolicy"):
        gpu.kernel_policy = {"gpu_style": True}  # type: ignore[assignment]
    old = gpu.kernel_policy
    try:
        gpu.kernel_policy = old.replace(tiled_min_queries=1)
        assert gpu.ctx.policy.tiled_min_queries == 1
    finally:
        gpu.kernel_policy = old
