"""The seam between webtensor's WebGPU backend and a concrete WebGPU API.

Everything above this module (context, scope, kernels) talks to the GPU only through the small
`GpuApi` interface below, so two implementations can sit behind it: `NativeGpu` here (wgpu-py over
Vulkan / Metal / D3D12), and the browser's `navigator.gpu` through Pyodide's FFI (`browser_gpu.py`, beside this file).
The interface is batch-shaped on purpose: a flush hands over a whole list of commands, so an
implementation can encode them in one foreign call.

Commands (plain tuples, cheap to build):
    ("dispatch", pipeline, bind_group, uniform_offset, x, y, z)
    ("copy", src_buffer, src_offset, dst_buffer, dst_offset, nbytes)
    ("pass",)   end the current compute pass (the next dispatch opens a new one; for measurements)
Buffers passed in are the implementation's own handles. Uploads take any buffer-protocol object.
The implementations: `NativeGpu` below and `BrowserGpu` (browser_gpu.py beside this file, with gpu_helper.js).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

# WebGPU buffer usage bits (same numbers in every implementation of the spec).
MAP_READ, MAP_WRITE, COPY_SRC, COPY_DST, UNIFORM, STORAGE, QUERY_RESOLVE = 1, 2, 4, 8, 64, 128, 512
STORAGE_USAGE = STORAGE | COPY_SRC | COPY_DST
UNIFORM_USAGE = UNIFORM | COPY_DST

# Limits webtensor asks for explicitly (hyphenated, as WebGPU names them).
WANTED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroups-per-dimension",
    "max-dynamic-uniform-buffers-per-pipeline-layout",
)
WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query")


@dataclass(frozen=True)
class AdapterInfo:
    name: str  # "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
    backend: str  # "Vulkan", "Metal", "D3D12", "WebGPU"
    adapter_type: str  # "DiscreteGPU", "IntegratedGPU", "CPU", "Unknown"
    vendor: str = ""
    driver: str = ""
    limits: dict[str, int] = field(default_factory=dict)
    features: frozenset[str] = frozenset()
    subgroup_sizes: tuple[int, int] = (0, 0)  # (min, max) the adapter reports

    @property
    def is_software(self) -> bool:
        return self.adapter_type == "CPU" or any(
            s in self.name.lower() for s in ("llvmpipe", "lavapipe", "swiftshader", "warp")
        )


# One recorded GPU command: ("dispatch", pipeline, bind group, uniform offset, x, y, z) or
# ("copy", src buffer, src offset, dst buffer, dst offset, bytes) (handles are the API's own objects).
Command = tuple[Any, ...]


class GpuApi(Protocol):
    """What webtensor needs from a WebGPU implementation; nothing more."""

    info: AdapterInfo
    limits: dict[str, int]  # the limits the device was created with
    features: frozenset[str]  # the features the device was created with
    # whether the shader compiler inserts its runtime checks (bounds clamps, loop bounding) into
    # webtensor's kernels: True in the browser (its own choice), False natively unless asked for
    shader_checks: bool

    def create_buffer(self, size: int, usage: int, label: str = "") -> Any: ...
    def memory_bytes(self) -> int | None:
        """The adapter's own memory (its largest device-local heap), where the implementation can tell."""
        ...
    def destroy_buffer(self, buffer: Any) -> None: ...
    def write_buffer(self, buffer: Any, offset: int, data: Any) -> None: ...
    def flush_writes(self) -> Any:
        """Submit the buffer writes queued so far; a token for `wait_writes`. Optional (the context looks it up):
        where writes keep a staging copy until a submission carries them (wgpu), this bounds what they hold."""
        ...
    def wait_writes(self, token: Any) -> None:
        """Block until the submission `token` stands for has run (its writes' staging copies are freed)."""
        ...
    def buffer_alive(self, buffer: Any) -> bool:
        """False once the implementation has released the buffer behind the handle."""
        ...
    def enable_directives(self, features: set[str]) -> str:
        """The WGSL `enable` lines a shader using these device features needs on this API."""
        ...
    def create_pipeline(self, wgsl: str, read_only: tuple[bool, ...], label: str, uniform_size: int) -> Any:
        """A compute pipeline: binding 0 a dynamic-offset uniform of `uniform_size` bytes, then one
        storage binding per entry of `read_only` (True: `read-only-storage` in the layout)."""
        ...
    def check_shaders(self, shaders: list[tuple[str, str]]) -> list[str | None]:
        """Compile each (label, WGSL) of `shaders` to a shader module only (no pipeline): the shader compiler's
        errors for each, None where it compiled (how a device's own compiler is asked about every kernel
        variant at once: `web.selftest.check_kernels`)."""
        ...
    def create_bind_group(self, pipeline: Any, uniform: Any, storage: list[Any]) -> Any: ...
    def submit(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> memoryview | None:
        """Encode `commands` into one command buffer, submit it once; if `read` = (buffer, offset,
        nbytes) is given, copy that range out after the commands and return its bytes."""
        ...
    def submit_async(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> Any:
        """Like `submit` without waiting: a token whose bytes `finish(token)` returns, so the CPU
        can encode more work while the GPU runs."""
        ...
    def finish(self, token: Any) -> memoryview: ...
    def pop_error(self) -> str | None:
        """The first validation/out-of-memory error since the last call, as text, else None."""
        ...
    def timestamps(self, commands: list[Command]) -> list[float] | None:
        """GPU microseconds of each dispatch in `commands`, each in its own pass (None: no
        timestamp-query feature on this device)."""
        ...


def _subgroup_sizes(info: Any) -> tuple[int, int]:
    lo = info.get("subgroup_min_size") or info.get("stackgroup_min_size") or 0
    hi = info.get("subgroup_max_size") or info.get("stackgroup_max_size") or 0
    return int(lo), int(hi)


def _limits_to_request(adapter_limits: Any, max_binding: int | None) -> dict[str, int]:
    wanted = {k: int(adapter_limits[k]) for k in WANTED_LIMITS if adapter_limits.get(k) is not None}
    if max_binding is not None:
        wanted["max-storage-buffer-binding-size"] = min(wanted["max-storage-buffer-binding-size"], max_binding)
    return wanted


class NativeGpu:
    """`GpuApi` over wgpu-py (wgpu-native): Vulkan, Metal or D3D12."""

    def __init__(self, adapter: Any, device: Any, requested_limits: dict[str, int], shader_checks: bool = False):
        import wgpu

        self._wgpu = wgpu
        self.adapter = adapter
        self.device = device
        raw = adapter.info
        self.info = AdapterInfo(
            name=str(raw.get("device") or raw.get("description") or "unknown adapter"),
            backend=str(raw.get("backend_type", "unknown")),
            adapter_type=str(raw.get("adapter_type", "Unknown")),
            vendor=str(raw.get("vendor", "")),
            driver=str(raw.get("description", "")),
            limits={k: int(v) for k, v in adapter.limits.items() if isinstance(v, int)},
            features=frozenset(adapter.features),
            subgroup_sizes=_subgroup_sizes(raw),
        )
        self.limits = dict(requested_limits)
        self.features = frozenset(device.features)
        self.queue = device.queue
        self._staging: dict[int, list[Any]] = {}  # size -> free MAP_READ buffers, reused across readbacks
        # (read_only, uniform_size) -> (bind group layout, pipeline layout)
        self._layouts: dict[tuple[tuple[bool, ...], int], tuple[Any, Any]] = {}
        self._raw = _RawEncoder.load()
        self._offsets: dict[int, Any] = {}  # dynamic-offset arrays for the raw path, by offset
        self._trusted = None if shader_checks else _TrustedModules.load()
        self.shader_checks = self._trusted is None
        self._memory: list[int | None] = []  # (memory_bytes, once asked)

    def memory_bytes(self) -> int | None:
        """The Vulkan device-local heap of this adapter (WebGPU does not say; vkmem asks Vulkan), else None."""
        if not self._memory:
            from .vkmem import device_local_bytes

            self._memory.append(device_local_bytes(self.info.name) if self.info.backend == "Vulkan" else None)
        return self._memory[0]

    # -- creation -------------------------------------------------------------------------------
    @staticmethod
    def _pick(adapters: list[Any], software: bool | None) -> Any:
        def is_sw(a: Any) -> bool:
            i = a.info
            return i.get("adapter_type") == "CPU" or "llvmpipe" in str(i.get("device", "")).lower()

        order = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
        pool = [a for a in adapters if software is None or is_sw(a) == software]
        pool.sort(key=lambda a: order.get(a.info.get("adapter_type"), 4))
        return pool[0] if pool else None

    @classmethod
    def enumerate(cls) -> list[Any]:
        import wgpu

        try:
            return list(wgpu.gpu.enumerate_adapters_sync())
        except Exception:  # no Vulkan loader / driver at all
            return []

    @staticmethod
    def adapter_key(adapter: Any) -> tuple[str, ...]:
        """What identifies an adapter across enumerations (each enumeration makes new objects)."""
        i = adapter.info
        return tuple(str(i.get(k, "")) for k in ("vendor_id", "device_id", "device", "backend_type",
                                                   "adapter_type", "description"))

    @classmethod
    async def enumerate_async(cls) -> list[Any]:
        import wgpu

        try:
            return list(await wgpu.gpu.enumerate_adapters_async())
        except Exception:  # no Vulkan loader / driver at all
            return []

    @classmethod
    async def pick_async(cls, software: bool | None) -> Any:
        return cls._pick(await cls.enumerate_async(), software)

    @classmethod
    def pick(cls, software: bool | None) -> Any:
        return cls._pick(cls.enumerate(), software)

    @classmethod
    async def open_async(cls, adapter: Any, max_binding: int | None, features: tuple[str, ...] | None,
                         shader_checks: bool = False) -> NativeGpu:
        limits = _limits_to_request(adapter.limits, max_binding)
        device = await adapter.request_device_async(required_features=cls._features(adapter, features),
                                                    required_limits=limits)
        return cls(adapter, device, limits, shader_checks)

    @classmethod
    def open(cls, adapter: Any, max_binding: int | None, features: tuple[str, ...] | None,
             shader_checks: bool = False) -> NativeGpu:
        """A device on `adapter` with the features webtensor uses (or only those of `features`
        the adapter has: how tests withhold `subgroup` / `shader-f16`); `shader_checks` keeps the
        shader compiler's runtime checks in webtensor's kernels (see `_TrustedModules`)."""
        limits = _limits_to_request(adapter.limits, max_binding)
        device = adapter.request_device_sync(required_features=cls._features(adapter, features),
                                             required_limits=limits)
        return cls(adapter, device, limits, shader_checks)

    @staticmethod
    def _features(adapter: Any, features: tuple[str, ...] | None) -> list[str]:
        return [f for f in (WANTED_FEATURES if features is None else features) if f in adapter.features]

    # -- GpuApi ---------------------------------------------------------------------------------
    def create_buffer(self, size: int, usage: int, label: str = "") -> Any:
        return self.device.create_buffer(size=size, usage=usage, label=label)

    def destroy_buffer(self, buffer: Any) -> None:
        buffer.destroy()

    @staticmethod
    def buffer_alive(buffer: Any) -> bool:
        """False once wgpu-py has released the native buffer (its object was finalised)."""
        return getattr(buffer, "_internal", None) is not None

    def write_buffer(self, buffer: Any, offset: int, data: Any) -> None:
        self.queue.write_buffer(buffer, offset, data)

    def flush_writes(self) -> Any:
        # wgpu copies each write into a staging buffer at once and frees it only once a submission carrying the
        # queued writes has run and the device is polled: an empty command buffer carries them
        cb = self.device.create_command_encoder().finish()
        if self._raw is not None:
            return self._raw.submit_for_index(self.queue._internal, cb)
        self.queue.submit([cb])
        return None

    def wait_writes(self, token: Any) -> None:
        if token is not None and self._raw is not None:
            self._raw.wait_for(self.device._internal, token)
        else:  # (without the raw entry points: everything submitted so far)
            self.device._poll_wait()

    def enable_directives(self, features: set[str]) -> str:
        # naga rejects `enable subgroups;` (subgroup builtins need only the device feature)
        return "enable f16;\n" if "shader-f16" in features else ""

    def _layout(self, read_only: tuple[bool, ...], uniform_size: int) -> tuple[Any, Any]:
        key = (read_only, uniform_size)
        if key not in self._layouts:
            wgpu = self._wgpu
            entries = [
                {
                    "binding": 0,
                    "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": "uniform", "has_dynamic_offset": True, "min_binding_size": uniform_size},
                }
            ] + [
                {"binding": i + 1, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": "read-only-storage" if ro else "storage"}}
                for i, ro in enumerate(read_only)
            ]
            bgl = self.device.create_bind_group_layout(entries=entries)
            self._layouts[key] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
        return self._layouts[key]

    def create_pipeline(self, wgsl: str, read_only: tuple[bool, ...], label: str, uniform_size: int) -> Any:
        bgl, layout = self._layout(tuple(read_only), uniform_size)
        if self._trusted is not None:
            module = self._trusted.create(self.device, wgsl, label)
        else:
            module = self.device.create_shader_module(code=wgsl, label=label)
        pipe = self.device.create_compute_pipeline(
            layout=layout, compute={"module": module, "entry_point": "main"}, label=label
        )
        return (pipe, bgl, uniform_size)

    def check_shaders(self, shaders: list[tuple[str, str]]) -> list[str | None]:
        out: list[str | None] = []
        for label, wgsl in shaders:
            try:  # (naga parses and validates the module here; wgpu-py raises its messages)
                self.device.create_shader_module(code=wgsl, label=label)
                out.append(None)
            except Exception as e:
                out.append(f"{type(e).__name__}: {e}")
        return out

    def create_bind_group(self, pipeline: Any, uniform: Any, storage: list[Any]) -> Any:
        _, bgl, usize = pipeline
        entries = [{"binding": 0, "resource": {"buffer": uniform, "offset": 0, "size": usize}}]
        entries += [
            {"binding": i + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(storage)
        ]
        return self.device.create_bind_group(layout=bgl, entries=entries)

    def submit(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> memoryview | None:
        token = self.submit_async(commands, read)
        return None if token is None else self.finish(token)

    def submit_async(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> Any:
        """Submit without waiting; with `read`, the range is copied to a staging buffer whose bytes
        `finish(token)` returns (waiting only then), so the CPU can go on encoding meanwhile."""
        enc = self.device.create_command_encoder()
        pass_ = None
        raw = self._raw
        last_pipe = None
        for cmd in commands:
            if cmd[0] == "dispatch":
                if pass_ is None:
                    pass_ = enc.begin_compute_pass()
                    last_pipe = None
                _, pipe, bg, uoff, x, y, z = cmd
                if raw is not None:  # straight to wgpu-native: ~5x less Python per dispatch
                    pi = pass_._internal
                    if pipe is not last_pipe:
                        raw.set_pipeline(pi, pipe[0]._internal)
                        last_pipe = pipe
                    offs = self._offsets.get(uoff)
                    if offs is None:
                        offs = self._offsets[uoff] = raw.ffi.new("uint32_t[1]", [uoff])
                    raw.set_bind_group(pi, 0, bg._internal, 1, offs)
                    raw.dispatch(pi, x, y, z)
                else:
                    pass_.set_pipeline(pipe[0])
                    pass_.set_bind_group(0, bg, [uoff])
                    pass_.dispatch_workgroups(x, y, z)
            else:
                if pass_ is not None:
                    pass_.end()
                    pass_ = None
                if cmd[0] == "copy":
                    _, src, soff, dst, doff, n = cmd
                    enc.copy_buffer_to_buffer(src, soff, dst, doff, n)
        if pass_ is not None:
            pass_.end()
        token = None
        if read is not None:
            buf, off, n = read
            size = max(256, 1 << (((n + 3) & ~3) - 1).bit_length())
            free = self._staging.setdefault(size, [])
            staging = free.pop() if free else self.device.create_buffer(
                size=size, usage=MAP_READ | COPY_DST, label="webtensor-staging")
            enc.copy_buffer_to_buffer(buf, off, staging, 0, (n + 3) & ~3)
            token = [staging, n, None]
        if raw is not None and token is not None:
            token[2] = raw.submit_for_index(self.queue._internal, enc.finish())
        else:
            self.queue.submit([enc.finish()])
        return token

    def finish(self, token: Any) -> memoryview:
        staging, n, index = token
        if index is not None:
            # Wait for this submission only, then map without wgpu-py's extra empty submit: its
            # map_sync waits (device poll with no submission index) for everything submitted so
            # far, so a step queued behind this one (BatchedGPT2Engine.follow) would be waited
            # for too, and the device would idle while the host plans the next
            self._raw.wait_for(self.device._internal, index)  # type: ignore[union-attr]
            promise = staging.map_async("READ_NOSYNC", 0, staging.size)
            self._raw.poll(self.device._internal)  # type: ignore[union-attr]  # (fires its callback)
            promise.sync_wait()
        else:
            staging.map_sync(self._wgpu.MapMode.READ, 0, staging.size)
        try:
            data = memoryview(bytes(staging.read_mapped(0, (n + 3) & ~3)))[:n]
        finally:
            staging.unmap()
        # only a cleanly unmapped buffer is reused: one left mapping by an interrupt (Ctrl-C in
        # map_sync) would make a later copy into it abort wgpu-native
        self._staging.setdefault(staging.size, []).append(staging)
        return data

    def pop_error(self) -> str | None:
        return None  # wgpu-py raises validation errors as exceptions at the call site

    def timestamps(self, commands: list[Command]) -> list[float] | None:
        if "timestamp-query" not in self.features:
            return None
        wgpu = self._wgpu
        disp = [c for c in commands if c[0] == "dispatch"]
        n = len(disp)
        qs = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        out = self.device.create_buffer(size=16 * n, usage=QUERY_RESOLVE | COPY_SRC)
        enc = self.device.create_command_encoder()
        for i, (_, pipe, bg, uoff, x, y, z) in enumerate(disp):
            p = enc.begin_compute_pass(timestamp_writes={
                "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            p.set_pipeline(pipe[0])
            p.set_bind_group(0, bg, [uoff])
            p.dispatch_workgroups(x, y, z)
            p.end()
        enc.resolve_query_set(qs, 0, 2 * n, out, 0)
        self.queue.submit([enc.finish()])
        raw = struct.unpack(f"<{2 * n}Q", bytes(self.queue.read_buffer(out)))
        out.destroy()
        return [(raw[2 * i + 1] - raw[2 * i]) / 1e3 for i in range(n)]


class _TrustedModules:
    """Shader modules made through wgpu-native's `wgpuDeviceCreateShaderModuleTrusted` with no
    runtime checks (flags 0: neither the bounds checks, 1, nor the forced loop bounding, 2, that
    `create_shader_module` always inserts). Measured on the H200 (docs/performance-notes.md): the
    checks cost matmul 1.24-1.53x and prefill attention 1.8-2.9x. This is safe only because every
    kernel in kernels/ is written so that no index leaves its buffer, workgroup array or local
    array for any shape its planner admits (each kernel's header says why), and every loop ends;
    the driver's own robust buffer access (which wgpu requests) stays on besides.
    `WEBTENSOR_SHADER_CHECKS=1` or `Device.wgpu(shader_checks=True)` restores the checks.
    wgpu-py 0.32 does not wrap the call; its cffi handles reach it (private API, pinned)."""

    def __init__(self, ffi: Any, lib: Any, libf: Any, new_struct_p: Any, string_view: Any, module_cls: Any):
        self._ffi, self._lib, self._libf = ffi, lib, libf
        self._new_struct_p, self._string_view, self._module_cls = new_struct_p, string_view, module_cls

    def create(self, device: Any, wgsl: str, label: str) -> Any:
        """A GPUShaderModule of `wgsl` without runtime checks; a WGSL error raises as
        `create_shader_module` would (wgpu-py's checked call wrapper)."""
        ffi = self._ffi
        source = self._new_struct_p("WGPUShaderSourceWGSL *", code=self._string_view(wgsl))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = self._lib.WGPUSType_ShaderSourceWGSL
        desc = self._new_struct_p("WGPUShaderModuleDescriptor *",
                                  nextInChain=ffi.cast("WGPUChainedStruct *", source),
                                  label=self._string_view(label))
        handle = self._libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, 0)
        if handle == ffi.NULL:
            raise RuntimeError(f"shader module {label!r}: wgpuDeviceCreateShaderModuleTrusted failed")
        return self._module_cls(label, handle, device)

    @classmethod
    def load(cls) -> _TrustedModules | None:
        """The entry point through wgpu-py's handles, or None (checks stay on) if they are missing."""
        try:
            from wgpu.backends.wgpu_native._api import GPUShaderModule, ffi, lib, libf, new_struct_p, to_c_string_view

            libf.wgpuDeviceCreateShaderModuleTrusted  # noqa: B018 (present in wgpu-native >= 25)
        except Exception:
            return None
        return cls(ffi, lib, libf, new_struct_p, to_c_string_view, GPUShaderModule)


class _RawEncoder:
    """wgpu-native's three compute-pass entry points (and submit-for-index / poll-for-index, for
    readbacks that wait for their own submission only), called through wgpu-py's own cffi handles.
    wgpu-py's wrappers cost ~10 us a dispatch on a server CPU (measured on the H200 host), about
    as much as a small kernel runs; these calls cost a fraction. Private API of wgpu-py 0.32
    (pinned); `WEBTENSOR_RAW_ENCODE=0` or any import failure falls back to the public API."""

    def __init__(self, libf: Any, ffi: Any):
        self.ffi, self._libf = ffi, libf
        self.set_pipeline = libf.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = libf.wgpuComputePassEncoderSetBindGroup
        self.dispatch = libf.wgpuComputePassEncoderDispatchWorkgroups

    def submit_for_index(self, queue: Any, command_buffer: Any) -> int:
        """Submit one command buffer (wgpu-py's GPUCommandBuffer); its submission index."""
        return int(self._libf.wgpuQueueSubmitForIndex(queue, 1, self.ffi.new("WGPUCommandBuffer[1]",
                                                                             [command_buffer._internal])))

    def wait_for(self, device: Any, index: int) -> None:
        """Block (the GIL released) until submission `index` has finished on the device."""
        self._libf.wgpuDevicePoll(device, True, self.ffi.new("WGPUSubmissionIndex *", index))

    def poll(self, device: Any) -> None:
        """Process finished work (map callbacks) without waiting."""
        self._libf.wgpuDevicePoll(device, False, self.ffi.NULL)

    @classmethod
    def load(cls) -> _RawEncoder | None:
        import os

        if os.environ.get("WEBTENSOR_RAW_ENCODE", "1") == "0":
            return None
        try:
            from wgpu.backends.wgpu_native._api import ffi, libf

            return cls(libf, ffi)
        except Exception:
            return None
