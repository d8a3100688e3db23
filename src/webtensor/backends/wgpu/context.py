"""WgpuContext: one WebGPU device and everything webtensor keeps for it.

- a pipeline cache (one compute pipeline per kernel variant, compiled once),
- a bind-group cache keyed by the buffers bound (whole buffers are always bound; element offsets
  and sizes travel in the uniform parameters, so steady-state loops hit the cache every time),
- a parameter arena: one uniform buffer with a slot per dispatch (128 bytes, or the adapter's uniform
  offset alignment if larger), bound with a dynamic offset and uploaded once per submit,
- a size-bucketed buffer pool (freed tensor buffers are reused, so the same loop binds the same
  buffers again: stable buffers, cached bind groups, no per-dispatch allocation),
- the pending command list of the current dispatch scope, and counters (`stats()`).

Thread model: one re-entrant lock serialises every use of the device; scopes nest per thread.
"""

from __future__ import annotations

import re
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ...errors import BufferLimitError, DeviceReleasedError, GPUError
from .gpu_api import STORAGE_USAGE, UNIFORM_USAGE, GpuApi

KERNEL_DIR = Path(__file__).parent / "kernels"
PARAM_BYTES = 128  # one kernel's uniform parameters: 32 scalars
ARENA_SLOTS = 2048  # dispatches per submit before an early flush
BIND_GROUP_CACHE = 4096


def kernel_source(file: str) -> str:
    """A kernel's WGSL as compiled: common.wgsl, then `file`.wgsl with each `// #include NAME` line
    replaced by kernels/NAME (shared pieces such as the matmul epilogue)."""
    text = (KERNEL_DIR / f"{file}.wgsl").read_text()
    text = re.sub(r"^// #include (\S+)$", lambda m: (KERNEL_DIR / m.group(1)).read_text(), text, flags=re.M)
    return (KERNEL_DIR / "common.wgsl").read_text() + text


class GpuBuffer:
    """A storage buffer owned by the pool; `id` is stable and keys the bind-group cache."""

    __slots__ = ("handle", "size", "id", "__weakref__")
    _next = 0

    def __init__(self, handle: Any, size: int):
        GpuBuffer._next += 1
        self.handle, self.size, self.id = handle, size, GpuBuffer._next


class Kernel:
    """A compiled WGSL kernel variant: its pipeline and how many storage buffers it binds."""

    __slots__ = ("name", "pipeline", "n_storage")

    def __init__(self, name: str, pipeline: Any, n_storage: int):
        self.name, self.pipeline, self.n_storage = name, pipeline, n_storage


def _bucket(nbytes: int) -> int:
    """Round a request up so similar sizes share pool entries (256 B grain; above 64 KiB, 1/16 to 1/32
    of the size)."""
    n = max(16, (nbytes + 255) & ~255)
    if n > 65536:
        grain = 1 << max(8, n.bit_length() - 5)
        n = (n + grain - 1) // grain * grain
    return n


