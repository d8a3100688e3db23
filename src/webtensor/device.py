"""Device: where a tensor lives and where its ops run.

`Device.cpu()` is the numpy reference; `Device.wgpu()` / `await Device.wgpu_async()` is WebGPU.
Tensors on devices that are not `same_as` each other cannot be combined.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import NoAdapterError, UsageError

if TYPE_CHECKING:
    from .backends.base import Backend

_NO_ADAPTER_HELP = (
    "no WebGPU adapter was found. Install a Vulkan driver (on Debian/Ubuntu: "
    "`apt-get install mesa-vulkan-drivers libvulkan1` for the lavapipe software driver, or your GPU "
    "vendor's driver), or use Device.cpu()"
)


_SPECS = {"auto": "auto", "cpu": "cpu", "wgpu": "wgpu", "gpu": "wgpu", "webgpu": "wgpu",
          "lavapipe": "lavapipe", "software": "lavapipe"}


def device_spec(spec: object) -> str:
    """The kind a device name asks for: 'auto', 'cpu', 'wgpu', 'wgpu:N' (adapter N as `webtensor devices` lists
    them: one GPU of several, e.g. one server per GPU) or 'lavapipe' (None means 'auto'). Checks the name only; no
    device is created. UsageError for anything else."""
    if spec is None:
        return "auto"
    name, colon, index = spec.strip().lower().partition(":") if isinstance(spec, str) else ("", "", "")
    kind = _SPECS.get(name)
    if colon and kind == "wgpu" and index.isascii() and index.isdigit():
        return f"wgpu:{int(index)}"
    if kind is None or colon:
        raise UsageError(f"unknown device {spec!r}: expected cpu, wgpu, wgpu:N (adapter N of `webtensor devices`), "
                         "lavapipe or auto")
    return kind


def env_device() -> str | None:
    """WEBTENSOR_DEVICE as 'cpu' or 'wgpu', or None when unset or empty; UsageError otherwise."""
    raw = os.environ.get("WEBTENSOR_DEVICE", "")
    kind = _SPECS.get(raw.strip().lower()) if raw.strip() else None
    if raw.strip() and kind not in ("cpu", "wgpu"):
        raise UsageError(f"WEBTENSOR_DEVICE={raw!r}: expected 'cpu' or 'wgpu' (or unset: the best device)")
    return kind


def env_shader_checks() -> bool:
    """WEBTENSOR_SHADER_CHECKS: '1' keeps the shader compiler's runtime checks in native kernels;
    '0' or unset leaves them out; UsageError otherwise."""
    raw = os.environ.get("WEBTENSOR_SHADER_CHECKS", "").strip()
    if raw not in ("", "0", "1"):
        raise UsageError(f"WEBTENSOR_SHADER_CHECKS={raw!r}: expected 0 or 1")
    return raw == "1"


class Device:
    """A compute device: `kind` is "cpu" or "wgpu"; its ops run on `backend` (a
    `backends.base.Backend`); a wgpu device also has `ctx`, its WgpuContext.

    There is one Device per adapter (and per `max_binding_bytes` / `features` choice), however it
    is asked for: `Device.default()`, `Device.parse("wgpu")` and `Device.wgpu()` on one GPU give
    the same object, so their tensors mix."""

    __slots__ = ("kind", "backend", "ctx")
    _cpu: Device | None = None
    _wgpu_cache: dict[tuple[Any, ...], Device] = {}
    _picked: dict[Any, tuple[Any, ...]] = {}  # software choice or ("index", N) -> the adapter it picked
    _warned_fallback = False
    kind: str
    backend: Backend
    ctx: Any  # the WgpuContext of a wgpu device, else None

    def __init__(self, kind: str, backend: Backend, ctx: Any = None):
        self.kind, self.backend, self.ctx = kind, backend, ctx

    # -- creation -------------------------------------------------------------------------------
    @classmethod
    def cpu(cls) -> Device:
        if cls._cpu is None:
            from .backends.cpu import CpuBackend

            cls._cpu = cls("cpu", CpuBackend())
        return cls._cpu

    @classmethod
    def wgpu(cls, max_binding_bytes: int | None = None, software: bool | None = None,
             features: Iterable[str] | None = None, shader_checks: bool | None = None,
             adapter: int | None = None) -> Device:
        """The WebGPU device (sync facade, native only). Picks the highest-performance adapter;
        `software=True` asks for a software adapter (lavapipe), `False` refuses one; `adapter=N` takes adapter N in
        the order `webtensor devices` lists them (one of several GPUs: a server per GPU).
        `max_binding_bytes` caps the binding size (any value: tensors over it are row-chunked);
        `features` (a subset of "shader-f16", "subgroup", "timestamp-query") withholds the others,
        as an adapter without them would (default: every one the adapter has).
        `shader_checks=True` compiles webtensor's kernels with the shader compiler's runtime
        checks (bounds clamps, loop bounding); by default (None: `WEBTENSOR_SHADER_CHECKS`, else
        off) they are left out natively: every kernel keeps its indices in bounds by construction
        (`describe()` says which)."""
        from .backends.wgpu.gpu_api import NativeGpu

        feats = _check_features(features)
        binding = _check_binding(max_binding_bytes)
        checks = env_shader_checks() if shader_checks is None else bool(shader_checks)
        choice = software if adapter is None else ("index", _check_adapter(adapter))
        known = cls._picked.get(choice)  # (enumerating adapters costs ~2 ms: once per choice)
        dev = cls._wgpu_cache.get((known, binding, feats, checks)) if known is not None else None
        if dev is not None and not dev.ctx.released:
            return dev
        picked = NativeGpu.pick(software) if adapter is None else _nth_adapter(NativeGpu.enumerate(), adapter)
        if picked is None:
            raise _no_adapter(software)
        cls._picked[choice] = NativeGpu.adapter_key(picked)
        key = (cls._picked[choice], binding, feats, checks)
        dev = cls._wgpu_cache.get(key)
        if dev is None or dev.ctx.released:
            dev = cls._wgpu_cache[key] = cls._from_api(NativeGpu.open(picked, max_binding_bytes, feats, checks),
                                                       max_binding_bytes)
        return dev

    @classmethod
    async def wgpu_async(cls, max_binding_bytes: int | None = None, software: bool | None = None,
                         features: Iterable[str] | None = None, shader_checks: bool | None = None,
                         adapter: int | None = None) -> Device:
        """The primary form: works under any running event loop, natively and in the browser (which
        keeps its own shader checks whatever `shader_checks` says, and has one adapter)."""
        feats = _check_features(features)
        binding = _check_binding(max_binding_bytes)
        if _in_browser():
            from .backends.wgpu.browser_gpu import BrowserGpu

            key: tuple[Any, ...] = ("browser", binding, feats)
            dev = cls._wgpu_cache.get(key)
            if dev is None or dev.ctx.released:
                api = await BrowserGpu.create_async(max_binding_bytes, feats)
                if api is None:
                    raise _no_adapter(software)
                dev = cls._wgpu_cache[key] = cls._from_api(api, max_binding_bytes)
            return dev
        from .backends.wgpu.gpu_api import NativeGpu

        checks = env_shader_checks() if shader_checks is None else bool(shader_checks)
        if adapter is None:
            picked = await NativeGpu.pick_async(software)
        else:
            picked = _nth_adapter(await NativeGpu.enumerate_async(), _check_adapter(adapter))
        if picked is None:
            raise _no_adapter(software)
        key = (NativeGpu.adapter_key(picked), binding, feats, checks)
        dev = cls._wgpu_cache.get(key)
        if dev is None or dev.ctx.released:
            native = await NativeGpu.open_async(picked, max_binding_bytes, feats, checks)
            dev = cls._wgpu_cache[key] = cls._from_api(native, max_binding_bytes)
        return dev

    @classmethod
    def _from_api(cls, api: Any, max_binding_bytes: int | None) -> Device:
        from .backends.wgpu.backend import WgpuBackend
        from .backends.wgpu.context import WgpuContext

        ctx = WgpuContext(api, max_binding_bytes)
        return cls("wgpu", WgpuBackend(ctx), ctx)

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
        """'cpu', 'wgpu', 'wgpu:N' (adapter N of `webtensor devices`), 'lavapipe' (software WebGPU), 'auto'/None
        (Device.default()), or a Device."""
        if isinstance(spec, Device):
            return spec
        kind = device_spec(spec)
        if kind == "auto":
            return Device.default()
        if kind == "cpu":
            return Device.cpu()
        if kind.startswith("wgpu:"):
            return Device.wgpu(adapter=int(kind[5:]))
        return Device.wgpu(software=True) if kind == "lavapipe" else Device.wgpu()

    # -- what it is -----------------------------------------------------------------------------
    def describe(self) -> str:
        return self.backend.describe()

    def max_binding_bytes(self) -> int:
        """Largest single buffer binding, in bytes; larger tensors are stored in row chunks."""
        return self.backend.max_binding_bytes()

    def memory_bytes(self) -> int | None:
        """The device's memory in bytes (a GPU's device-local heap, through Vulkan; the host's RAM for the CPU
        device), None where it cannot be told (the browser, other native APIs)."""
        return self.backend.memory_bytes()

    def same_as(self, other: Device) -> bool:
        return self is other or self.backend.same_as(other.backend)

    @property
    def has_f16(self) -> bool:
        return self.backend.has_f16()

    @property
    def has_subgroups(self) -> bool:
        return self.backend.has_subgroups()

    @property
    def kernel_policy(self) -> Any:
        """Which kernel variants a WebGPU device's ops pick, and their tile / split numbers
        (`backends.wgpu.policy.KernelPolicy`, derived from the adapter); None on the CPU. Assign
        `dev.kernel_policy = dev.kernel_policy.replace(field=value)` to override fields for this
        device: later launches follow it (graphs captured before keep their launches)."""
        return self.ctx.policy if self.kind == "wgpu" else None

    @kernel_policy.setter
    def kernel_policy(self, policy: Any) -> None:
        from .backends.wgpu.policy import KernelPolicy

        if self.kind != "wgpu":
            raise UsageError(f"{self.describe()} has no kernel policy (WebGPU devices do)")
        if not isinstance(policy, KernelPolicy):
            raise UsageError(f"kernel_policy must be a KernelPolicy, got {type(policy).__name__}")
        self.ctx.policy = policy

    # -- batching, graphs and counters ----------------------------------------------------------
    def dispatch_scope(self) -> Any:
        """Batch every dispatch made while held into one command buffer and one submit. Nested
        scopes join the outer one; `.numpy()` inside submits first. A no-op on the CPU."""
        return self.backend.scope()

    def capture(self, fn: Any) -> Any:
        """Record `fn()` (ops on this device's tensors, no uploads or readbacks) as a graph:
        `g.replay(times)` runs the same work again and returns fn's outputs (the same tensors,
        rewritten in place, on WebGPU and on the CPU; inputs that change between replays must be
        tensors that fn reads, written with `ops.copy_into` or uploads between replays). Capturing
        runs nothing; what fn's outputs hold before the first replay is undefined. `g.release()`
        frees it."""
        return self.backend.capture(fn)

    def stats(self) -> dict[str, int]:
        """Counters: dispatches, submits, readbacks, bytes_uploaded, bytes_read, memory in use."""
        return self.backend.stats()

    def synchronize(self) -> None:
        """Submit pending work and wait for the GPU to finish it."""
        self.backend.synchronize()

    def empty_cache(self) -> None:
        self.backend.empty_cache()

    def release(self) -> None:
        """Free this device's GPU resources; tensors on it become unusable (DeviceReleasedError)."""
        self.backend.release()
        for k, d in list(Device._wgpu_cache.items()):
            if d is self:
                del Device._wgpu_cache[k]

    def __repr__(self) -> str:
        return f"Device({self.describe()!r})"


