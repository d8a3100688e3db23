"""WgpuContext: one WebGPU device and everything webtensor keeps for it.

- a pipeline cache (one compute pipeline per kernel variant, compiled once, its declaration in
  `signatures.py` checked against the shader),
- a bind-group cache keyed by the kernel and the buffers bound (whole buffers are always bound; element offsets
  and sizes travel in the uniform parameters, so steady-state loops hit the cache every time),
- a parameter arena: one uniform buffer with a slot per dispatch (128 bytes, or the adapter's uniform
  offset alignment if larger), bound with a dynamic offset and uploaded once per submit,
- a size-bucketed buffer pool (freed tensor buffers are reused, so the same loop binds the same
  buffers again: stable buffers, cached bind groups, no per-dispatch allocation),
- the pending command list of the current dispatch scope, and counters (`stats()`),
- graph capture: while a `Graph` records (`capture()`), launches are recorded instead of run; the
  graph keeps its own parameter block and bind groups and replays the whole list with no Python
  work per dispatch (the WebGPU counterpart of a CUDA graph). The buffers a graph binds are pinned:
  a tensor dropped meanwhile does not give its buffer back to the pool until the graph is gone.

Every op reaches the GPU as a `launch(kernel, params by name, buffers by binding name, grid)`.

Thread model: one re-entrant lock serialises every use of the device; scopes nest per thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, overload

from ...errors import BufferLimitError, DeviceReleasedError, GPUError, GraphCaptureError
from .gpu_api import STORAGE_USAGE, UNIFORM_USAGE, AdapterInfo, Command, GpuApi
from .policy import KernelPolicy
from .signatures import SIGNATURES, Signature
from .workgroup_memory import workgroup_bytes

WORKGROUP_LIMIT = "max-compute-workgroup-storage-size"

KERNEL_DIR = Path(__file__).parent / "kernels"
_T = TypeVar("_T")
PARAM_BYTES = 128  # one kernel's uniform parameters: 32 scalars
ARENA_SLOTS = 2048  # dispatches per submit before an early flush
BIND_GROUP_CACHE = 4096
UPLOAD_PIECE = 16 << 20  # bytes an upload hands the API at once (`upload`; `upload_pieces` sets another)
_INCLUDE_DEPTH = 4  # `// #include` levels expanded (an include cycle fails instead of looping)
# the packed 4x8-bit integer builtins (a WGSL language extension, probed per device: WgpuContext.has_dot4)
DOT4_PATTERN = r"\b(dot4[IU]8Packed|pack4x[IU]8(Clamp)?|unpack4x[IU]8)\s*\("
DOT4_PROBE = """@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<i32>;
@compute @workgroup_size(1)
fn main() { o[0] = dot4I8Packed(p.x, p.y) + i32(pack4xI8(vec4<i32>(p.zzww))); }
"""


def kernel_source(file: str, defines: dict[str, str] | None = None) -> str:
    """A kernel's WGSL as compiled: common.wgsl, then `file`.wgsl with its includes (`expand_includes`) and
    `// #if NAME` / `// #else` / `// #endif` blocks (the directive may be indented) kept or dropped by whether
    define NAME is set and not zero (`preprocess`: how a kernel variant is chosen by its source, e.g. subgroup
    reductions only where the device has the feature)."""
    return (KERNEL_DIR / "common.wgsl").read_text() + preprocess(expand_includes(file), defines or {}, file)


def expand_includes(file: str) -> str:
    """Kernel `file`.wgsl (or a path) with each `// #include NAME` line replaced by kernels/NAME (shared pieces
    such as the matmul epilogue; an included file may include others, e.g. the quantized kernels' dequantizer its
    block type's file)."""
    path = Path(file) if Path(file).is_absolute() else KERNEL_DIR / f"{file}.wgsl"
    text = path.read_text()
    include = re.compile(r"^// #include (\S+)$", flags=re.M)
    for _ in range(_INCLUDE_DEPTH):
        text = include.sub(lambda m: (KERNEL_DIR / m.group(1)).read_text(), text)
    if include.search(text):
        raise GPUError(f"{file}.wgsl: includes nested deeper than {_INCLUDE_DEPTH}")
    return text


def preprocess(text: str, defines: dict[str, str], file: str) -> str:
    """`text` with its `// #if NAME` / `// #else` / `// #endif` blocks kept where define NAME is set and not zero
    (0, 0u, false or empty), dropped elsewhere (the directive lines themselves dropped)."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (keeping this block, keeping the enclosing block)
    for line in text.split("\n"):
        m = re.match(r"^\s*// #(if|else|endif)\b\s*(\w*)", line)  # (indented ones too)
        if m is None:
            if all(k for k, _ in stack):
                out.append(line)
            continue
        kind, name = m.groups()
        if kind == "if":
            outer = all(k for k, _ in stack)
            stack.append((defines.get(name, "0") not in ("0", "0u", "false", ""), outer))
        elif not stack:
            raise GPUError(f"{file}.wgsl: `// #{kind}` without `// #if`")
        elif kind == "else":
            keep, outer = stack.pop()
            stack.append((not keep, outer))
        else:
            stack.pop()
    if stack:
        raise GPUError(f"{file}.wgsl: unterminated `// #if`")
    return "\n".join(out)


class GpuBuffer:
    """A storage buffer owned by the pool; the object itself (by identity) keys the bind-group cache,
    `id` (unique, stable) names it."""

    __slots__ = ("handle", "size", "id", "pins", "orphaned", "__weakref__")
    _next = 0

    def __init__(self, handle: Any, size: int):
        GpuBuffer._next += 1
        self.handle, self.size, self.id = handle, size, GpuBuffer._next
        self.pins = 0  # graphs that bind it; the pool takes it back only at 0
        self.orphaned = False  # released by its tensor while pinned


class Kernel:
    """A compiled WGSL kernel variant: its pipeline and its declaration (`signatures.Signature`)."""

    __slots__ = ("name", "pipeline", "sig")

    def __init__(self, name: str, pipeline: Any, sig: Signature):
        self.name, self.pipeline, self.sig = name, pipeline, sig


class KernelText(NamedTuple):
    """A kernel variant's WGSL as a device compiles it (`WgpuContext.wgsl`): its label, code and declaration, and
    the device features it needs that the device lacks (none: it can be built there)."""

    label: str
    code: str
    sig: Signature
    missing: frozenset[str]


class Launch:
    """One planned dispatch: a kernel, its packed parameters, its buffers (binding order), a grid.
    (A slotted class, not a frozen dataclass: made once a dispatch, and a frozen dataclass's
    __init__ sets each field through object.__setattr__; nothing assigns to one after.)"""

    __slots__ = ("kernel", "params", "buffers", "grid")

    def __init__(self, kernel: Kernel, params: bytes, buffers: tuple[GpuBuffer, ...], grid: tuple[int, int, int]):
        self.kernel, self.params, self.buffers, self.grid = kernel, params, buffers, grid


def fixed_subgroup_size(info: AdapterInfo) -> int:
    """The subgroup size every kernel gets on this adapter, or 0 if it may vary. WebGPU reports only
    a range (wgpu-py 0.32 says 4..128 everywhere), so a single reported size is taken, and else the
    vendors whose compute subgroups are fixed by the hardware: NVIDIA (32-wide warps) and Apple
    GPUs (32-wide SIMD groups). H200: subgroup GEMV reductions measured 1,542 vs 1,423 tok/s (fp32
    decode, one run; docs/performance-notes.md)."""
    lo, hi = info.subgroup_sizes
    if lo == hi and lo >= 4:
        return lo
    name, vendor = info.name.lower(), str(info.vendor).lower()
    nvidia = "nvidia" in name or vendor in ("nvidia", "0x10de", "4318")
    if not info.is_software and (nvidia or name.startswith("apple")):
        return 32
    return 0


def _bucket(nbytes: int, limit: int) -> int:
    """Round a request up so similar sizes share pool entries (256 B grain; above 64 KiB, 1/16 to 1/32
    of the size), never past `limit` (buffers are bound whole, so none may outgrow the binding limit),
    and always to a multiple of 16 bytes (`limit` is one: see WgpuContext.max_binding_bytes)."""
    n = max(16, (nbytes + 255) & ~255)
    if n > 65536:
        grain = 1 << max(8, n.bit_length() - 5)
        n = (n + grain - 1) // grain * grain
    return max((nbytes + 15) & ~15, min(n, limit))


class WgpuContext:
    def __init__(self, api: GpuApi, max_binding_bytes: int | None = None):
        self.api = api
        self.info = api.info
        lim = api.limits
        self.max_binding_bytes = int(lim["max-storage-buffer-binding-size"])
        if max_binding_bytes is not None:
            self.max_binding_bytes = min(self.max_binding_bytes, int(max_binding_bytes))
        # whole 16-byte units: every pool buffer is then a multiple of 16 bytes (`_bucket`), so a
        # vec4 load whose first element lies in a buffer lies in it entirely (the kernels' bounds
        # arguments rely on this: a tail vec4 past a tensor's last element stays in its buffer)
        self.max_binding_bytes &= ~15
        self.max_buffer_bytes = int(lim.get("max-buffer-size", self.max_binding_bytes))
        self.max_workgroups = int(lim.get("max-compute-workgroups-per-dimension", 65535))
        self._bucket_limit = min(self.max_binding_bytes, self.max_buffer_bytes) & ~15  # (alloc's, fixed)
        self._buffer_alive = getattr(api, "buffer_alive", None)  # (alloc's check of pooled buffers)
        self.has_f16 = "shader-f16" in api.features
        self.has_subgroups = "subgroup" in api.features
        # a subgroup size the kernels may rely on: only when the adapter has exactly one
        self.subgroup_size = fixed_subgroup_size(api.info) if self.has_subgroups else 0
        # which kernel variants the planners pick here, and their numbers (Device.kernel_policy)
        self.policy = KernelPolicy.for_adapter(api.info)
        overrides = os.environ.get("WEBTENSOR_POLICY", "")
        if overrides.strip():
            self.policy = self.policy.with_overrides(overrides)
        self.lock = threading.RLock()
        self._local = threading.local()
        self.released = False
        self._pipelines: dict[tuple[Any, ...], Kernel] = {}
        self._kernels_seen: dict[tuple[Any, ...], Kernel] = {}  # the same Kernels by their defines as given (`kernel`)
        self._bind_groups: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._pool: dict[int, list[GpuBuffer]] = {}
        self._pending: list[Command] = []
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
        self._dummy = api.create_buffer(16, STORAGE_USAGE, "webtensor-unused-input")
        self._capture: Graph | None = None
        self.upload_piece = UPLOAD_PIECE
        self._staged = 0  # bytes written since the writes were last submitted
        self._writes_token: Any = None  # the submission that carried the writes before those

    # -- kernels --------------------------------------------------------------------------------
    def kernel(self, file: str, defines: dict[str, str] | None = None, signature: Signature | None = None) -> Kernel:
        """Compile (once) kernel `file`.wgsl with `defines` (`wgsl` says how the shader is made from them, and
        checks it against its declaration in `signatures.py` or `signature`)."""
        # first by the defines in the caller's order (a planner's dict literal gives the same order
        # every call), which skips the sort; a miss looks up the sorted key, so an order not seen
        # before finds the same Kernel
        fast = (file, tuple(defines.items())) if defines else (file, ())
        k = self._kernels_seen.get(fast)
        if k is not None:
            return k
        key = (file, tuple(sorted((defines or {}).items())))
        k = self._pipelines.get(key)
        if k is None:
            text = self.wgsl(file, defines, signature)
            label, code, sig = text.label, text.code, text.sig
            if text.missing:
                raise GPUError(f"kernel {label} needs the device feature(s) {sorted(text.missing)}, which "
                               f"{self.info.name} was created without")
            if sig.size > PARAM_BYTES:
                raise GPUError(f"{label}: its parameters ({sig.size} B) exceed a slot of {PARAM_BYTES} B")
            try:
                shared, limit = workgroup_bytes(code), self.workgroup_limit
            except ValueError as e:
                raise GPUError(f"kernel {label}: {e}") from None
            if shared > limit:  # (nothing below checks it: a driver given such a shader may hang the GPU)
                raise GPUError(f"kernel {label} declares {shared} B of workgroup memory; {self.info.name} allows "
                               f"{limit} B (a planner's miscount: a bug)")
            with self.lock:
                pipe = self._guard(label, lambda: self.api.create_pipeline(code, sig.read_only, label, PARAM_BYTES))
                self.counters["pipelines_created"] += 1
            k = self._pipelines[key] = Kernel(label, pipe, sig)
        self._kernels_seen[fast] = k
        return k

    def wgsl(self, file: str, defines: dict[str, str] | None = None, signature: Signature | None = None) -> KernelText:
        """Kernel `file`.wgsl as this device compiles it: a header made from `defines` (a value that names a
        WGSL scalar type becomes `alias NAME = f16;`, any other value `const NAME = value;`), the `enable`
        directives the features it uses need on this API, then `kernel_source`; and the device features it
        needs that this device lacks (shader-f16, subgroups, the packed 4x8-bit dot products). The
        declaration of `file` in `signatures.py` (or `signature`, for a kernel of one's own: a path to its
        .wgsl) is checked against the shader (GPUError)."""
        sig = signature or SIGNATURES.get(Path(file).stem)
        if sig is None:
            raise GPUError(f"kernel {file!r} has no declaration in signatures.py")
        defs = dict(defines or {})
        head = [f"{'alias' if v in ('f32', 'f16', 'i32', 'u32') else 'const'} {n} = {v};" for n, v in defs.items()]
        body = "\n".join(head) + "\n" + kernel_source(file, defs)
        code_only = re.sub(r"//[^\n]*", "", body)
        uses = {f for f, pat in (("shader-f16", r"\bf16\b"), ("subgroup", r"\bsubgroup\w*\s*\("))
                if re.search(pat, code_only)}
        missing = uses - set(self.api.features)
        if re.search(DOT4_PATTERN, code_only) and not self.has_dot4:
            missing.add("packed_4x8_integer_dot_product (a WGSL language extension)")
        code = self.api.enable_directives(uses) + body
        sig.check_wgsl(code)
        label = Path(file).stem + "".join(f"-{v}" for _, v in sorted(defs.items()))
        return KernelText(label, code, sig, frozenset(missing))

    @property
    def workgroup_limit(self) -> int:
        """Bytes of workgroup memory a kernel may declare on this device (its `max-compute-workgroup-storage-size`;
        WebGPU's default 16,384 where the API reports none): what tile-picking planners and `kernel` hold to."""
        return int(self.api.limits.get(WORKGROUP_LIMIT, 16384))

    @property
    def has_dot4(self) -> bool:
        """Whether this device's WGSL has the packed 4x8-bit integer dot products (`dot4I8Packed`,
        `pack4xI8`: the language extension packed_4x8_integer_dot_product). wgpu-py 0.32 reports no
        language features, and a browser's `wgslLanguageFeatures` says only what its compiler parses,
        so a probe kernel is compiled once per device: whether it builds is the answer."""
        known: bool | None = self.__dict__.get("_has_dot4")
        if known is None:
            try:
                with self.lock:
                    self.api.create_pipeline(DOT4_PROBE, (False,), "webtensor-dot4-probe", PARAM_BYTES)
                known = True
            except Exception:  # a compile error: the extension is not there
                known = False
            if not known:
                self.api.pop_error()  # (an error a failed compile may have left behind)
            self.__dict__["_has_dot4"] = known
        return known

    # -- buffers --------------------------------------------------------------------------------
    def alloc(self, nbytes: int, reuse: bool = True) -> GpuBuffer:
        """A buffer of at least `nbytes` from the pool (or a new one). While a graph is captured, one its
        dropped intermediates left (see Graph) unless `reuse` is False: a buffer about to be uploaded (a
        constant of the graph, written once now) must not be one an earlier launch of the graph writes."""
        if self.released:
            self.check_alive()
        size = _bucket(nbytes, self._bucket_limit)
        if size > self.max_buffer_bytes or size > self.max_binding_bytes:
            raise BufferLimitError(
                f"a buffer of {nbytes:,} bytes is over this device's limit "
                f"(max binding {self.max_binding_bytes:,} B, max buffer {self.max_buffer_bytes:,} B)"
            )
        with self.lock:
            cap = self._capture
            if cap is not None and reuse:  # a buffer this graph's earlier intermediates let go of (see Graph)
                again = cap.free.get(size)
                if again:
                    return again.pop()
            free = self._pool.get(size)
            alive = self._buffer_alive
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
            if self.bytes_in_use > self.peak_bytes_in_use:
                self.peak_bytes_in_use = self.bytes_in_use
            if cap is not None:
                cap.fresh.add(buf)
            return buf

    def release(self, buf: GpuBuffer) -> None:
        """Return a buffer to the pool (called when the last tensor using it is dropped).

        When the garbage collector frees a reference cycle it runs every finaliser in it, so the
        API's buffer object may be finalised (released) even though the storage's finaliser put
        it in the pool: `alloc` checks and drops such buffers."""
        if self.released:
            return
        with self.lock:
            cap = self._capture
            if cap is not None and buf in cap.fresh and buf not in cap.constants:
                cap.free.setdefault(buf.size, []).append(buf)  # (the graph's later intermediates may take it)
                return
            if buf.pins:
                buf.orphaned = True  # a graph still binds it: the pool gets it when the graph goes
                return
            self.bytes_in_use -= buf.size
            self.bytes_pooled += buf.size
            self._pool.setdefault(buf.size, []).append(buf)

    def _forget(self, buf: GpuBuffer) -> None:
        """Drop the cached bind groups that bind `buf` (they would pin its memory)."""
        for key in [k for k in self._bind_groups if buf in k[1]]:
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
            for key in [k for k in self._bind_groups if any(b.id in dead for b in k[1])]:
                del self._bind_groups[key]

    def upload(self, buf: GpuBuffer, data: Any, offset: int = 0, fresh: bool = False,
               done: Callable[[int, int], None] | None = None) -> None:
        """Write host bytes into `buf`. Pending dispatches are submitted first, so a write never
        overtakes commands recorded before it (a pooled buffer may still be read by them). While a
        graph is captured only `fresh` buffers (a new tensor: a constant of the graph) may be
        written; writing an existing tensor would not be part of the replay.

        The bytes go in pieces of `upload_piece`, and what the writes hold in host memory stays
        bounded: wgpu copies each write into a staging buffer and frees it only once a submission
        carrying it has run, so after each piece's worth of writes they are submitted and the
        submission before waited for: at most two pieces are staged, whatever the tensor or the
        model. `done(a, b)` is called once bytes a..b of `data` are copied (the caller may drop
        them: the pages of a file map)."""
        with self.lock:
            self.check_alive()
            if not fresh:
                self._no_capture("an upload into an existing tensor")
            elif self._capture is not None:
                self._capture.constants.add(buf)  # (written once, now: never an intermediate's to reuse)
            if self._pending:
                self.flush()
            mv = memoryview(data).cast("B")
            n, piece = mv.nbytes, max(4, self.upload_piece & ~3)
            for a in range(0, n, piece):
                b = min(n, a + piece)
                part = mv[a:b] if (b - a) % 4 == 0 else memoryview(bytes(mv[a:b]) + b"\0" * (-(b - a) % 4))
                self._guard("upload", lambda: self.api.write_buffer(buf.handle, offset + a, part))  # noqa: B023
                self.counters["bytes_uploaded"] += part.nbytes
                self._staged += part.nbytes
                if self._staged >= piece:
                    self.settle_writes()
                if done is not None:
                    done(a, b)

    def settle_writes(self) -> None:
        """Submit the writes queued so far and wait for the submission that carried the ones before (whose
        staging copies wgpu then frees): `upload`'s bound on staged bytes."""
        flush = getattr(self.api, "flush_writes", None)  # (the browser stages writes itself)
        if flush is None:
            return
        token = self._guard("upload", flush)
        earlier, self._writes_token, self._staged = self._writes_token, token, 0
        if earlier is not None or token is None:
            self._guard("upload", lambda: self.api.wait_writes(earlier))

    @contextlib.contextmanager
    def upload_pieces(self, piece: int) -> Iterator[None]:
        """`upload` writes pieces of `piece` bytes within the block (a model's load sizes them by its largest
        tensor), and everything written is submitted and waited for at its end."""
        with self.lock:
            before, self.upload_piece = self.upload_piece, piece
            try:
                yield
            finally:
                self.upload_piece = before
                self.settle_writes()
                self.settle_writes()

    def read(self, buf: GpuBuffer, offset: int, nbytes: int) -> memoryview:
        """Submit whatever is pending together with a copy of `buf[offset:offset+nbytes]`; return it."""
        with self.lock:
            self.check_alive()
            self._no_capture("a readback")
            lead = offset % 4  # copies start on 4-byte boundaries
            out = self._submit(read=(buf.handle, offset - lead, nbytes + lead))
            self.counters["readbacks"] += 1
            self.counters["bytes_read"] += nbytes
            return out[lead:]

    # -- launches -------------------------------------------------------------------------------
    def launch(self, kernel: Kernel, params: Mapping[str, Any], buffers: Mapping[str, GpuBuffer | None],
               groups: tuple[int, int, int]) -> None:
        """Plan one dispatch of `kernel`: parameters by field name, buffers by binding name (an
        optional input left out or None is bound to a dummy buffer), `groups` workgroups. Runs now
        (or when the enclosing scope ends), or is recorded when a graph is being captured."""
        sig = kernel.sig
        if not sig.binding_names.issuperset(buffers):
            raise GPUError(f"{kernel.name}: no binding(s) {sorted(set(buffers) - sig.binding_names)}")
        bound = []
        for name, optional in sig.binding_order:
            buf = buffers.get(name)
            if buf is None:
                if not optional:
                    raise GPUError(f"{kernel.name}: binding {name!r} needs a buffer")
                buf = self._dummy_buffer
            bound.append(buf)
        if len(set(bound)) < len(bound):  # a buffer bound twice (x + x may; the check below says)
            for b, buf in zip(sig.bindings, bound, strict=True):  # WebGPU: a written binding aliases nothing
                if b.writes and sum(x is buf for x in bound) > 1:
                    raise GPUError(f"{kernel.name}: buffer of binding {b.name!r} is also bound to another binding; "
                                   "a written binding may not alias any other (copy the input first)")
        x, y, z = groups
        if max(groups) > self.max_workgroups:
            raise GPUError(f"{kernel.name}: {groups} workgroups is over the limit {self.max_workgroups}")
        self.submit_launch(Launch(kernel, sig.pack(params), tuple(bound), (x, y, z)))

    def submit_launch(self, ln: Launch) -> None:
        with self.lock:
            if self.released:
                self.check_alive()
            if min(ln.grid) == 0:
                return
            if self._capture is not None:
                self._capture.record(ln)
                return
            if self._arena_used + self._slot > self._arena_size:
                self.flush()
            off = self._arena_used
            self._arena[off:off + len(ln.params)] = ln.params
            self._arena_used += self._slot
            # keyed by the kernel and the buffers themselves (identity, as GpuBuffer and Kernel define no
            # equality): whole buffers are bound, so these are everything a bind group is made of
            key = (ln.kernel, ln.buffers)
            bg = self._bind_groups.get(key)
            if bg is None:
                bg = self._guard(ln.kernel.name, lambda: self.api.create_bind_group(
                    ln.kernel.pipeline, self._uniform, [b.handle for b in ln.buffers]))
                self.counters["bind_groups_created"] += 1
                self._bind_groups[key] = bg
                if len(self._bind_groups) > BIND_GROUP_CACHE:
                    self._bind_groups.popitem(last=False)
            self._pending.append(("dispatch", ln.kernel.pipeline, bg, off, *ln.grid))
            self._pending_names.append(ln.kernel.name)
            self.counters["dispatches"] += 1
            if self.scope_depth == 0:
                self.flush()

    @property
    def _dummy_buffer(self) -> GpuBuffer:
        d = self.__dict__.get("_dummy_gb")
        if d is None:
            d = self.__dict__["_dummy_gb"] = GpuBuffer(self._dummy, 16)
        return d

    def copy(self, src: GpuBuffer, src_offset: int, dst: GpuBuffer, dst_offset: int, nbytes: int) -> None:
        with self.lock:
            self.check_alive()
            if self._capture is not None:
                self._capture.record_copy(src, src_offset, dst, dst_offset, nbytes)
                return
            self._pending.append(("copy", src.handle, src_offset, dst.handle, dst_offset, nbytes))
            self._pending_names.append("copy")
            if self.scope_depth == 0:
                self.flush()

    # -- graphs ---------------------------------------------------------------------------------
    def capture(self) -> Graph:
        """Start recording launches into a new Graph (use as a context manager)."""
        return Graph(self)

    def _no_capture(self, what: str) -> None:
        if self._capture is not None:
            raise GraphCaptureError(f"{what} while a graph is being captured: a graph replays GPU work only; "
                                    "write its inputs and read its outputs between replays")

    # -- submission -----------------------------------------------------------------------------
    def enqueue(self, commands: list[Command], names: str = "graph") -> None:
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
            self._no_capture("a readback")
            commands, names = self.take_pending()
            commands = self._guard(",".join(names), lambda: self._lead(commands))
            self.counters["submits"] += 1
            self.counters["readbacks"] += 1
            self.counters["bytes_read"] += nbytes
            if not hasattr(self.api, "submit_async"):
                data = self._guard(",".join(names), lambda: self.api.submit(commands, (buf.handle, offset, nbytes)))
                if data is None:
                    raise GPUError(f"WebGPU error in {','.join(names)}: the readback returned no bytes")
                return _Ready(data)
            token = self._guard(",".join(names), lambda: self.api.submit_async(commands, (buf.handle, offset, nbytes)))
            return _Ticket(self, token)

    def flush(self) -> None:
        with self.lock:
            if self._pending:
                self._submit()

    def take_pending(self) -> tuple[list[Command], list[str]]:
        """Hand over the pending batch (commands, op names) for submission, uploading the parameter
        arena its dispatches point into; the context starts an empty batch."""
        commands, names = self._pending, self._pending_names
        self._pending, self._pending_names = [], []
        used, self._arena_used = self._arena_used, 0
        if used:
            arena = memoryview(self._arena)[:used]
            self._guard(",".join(names), lambda: self.api.write_buffer(self._uniform, 0, arena))
        return commands, names

    @overload
    def _submit(self, read: None = None) -> None: ...

    @overload
    def _submit(self, read: tuple[Any, int, int]) -> memoryview: ...

    def _submit(self, read: tuple[Any, int, int] | None = None) -> memoryview | None:
        """Submit the pending batch; with `read` = (buffer, offset, nbytes), that range's bytes after it."""
        commands, names = self.take_pending()
        try:
            out = self.api.submit(self._lead(commands), read)
            err = self.api.pop_error()
        except Exception as e:  # validation error, out of memory, device lost
            raise GPUError(_describe_failure(names, e)) from e
        if err:
            raise GPUError(_describe_failure(names, err))
        self.counters["submits"] += 1
        return out

    def _lead(self, commands: list[Command]) -> list[Command]:
        """Submit the first pieces of a big batch on their own and return the rest: the GPU starts on
        them while the host encodes the rest (a prompt chunk's few hundred dispatches, whose encoding
        would otherwise come before any of its GPU work). Batches of fewer than the policy's
        submit_split_min commands (a decode step) go whole; else pieces of submit_first commands, then
        twice as many each, while more than twice the next piece remains."""
        first = self.policy.submit_first
        if not first or len(commands) < self.policy.submit_split_min:
            return commands
        i, size = 0, first
        while len(commands) - i > 2 * size:
            self.api.submit(commands[i:i + size], None)
            self.counters["submits"] += 1
            i, size = i + size, 2 * size
        return commands[i:]

    def _guard(self, what: str, fn: Callable[[], _T]) -> _T:
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
                shader_checks=int(self.shader_checks),
            )

    @property
    def shader_checks(self) -> bool:
        """Whether the shader compiler's runtime checks are in this device's kernels."""
        return bool(getattr(self.api, "shader_checks", True))


class _Ready:
    def __init__(self, data: memoryview):
        self.data = data

    def wait(self) -> memoryview:
        return self.data


class _Ticket:
    def __init__(self, ctx: WgpuContext, token: Any):
        self.ctx, self.token = ctx, token
        self.data: memoryview | None = None

    def wait(self) -> memoryview:
        data = self.data
        if data is None:
            with self.ctx.lock:
                data = self.data = self.ctx._guard("readback", lambda: self.ctx.api.finish(self.token))
        return data


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


class Graph:
    """Launches recorded once and replayed: `with ctx.capture() as g: <ops>` then `g.replay()`.

    Replay enqueues the recorded commands (with the graph's own parameter block and bind groups)
    into the pending batch, so several replays can share one submit. Only GPU work is recorded:
    uploads and readbacks inside the capture are refused (GraphCaptureError). What changes from one
    replay to the next must live in GPU tensors the graph reads (positions, token ids).

    Memory: a buffer the capture allocated and whose tensor is dropped before the capture ends (an
    intermediate) goes to the graph's own free list (`free`), and a later allocation of the same size
    in the same capture takes it: the launches replay in the recorded order, so the later tenant is
    written after the earlier one's last reader, and a graph holds about its largest live set instead of
    every intermediate (a prompt chunk of 512 rows: a few activations, not ~10 a layer). Constants
    uploaded during the capture (`constants`) are never reused. What is still free at the end stays
    pinned (orphaned) until the graph is released; the general pool never hands out a graph's
    buffer while the graph lives."""

    def __init__(self, ctx: WgpuContext):
        self.ctx = ctx
        self.launches: list[Launch | tuple[str, GpuBuffer, int, GpuBuffer, int, int]] = []  # or a copy:
        # ("copy", src, soff, dst, doff, n)
        self.commands: list[Command] = []
        self.names: list[str] = []
        self._pinned: list[GpuBuffer] = []
        self._uniform: Any = None
        self.fresh: set[GpuBuffer] = set()  # buffers allocated while capturing
        self.constants: set[GpuBuffer] = set()  # ... and written by an upload then
        self.free: dict[int, list[GpuBuffer]] = {}  # ... and let go of by their tensors, by size

    def __enter__(self) -> Graph:
        ctx = self.ctx
        ctx.lock.acquire()
        if ctx._capture is not None:
            ctx.lock.release()
            raise GraphCaptureError("a graph is already being captured on this device")
        ctx.flush()
        ctx._capture = self
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ctx = self.ctx
        ctx._capture = None
        try:
            if exc_type is None:
                self._build()
            else:
                self.release()
        finally:
            free = [b for bufs in self.free.values() for b in bufs]
            self.fresh, self.constants, self.free = set(), set(), {}
            for b in free:  # (released again now: orphaned while pinned, else to the pool)
                ctx.release(b)
            ctx.lock.release()

    def record(self, ln: Launch) -> None:
        self.launches.append(ln)
        self._pin(ln.buffers)

    def record_copy(self, src: GpuBuffer, soff: int, dst: GpuBuffer, doff: int, n: int) -> None:
        self.launches.append(("copy", src, soff, dst, doff, n))
        self._pin((src, dst))

    def _pin(self, bufs: tuple[GpuBuffer, ...]) -> None:
        for b in bufs:
            b.pins += 1
            self._pinned.append(b)

    def _build(self) -> None:
        ctx = self.ctx
        slot = ctx._slot
        dispatches = [ln for ln in self.launches if isinstance(ln, Launch)]
        data = bytearray(slot * max(1, len(dispatches)))
        for i, ln in enumerate(dispatches):
            data[i * slot:i * slot + len(ln.params)] = ln.params
        self._uniform = ctx._guard("graph", lambda: ctx.api.create_buffer(len(data), UNIFORM_USAGE, "webtensor-graph"))
        ctx.api.write_buffer(self._uniform, 0, data)
        i = 0
        for item in self.launches:
            if isinstance(item, Launch):
                ln = item
                bg = ctx._guard(ln.kernel.name, functools.partial(ctx.api.create_bind_group, ln.kernel.pipeline,
                                                                  self._uniform, [b.handle for b in ln.buffers]))
                ctx.counters["bind_groups_created"] += 1
                self.commands.append(("dispatch", ln.kernel.pipeline, bg, i * slot, *ln.grid))
                self.names.append(ln.kernel.name)
                i += 1
            else:
                _, src, soff, dst, doff, n = item
                self.commands.append(("copy", src.handle, soff, dst.handle, doff, n))
                self.names.append("copy")

    @property
    def n_dispatches(self) -> int:
        return sum(1 for c in self.commands if c[0] == "dispatch")

    def replay(self, times: int = 1) -> None:
        """Enqueue the recorded work `times` times (submitted at the next flush or readback)."""
        from ..base import replay_times

        times = replay_times(times)
        if not self.commands and self.launches:
            raise GraphCaptureError("this graph was released")
        self.ctx.enqueue(self.commands * times, "graph")
        if self.ctx.scope_depth == 0:
            self.ctx.flush()

    def release(self) -> None:
        """Unpin the graph's buffers (orphaned ones go back to the pool) and free its uniforms."""
        ctx = self.ctx
        pinned, self._pinned = self._pinned, []
        with ctx.lock:
            for b in pinned:
                b.pins -= 1
                if b.pins == 0 and b.orphaned:
                    b.orphaned = False
                    ctx.release(b)
            if self._uniform is not None and not ctx.released:
                ctx.api.destroy_buffer(self._uniform)
            self._uniform = None
            self.commands = []

    def __del__(self) -> None:
        if getattr(self, "_pinned", None):
            try:
                self.release()
            except Exception:  # interpreter shutdown
                pass