class WgpuContext:
    def __init__(self, api: GpuApi, max_binding_bytes: int | None = None):
        self.api = api
        self.info = api.info
        lim = api.limits
        self.max_binding_bytes = int(lim["max-storage-buffer-binding-size"])
        if max_binding_bytes is not None:
            self.max_binding_bytes = min(self.max_binding_bytes, int(max_binding_bytes))
        self.max_buffer_bytes = int(lim.get("max-buffer-size", self.max_binding_bytes))
        self.max_workgroups = int(lim.get("max-compute-workgroups-per-dimension", 65535))
        self.has_f16 = "shader-f16" in api.features
        self.has_subgroups = "subgroup" in api.features
        # a subgroup size the kernels may rely on: only when the adapter has exactly one
        lo, hi = api.info.subgroup_sizes
        self.subgroup_size = lo if self.has_subgroups and lo == hi and lo >= 4 else 0
        self.lock = threading.RLock()
        self._local = threading.local()
        self.released = False
        self._pipelines: dict[tuple, Kernel] = {}
        self._bind_groups: OrderedDict[tuple, Any] = OrderedDict()
        self._pool: dict[int, list[GpuBuffer]] = {}
        self._pending: list[tuple] = []
        self._pending_names: list[str] = []
        align = int(api.info.limits.get("min-uniform-buffer-offset-alignment", 256))
        self._slot = max(PARAM_BYTES, align)  # bytes between two dispatches' parameters
        self._arena_size = ARENA_SLOTS * self._slot
        self._arena = bytearray(self._arena_size)
        self._arena_used = 0
        self._uniform = api.create_buffer(self._arena_size, UNIFORM_USAGE, "webtensor-params")
        self.counters = dict(
            dispatches=0, submits=0, readbacks=0, bytes_uploaded=0, bytes_read=0,
            buffers_created=0, bind_groups_created=0, pipelines_created=0,
        )
        self.bytes_in_use = 0  # held by live tensors
        self.bytes_pooled = 0  # freed, kept for reuse
        self.peak_bytes_in_use = 0

    # -- kernels --------------------------------------------------------------------------------
    def kernel(self, file: str, n_storage: int, defines: dict[str, str] | None = None) -> Kernel:
        """Compile (once) kernel `file`.wgsl with a header made from `defines`: a value that names a
        WGSL scalar type becomes `alias NAME = f16;`, any other value `const NAME = value;`."""
        key = (file, n_storage, tuple(sorted((defines or {}).items())))
        k = self._pipelines.get(key)
        if k is None:
            src = kernel_source(file)
            head = []
            defs = dict(defines or {})
            if any("f16" in str(v) for v in defs.values()):
                head.append("enable f16;")
            for name, value in defs.items():
                kind = "alias" if value in ("f32", "f16", "i32", "u32") else "const"
                head.append(f"{kind} {name} = {value};")
            label = file + "".join(f"-{v}" for _, v in key[2])
            code = "\n".join(head) + "\n" + src
            preamble = getattr(self.api, "wgsl_preamble", None)  # per-API `enable` lines (browser)
            if preamble is not None:
                code = preamble(code)
            with self.lock:
                pipe = self._guard(label, lambda: self.api.create_pipeline(
                    code, n_storage, label, PARAM_BYTES))
                self.counters["pipelines_created"] += 1
            k = self._pipelines[key] = Kernel(label, pipe, n_storage)
        return k

    # -- buffers --------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> GpuBuffer:
        self.check_alive()
        size = _bucket(nbytes)
        if size > self.max_buffer_bytes or nbytes > self.max_binding_bytes:
            raise BufferLimitError(
                f"a buffer of {nbytes:,} bytes is over this device's limit "
                f"(max binding {self.max_binding_bytes:,} B, max buffer {self.max_buffer_bytes:,} B)"
            )
        with self.lock:
            free = self._pool.get(size)
            alive = getattr(self.api, "buffer_alive", None)
            while free and alive is not None and not alive(free[-1].handle):
                self._forget(free.pop())
                self.bytes_pooled -= size
            if free:
                buf = free.pop()
                self.bytes_pooled -= size
            else:
                handle = self._guard("alloc", lambda: self.api.create_buffer(size, STORAGE_USAGE, "webtensor"))
                buf = GpuBuffer(handle, size)
                self.counters["buffers_created"] += 1
            self.bytes_in_use += size
            self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
            return buf

    def release(self, buf: GpuBuffer) -> None:
        """Return a buffer to the pool (called when the last tensor using it is dropped).

        When the garbage collector frees a reference cycle it runs every finaliser in it, so the
        API's buffer object may be finalised (released) even though the storage's finaliser put
        it in the pool: `alloc` checks and drops such buffers."""
        if self.released:
            return
        with self.lock:
            self.bytes_in_use -= buf.size
            self.bytes_pooled += buf.size
            self._pool.setdefault(buf.size, []).append(buf)

    def _forget(self, buf: GpuBuffer) -> None:
        """Drop the cached bind groups that bind `buf` (they would pin its memory)."""
        for key in [k for k in self._bind_groups if buf.id in k[1]]:
            del self._bind_groups[key]

    def empty_cache(self) -> None:
        """Destroy every pooled (unused) buffer and the bind groups that reference them."""
        with self.lock:
            self.flush()
            dead = {b.id for bufs in self._pool.values() for b in bufs}
            for bufs in self._pool.values():
                for b in bufs:
                    self.api.destroy_buffer(b.handle)
            self._pool.clear()
            self.bytes_pooled = 0
            for key in [k for k in self._bind_groups if any(i in dead for i in k[1])]:
                del self._bind_groups[key]

    def upload(self, buf: GpuBuffer, data: Any, offset: int = 0) -> None:
        """Write host bytes into `buf`. Pending dispatches are submitted first, so a write never
        overtakes commands recorded before it (a pooled buffer may still be read by them)."""
        with self.lock:
            self.check_alive()
            if self._pending:
                self.flush()
            mv = memoryview(data).cast("B")
            if mv.nbytes % 4:
                mv = memoryview(bytes(mv) + b"\0" * (4 - mv.nbytes % 4))
            self._guard("upload", lambda: self.api.write_buffer(buf.handle, offset, mv))
            self.counters["bytes_uploaded"] += mv.nbytes

    def read(self, buf: GpuBuffer, offset: int, nbytes: int) -> memoryview:
        """Submit whatever is pending together with a copy of `buf[offset:offset+nbytes]`; return it."""
        with self.lock:
            self.check_alive()
            lead = offset % 4  # copies start on 4-byte boundaries
            out = self._submit(read=(buf.handle, offset - lead, nbytes + lead))
            self.counters["readbacks"] += 1
            self.counters["bytes_read"] += nbytes
            return out[lead:]

    # -- dispatch -------------------------------------------------------------------------------
    def dispatch(self, kernel: Kernel, params: tuple, buffers: list[GpuBuffer], groups: tuple[int, int, int]) -> None:
        """Record one dispatch of `kernel` (submitted now, or when the enclosing scope ends)."""
        with self.lock:
            self.check_alive()
            if len(buffers) != kernel.n_storage:
                raise GPUError(f"{kernel.name}: binds {kernel.n_storage} buffers, got {len(buffers)}")
            x, y, z = groups
            if x == 0 or y == 0 or z == 0:
                return
            if max(groups) > self.max_workgroups:
                raise GPUError(f"{kernel.name}: {groups} workgroups is over the limit {self.max_workgroups}")
            if self._arena_used + self._slot > self._arena_size:
                self.flush()
            off = self._arena_used
            _pack(self._arena, off, params)
            self._arena_used += self._slot
            key = (id(kernel), tuple(b.id for b in buffers))
            bg = self._bind_groups.get(key)
            if bg is None:
                bg = self._guard(kernel.name, lambda: self.api.create_bind_group(
                    kernel.pipeline, self._uniform, [b.handle for b in buffers]))
                self.counters["bind_groups_created"] += 1
                self._bind_groups[key] = bg
                if len(self._bind_groups) > BIND_GROUP_CACHE:
                    self._bind_groups.popitem(last=False)
            self._pending.append(("dispatch", kernel.pipeline, bg, off, x, y, z))
            self._pending_names.append(kernel.name)
            self.counters["dispatches"] += 1
            if self.scope_depth == 0:
                self.flush()

    def copy(self, src: GpuBuffer, src_offset: int, dst: GpuBuffer, dst_offset: int, nbytes: int) -> None:
        with self.lock:
            self.check_alive()
            self._pending.append(("copy", src.handle, src_offset, dst.handle, dst_offset, nbytes))
            self._pending_names.append("copy")
            if self.scope_depth == 0:
                self.flush()

    # -- prebuilt command lists (decode graphs) -------------------------------------------------
    def param_block(self, params: list[tuple]) -> tuple[Any, list[int]]:
        """A uniform buffer holding `params` (one slot each), written once: a graph's parameters.
        Returns (buffer, slot offsets)."""
        data = bytearray(self._slot * max(1, len(params)))
        for i, prm in enumerate(params):
            _pack(data, i * self._slot, prm)
        with self.lock:
            buf = self._guard("param_block",
                              lambda: self.api.create_buffer(len(data), UNIFORM_USAGE, "webtensor-graph"))
            self.api.write_buffer(buf, 0, data)
        return buf, [i * self._slot for i in range(len(params))]

    def prebuilt(self, kernel: Kernel, uniform: Any, offset: int, buffers: list[GpuBuffer],
                 groups: tuple[int, int, int]) -> tuple:
        """One dispatch command with its own bind group (outside the cache), for `enqueue`."""
        if len(buffers) != kernel.n_storage:
            raise GPUError(f"{kernel.name}: binds {kernel.n_storage} buffers, got {len(buffers)}")
        with self.lock:
            bg = self._guard(kernel.name, lambda: self.api.create_bind_group(
                kernel.pipeline, uniform, [b.handle for b in buffers]))
            self.counters["bind_groups_created"] += 1
        return ("dispatch", kernel.pipeline, bg, offset, *groups)

    def enqueue(self, commands: list[tuple], names: str = "graph") -> None:
        """Append prebuilt commands to the pending batch (submitted with the next flush)."""
        with self.lock:
            self.check_alive()
            self._pending.extend(commands)
            self._pending_names.append(names)
            self.counters["dispatches"] += sum(1 for c in commands if c[0] == "dispatch")

    def read_async(self, buf: GpuBuffer, offset: int, nbytes: int) -> Any:
        """Submit what is pending plus a copy of the range; return a ticket whose `wait()` gives the
        bytes. Meanwhile the CPU may encode and submit more work."""
        with self.lock:
            self.check_alive()
            commands, names = self.take_pending()
            self.counters["submits"] += 1
            self.counters["readbacks"] += 1
            self.counters["bytes_read"] += nbytes
            if not hasattr(self.api, "submit_async"):
                data = self._guard(",".join(names), lambda: self.api.submit(commands, (buf.handle, offset, nbytes)))
                return _Ready(data)
            token = self._guard(",".join(names), lambda: self.api.submit_async(commands, (buf.handle, offset, nbytes)))
            return _Ticket(self, token)

    def flush(self) -> None:
        with self.lock:
            if self._pending:
                self._submit()

    def take_pending(self) -> tuple[list[tuple], list[str]]:
        """Hand over the pending batch (commands, op names) for submission, uploading the parameter
        arena its dispatches point into; the context starts an empty batch."""
        commands, names = self._pending, self._pending_names
        self._pending, self._pending_names = [], []
        used, self._arena_used = self._arena_used, 0
        if used:
            arena = memoryview(self._arena)[:used]
            self._guard(",".join(names), lambda: self.api.write_buffer(self._uniform, 0, arena))
        return commands, names

    def _submit(self, read: tuple | None = None) -> Any:
        commands, names = self.take_pending()
        try:
            out = self.api.submit(commands, read)
            err = self.api.pop_error()
        except Exception as e:  # validation error, out of memory, device lost
            raise GPUError(_describe_failure(names, e)) from e
        if err:
            raise GPUError(_describe_failure(names, err))
        self.counters["submits"] += 1
        return out

    def _guard(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except GPUError:
            raise
        except Exception as e:
            raise GPUError(f"WebGPU error in {what}: {e}") from e

    # -- scopes ---------------------------------------------------------------------------------
    @property
    def scope_depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def scope(self) -> DispatchScope:
        return DispatchScope(self)

    def check_alive(self) -> None:
        if self.released:
            raise DeviceReleasedError(f"the WebGPU device '{self.info.name}' was released; create a new Device")

    def release_device(self) -> None:
        with self.lock:
            if self.released:
                return
            self._pending.clear()
            self._bind_groups.clear()
            for bufs in self._pool.values():
                for b in bufs:
                    self.api.destroy_buffer(b.handle)
            self._pool.clear()
            self.released = True

    def stats(self) -> dict[str, int]:
        with self.lock:
            return dict(
                self.counters, bytes_in_use=self.bytes_in_use, bytes_pooled=self.bytes_pooled,
                peak_bytes_in_use=self.peak_bytes_in_use, pending=len(self._pending),
            )


class _Ready:
    def __init__(self, data: memoryview):
        self.data = data

    def wait(self) -> memoryview:
        return self.data


class _Ticket:
    def __init__(self, ctx: WgpuContext, token: Any):
        self.ctx, self.token, self.data = ctx, token, None

    def wait(self) -> memoryview:
        if self.data is None:
            with self.ctx.lock:
                self.data = self.ctx._guard("readback", lambda: self.ctx.api.finish(self.token))
        return self.data


class DispatchScope:
    """Batches every dispatch recorded while held into one command buffer and one submit.

    Nested scopes join the outermost; a readback inside submits what is pending first. On an
    exception the pending work is still submitted (or dropped if it is what failed)."""

    def __init__(self, ctx: WgpuContext):
        self.ctx = ctx

    def __enter__(self) -> DispatchScope:
        loc = self.ctx._local
        loc.depth = getattr(loc, "depth", 0) + 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        loc = self.ctx._local
        loc.depth -= 1
        if loc.depth == 0 and not self.ctx.released:
            if exc_type is None:
                self.ctx.flush()
            else:
                try:
                    self.ctx.flush()
                except GPUError:
                    pass  # the original exception is the one the user needs to see


def _describe_failure(names: list[str], err: Any) -> str:
    ops = sorted(set(names)) or ["(no commands)"]
    return f"WebGPU rejected a submit of {len(names)} commands (ops: {', '.join(ops[:12])}): {err}"


def _pack(arena: bytearray, off: int, params: tuple) -> None:
    fmt = "".join("f" if isinstance(p, float) else ("i" if p < 0 else "I") for p in params)
    struct.pack_into("<" + fmt, arena, off, *params)