_FEATURES = ("shader-f16", "subgroup", "timestamp-query")


def _check_features(features: Iterable[str] | None) -> tuple[str, ...] | None:
    if features is None:
        return None
    if isinstance(features, str):
        features = (features,)
    feats = tuple(sorted(set(features)))
    bad = [f for f in feats if f not in _FEATURES]
    if bad:
        raise UsageError(f"unknown WebGPU feature(s) {bad}: expected a subset of {list(_FEATURES)}")
    return feats


def _check_binding(max_binding_bytes: int | None) -> int | None:
    if max_binding_bytes is None:
        return None
    if isinstance(max_binding_bytes, bool) or not isinstance(max_binding_bytes, int) or max_binding_bytes < 16:
        raise UsageError(f"max_binding_bytes must be an int >= 16, got {max_binding_bytes!r}")
    return max_binding_bytes


def _check_adapter(index: Any) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise UsageError(f"adapter must be an int >= 0 (an index of `webtensor devices`), got {index!r}")
    return index


def _nth_adapter(adapters: list[Any], index: int) -> Any:
    """Adapter `index` of an enumeration (the order `webtensor devices` lists them); NoAdapterError past the end."""
    if index >= len(adapters):
        raise NoAdapterError(f"no WebGPU adapter {index}: this machine has {len(adapters)} (`webtensor devices` "
                             "lists them, from 0)")
    return adapters[index]


def _no_adapter(software: bool | None) -> NoAdapterError:
    what = {True: "software ", False: "hardware "}.get(software, "")  # type: ignore[arg-type]
    return NoAdapterError(f"no {what}WebGPU adapter: " + _NO_ADAPTER_HELP)


def _in_browser() -> bool:
    import sys

    return sys.platform == "emscripten"
