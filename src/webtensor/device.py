"""Device: where a tensor lives and where its ops run.

`Device.cpu()` is the numpy reference; `Device.wgpu()` / `await Device.wgpu_async()` is WebGPU.
Tensors on devices that are not `same_as` each other cannot be combined.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any

from .errors import NoAdapterError, UsageError

_NO_ADAPTER_HELP = (
    "no WebGPU adapter was found. Install a Vulkan driver (on Debian/Ubuntu: "
    "`apt-get install mesa-vulkan-drivers libvulkan1` for the lavapipe software driver, or your GPU "
    "vendor's driver), or use Device.cpu()"
)


_SPECS = {"auto": "auto", "cpu": "cpu", "wgpu": "wgpu", "gpu": "wgpu", "webgpu": "wgpu",
          "lavapipe": "lavapipe", "software": "lavapipe"}


def device_spec(spec: object) -> str:
    """The kind a device name asks for: 'auto', 'cpu', 'wgpu' or 'lavapipe' (None means 'auto').
    Checks the name only; no device is created. UsageError for anything else."""
    if spec is None:
        return "auto"
    kind = _SPECS.get(spec.strip().lower()) if isinstance(spec, str) else None
    if kind is None:
        raise UsageError(f"unknown device {spec!r}: expected cpu, wgpu, lavapipe or auto")
    return kind


def env_device() -> str | None:
    """WEBTENSOR_DEVICE as 'cpu' or 'wgpu', or None when unset or empty; UsageError otherwise."""
    raw = os.environ.get("WEBTENSOR_DEVICE", "")
    kind = _SPECS.get(raw.strip().lower()) if raw.strip() else None
    if raw.strip() and kind not in ("cpu", "wgpu"):
        raise UsageError(f"WEBTENSOR_DEVICE={raw!r}: expected 'cpu' or 'wgpu' (or unset: the best device)")
    return kind


class Device:
    """A compute device: `kind` is "cpu" or "wgpu"; a wgpu device owns one WgpuContext."""

    __slots__ = ("kind", "ctx")
    _cpu: Device | None = None
    _wgpu_cache: dict[tuple, Device] = {}
    _warned_fallback = False

    def __init__(self, kind: str, ctx: Any = None):
        self.kind, self.ctx = kind, ctx

    # -- creation -------------------------------------------------------------------------------
    @classmethod
    def cpu(cls) -> Device:
        if cls._cpu is None:
            cls._cpu = cls("cpu")
        return cls._cpu

    @classmethod
    def wgpu(cls, max_binding_bytes: int | None = None, software: bool | None = None) -> Device:
        """The WebGPU device (sync facade, native only). Picks the highest-performance adapter;
        `software=True` asks for a software adapter (lavapipe), `False` refuses one. The device is
        created once per argument set and shared; `max_binding_bytes` caps the binding size."""
        key = (max_binding_bytes, software)
        dev = cls._wgpu_cache.get(key)
        if dev is None or dev.ctx.released:
            from .backends.wgpu.gpu_api import NativeGpu

            api = NativeGpu.create_sync(software, max_binding_bytes)
            dev = cls._wgpu_cache[key] = cls._from_api(api, max_binding_bytes, software)
        return dev

    @classmethod
    async def wgpu_async(cls, max_binding_bytes: int | None = None, software: bool | None = None) -> Device:
        """The primary form: works under any running event loop, natively and in the browser."""
        key = (max_binding_bytes, software)
        dev = cls._wgpu_cache.get(key)
        if dev is None or dev.ctx.released:
            if _in_browser():
                from .web.browser_gpu import BrowserGpu

                api = await BrowserGpu.create_async(max_binding_bytes)
            else:
                from .backends.wgpu.gpu_api import NativeGpu

                api = await NativeGpu.create_async(software, max_binding_bytes)
            dev = cls._wgpu_cache[key] = cls._from_api(api, max_binding_bytes, software)
        return dev

    @classmethod
    def _from_api(cls, api: Any, max_binding_bytes: int | None, software: bool | None) -> Device:
        if api is None:
            what = {True: "software ", False: "hardware "}.get(software, "")  # type: ignore[arg-type]
            raise NoAdapterError(f"no {what}WebGPU adapter: " + _NO_ADAPTER_HELP)
        from .backends.wgpu.context import WgpuContext

        return cls("wgpu", WgpuContext(api, max_binding_bytes))

    @classmethod
    def default(cls) -> Device:
        """A hardware GPU adapter if there is one (discrete or integrated), else the CPU.
        `WEBTENSOR_DEVICE=cpu|wgpu` overrides; a software adapter is used only when asked for."""
        choice = env_device()
        if choice == "cpu":
            return cls.cpu()
        if choice == "wgpu":
            return cls.wgpu()
        try:
            return cls.wgpu(software=False)
        except NoAdapterError:
            from .backends.wgpu.gpu_api import NativeGpu

            if not NativeGpu.enumerate() and not cls._warned_fallback:
                cls._warned_fallback = True
                warnings.warn("webtensor: " + _NO_ADAPTER_HELP + "; using the CPU", RuntimeWarning, stacklevel=2)
            return cls.cpu()

    @staticmethod
    def parse(spec: str | Device | None) -> Device:
        """'cpu', 'wgpu', 'lavapipe' (software WebGPU), 'auto'/None (Device.default()), or a Device."""
        if isinstance(spec, Device):
            return spec
        kind = device_spec(spec)
        if kind == "auto":
            return Device.default()
        if kind == "cpu":
            return Device.cpu()
        return Device.wgpu(software=True) if kind == "lavapipe" else Device.wgpu()

    # -- what it is -----------------------------------------------------------------------------
    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU (reference)"
        i = self.ctx.info
        return f"WebGPU: {i.name} ({i.backend})"

    def max_binding_bytes(self) -> int:
        """Largest single buffer binding, in bytes; larger tensors are stored in row chunks."""
        return 2**63 - 1 if self.kind == "cpu" else self.ctx.max_binding_bytes

    def same_as(self, other: Device) -> bool:
        if self.kind != other.kind:
            return False
        return self.kind == "cpu" or self.ctx is other.ctx

    @property
    def has_f16(self) -> bool:
        return self.kind == "cpu" or self.ctx.has_f16

    # -- batching and counters ------------------------------------------------------------------
    def dispatch_scope(self) -> Any:
        """Batch every dispatch made while held into one command buffer and one submit. Nested
        scopes join the outer one; `.numpy()` inside submits first. A no-op on the CPU."""
        return contextlib.nullcontext() if self.kind == "cpu" else self.ctx.scope()

    def stats(self) -> dict[str, int]:
        """Counters: dispatches, submits, readbacks, bytes_uploaded, bytes_read, memory in use."""
        if self.kind == "cpu":
            return dict(dispatches=0, submits=0, readbacks=0, bytes_uploaded=0, bytes_read=0, bytes_in_use=0)
        return self.ctx.stats()

    def synchronize(self) -> None:
        """Submit pending work and wait for the GPU to finish it."""
        if self.kind == "wgpu":
            from .backends.wgpu import ops as gops

            gops.synchronize(self)

    def empty_cache(self) -> None:
        if self.kind == "wgpu":
            self.ctx.empty_cache()

    def release(self) -> None:
        """Free this device's GPU resources; tensors on it become unusable (DeviceReleasedError)."""
        if self.kind == "wgpu":
            self.ctx.release_device()
            for k, d in list(Device._wgpu_cache.items()):
                if d is self:
                    del Device._wgpu_cache[k]

    def __repr__(self) -> str:
        return f"Device({self.describe()!r})"


def _in_browser() -> bool:
    import sys

    return sys.platform == "emscripten"
