"""`GpuApi` over the browser's WebGPU (`navigator.gpu`), from Python running in Pyodide.

The JavaScript half is `gpu_helper.js` (installed into the page's global scope on first use): it
keeps every GPU object in a handle table, so Python holds plain integers, builds all descriptors
on the JavaScript side, and encodes a whole command list per submit from one Uint32Array. A
Python->JS call with numbers costs a few microseconds; converting a descriptor dict ~100 us, which
is why nothing here converts dicts.

Readback is synchronous for webtensor (`WgpuContext.read`), so it blocks on `mapAsync` through
`pyodide.ffi.run_sync` (JavaScript Promise Integration). That needs the Python call stack to have
been entered asynchronously: `pyodide.runPythonAsync`, an `async def` called from JavaScript, or
`callPromising`. While Python waits there, the browser's event loop runs (the page repaints).

Errors: shader/pipeline errors are caught with an error scope when the pipeline is created;
other validation errors arrive as `uncapturederror` events and are reported by `pop_error()`.

Buffer aliasing. webtensor's kernels declare every storage binding `read_write`, and its ops may
bind one buffer twice in a dispatch (an unused epilogue input gets the output buffer; x + x binds
x twice). Browsers enforce the WebGPU rule that a writable binding may not alias any other
binding in a dispatch (wgpu-native does not check it). So, per pipeline, this module finds the
storage bindings the shader never writes and declares them `read` (WGSL and layout): read-only
bindings may alias each other (bindings a kernel declares `read` itself, as the q8_0 kernels
do, get read-only layout entries too). A read-only binding that aliases a *written* one is given a
snapshot instead: a scratch buffer the dispatch's own bytes are copied into right before it, which
is what the kernel would read anyway (it reads each element before writing it, or not at all).
`snapshot_copies` counts those copies; ops that bind a dedicated placeholder need none.
"""

from __future__ import annotations

import array
import json
import re
from pathlib import Path
from typing import Any

from ..backends.wgpu.gpu_api import COPY_DST, STORAGE, AdapterInfo, read_only_bindings
from ..errors import GPUError, NoAdapterError

HELPER_JS = Path(__file__).with_name("gpu_helper.js")
_DISPATCH, _COPY = 0, 1
_STORAGE_DECL = re.compile(
    r"@binding\(\s*(\d+)\s*\)\s*var\s*<\s*storage\s*,\s*read_write\s*>\s*([A-Za-z_]\w*)")
_ASSIGN = re.compile(r"\s*(?:(?:\.\s*\w+)\s*)*(?:=(?!=)|\+=|-=|\*=|/=|%=|&=|\|=|\^=|<<=|>>=|\+\+|--)")


def _is_written(code: str, name: str) -> bool:
    """Whether WGSL `code` may write `name` (an indexed store, compound assignment, ++/--, or a
    pointer taken with `&`, e.g. for atomics: counted as a write to stay safe)."""
    if re.search(r"&\s*" + re.escape(name) + r"\b", code):
        return True
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\[", code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {"[": 1, "]": -1}.get(code[i], 0)
            i += 1
        while True:  # further indices: name[i][j] = ...
            j = i
            while j < len(code) and code[j].isspace():
                j += 1
            if j < len(code) and code[j] == "[":
                depth, i = 1, j + 1
                while i < len(code) and depth:
                    depth += {"[": 1, "]": -1}.get(code[i], 0)
                    i += 1
                continue
            break
        if _ASSIGN.match(code, i):
            return True
    return False


def storage_access(wgsl: str) -> tuple[str, list[bool]]:
    """(`wgsl` with never-written storage bindings declared `read`, written flag per binding 1..n)."""
    body = re.sub(r"//[^\n]*", "", wgsl)
    decls = [(int(m.group(1)), m.group(2)) for m in _STORAGE_DECL.finditer(body)]
    written = {b: _is_written(body, name) for b, name in decls}
    out = wgsl
    for b, _ in decls:
        if not written[b]:
            out = re.sub(r"(@binding\(\s*" + str(b) + r"\s*\)\s*var\s*<\s*storage\s*,\s*)read_write(\s*>)",
                         r"\1read\2", out)
    read_only = read_only_bindings(wgsl)  # declared `var<storage, read>` in the source already
    n = max([b for b, _ in decls] + list(read_only), default=0)
    return out, [False if i in read_only else written.get(i, True) for i in range(1, n + 1)]


def _js() -> Any:
    import js  # only exists under Pyodide

    return js


def _helper() -> Any:
    """The page's `webtensorGpu` object; evaluates gpu_helper.js first if the page did not load it."""
    js = _js()
    helper = getattr(js, "webtensorGpu", None)
    if helper is None:
        js.eval(HELPER_JS.read_text(encoding="utf-8"))
        helper = js.webtensorGpu
    return helper


def _run_sync(awaitable: Any, what: str) -> Any:
    from pyodide.ffi import can_run_sync, run_sync

    if not can_run_sync():
        raise GPUError(
            f"{what} has to wait for the GPU, which webtensor does through JSPI (pyodide.ffi.run_sync): "
            "call webtensor from an async entry point (pyodide.runPythonAsync, an async function called "
            "from JavaScript, or callPromising), in a browser with JavaScript Promise Integration"
        )
    return run_sync(awaitable)


_EMPTY = object()  # the token of an empty readback


class BindGroupHandle:
    """A bind group in the helper's table; dropping the last reference frees the JavaScript object."""

    __slots__ = ("id", "_release", "snapshots")

    def __init__(self, id_: int, release: Any, snapshots: tuple[tuple[int, int, int], ...] = ()):
        self.id, self._release = id_, release
        self.snapshots = snapshots  # (src, scratch, nbytes): copied right before each dispatch

    def __del__(self) -> None:
        try:
            self._release(self.id)
        except Exception:  # interpreter shutdown, page gone
            pass


class BrowserGpu:
    """`GpuApi` implemented through `gpu_helper.js`: buffers and pipelines are integer handles."""

    def __init__(self, ctx: Any, described: dict[str, Any]):
        self._ctx = ctx
        d = described
        name = d["name"]
        sw = d.get("isFallbackAdapter") or any(s in name.lower() for s in ("swiftshader", "llvmpipe", "warp"))
        self.info = AdapterInfo(
            name=name,
            backend="WebGPU (browser)",
            adapter_type="CPU" if sw else "Unknown",
            vendor=d.get("vendor", ""),
            driver=d.get("description", "") or d.get("architecture", ""),
            limits={k: int(v) for k, v in d["adapterLimits"].items()},
            features=frozenset(d.get("adapterFeatures", ())),
        )
        self.limits: dict[str, int] = {k: int(v) for k, v in d["limits"].items()}
        self.features: frozenset[str] = frozenset(d["features"])
        self._release_js = ctx.release
        self._sizes: dict[int, int] = {}  # buffer handle -> size
        self._written: dict[int, list[bool]] = {}  # pipeline handle -> written flag per storage binding
        self._scratch: dict[int, int] = {}  # size -> scratch buffer for snapshots
        self.snapshot_copies = 0

    @classmethod
    async def create_async(cls, max_binding: int | None = None) -> BrowserGpu:
        """Request an adapter and a device with the limits webtensor uses; raises NoAdapterError
        with the browser's reason (no WebGPU at all, or no adapter)."""
        helper = _helper()
        ctx = await helper.createContext(int(max_binding or 0))
        if isinstance(ctx, str):
            raise NoAdapterError(ctx)
        return cls(ctx, json.loads(ctx.describe()))

    # -- GpuApi ---------------------------------------------------------------------------------
    def create_buffer(self, size: int, usage: int, label: str = "") -> int:
        h = int(self._ctx.createBuffer(int(size), int(usage), label))
        self._sizes[h] = int(size)
        return h

    def destroy_buffer(self, buffer: int) -> None:
        self._sizes.pop(buffer, None)
        self._ctx.destroyBuffer(buffer)

    def write_buffer(self, buffer: int, offset: int, data: Any) -> None:
        mv = memoryview(data)
        if mv.nbytes == 0:
            return
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        self._ctx.writeBuffer(buffer, int(offset), mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv)

    def create_pipeline(self, wgsl: str, n_storage: int, label: str, uniform_size: int) -> int:
        code, written = storage_access(wgsl)
        written = (written + [True] * n_storage)[:n_storage]
        mask = sum(1 << i for i, w in enumerate(written) if not w)
        promise = self._ctx.createPipeline(code, n_storage, label, uniform_size, mask)
        h = int(_run_sync(promise, "compiling a kernel"))
        self._written[h] = written
        return h

    def create_bind_group(self, pipeline: int, uniform: int, storage: list[int]) -> BindGroupHandle:
        written = self._written.get(pipeline, [True] * len(storage))
        out_bufs = [b for b, w in zip(storage, written, strict=False) if w]
        if len(set(out_bufs)) != len(out_bufs):
            raise GPUError("a dispatch binds one buffer to two bindings its kernel writes; the browser's "
                           "WebGPU forbids such aliasing")
        bound, snaps = list(storage), {}
        for i, b in enumerate(storage):
            if not written[i] and b in out_bufs:
                if b not in snaps:
                    size = self._sizes[b]
                    snaps[b] = (b, self._scratch_buffer(size), size)
                bound[i] = snaps[b][1]
        bg = int(self._ctx.createBindGroup(pipeline, uniform, *bound))
        return BindGroupHandle(bg, self._release_js, tuple(snaps.values()))

    def _scratch_buffer(self, size: int) -> int:
        h = self._scratch.get(size)
        if h is None:
            h = self._scratch[size] = self.create_buffer(size, STORAGE | COPY_DST, "webtensor-snapshot")
        return h

    def encode(self, commands: list[tuple]) -> array.array:
        """The command list as the helper's flat uint32 words."""
        words = array.array("I")
        for c in commands:
            kind = c[0]
            if kind == "dispatch":
                bg = c[2]
                for src, dst, n in bg.snapshots:
                    words.extend((_COPY, src, 0, dst, 0, n))
                    self.snapshot_copies += 1
                words.extend((_DISPATCH, c[1], bg.id, c[3], c[4], c[5], c[6]))
            elif kind == "copy":
                words.extend((_COPY, c[1], c[2], c[3], c[4], c[5]))
            else:
                raise GPUError(f"the browser backend does not support {kind!r} commands")
        return words

    def submit(self, commands: list[tuple], read: tuple[Any, int, int] | None = None) -> memoryview | None:
        token = self.submit_async(commands, read)
        return None if token is None else self.finish(token)

    def submit_async(self, commands: list[tuple], read: tuple[Any, int, int] | None = None) -> Any:
        """Submit without waiting; with `read`, a token (the readback's promise) for `finish`."""
        words = self.encode(commands)
        if read is None or read[2] == 0:
            if words:
                self._ctx.submit(words, len(words), 0, 0, 0)
            return None if read is None else _EMPTY
        buf, off, n = read
        return self._ctx.submit(words, len(words), buf, int(off), int(n))

    def finish(self, token: Any) -> memoryview:
        """Wait for a readback started by `submit_async`; its bytes."""
        if token is _EMPTY:
            return memoryview(b"")
        return memoryview(_run_sync(token, "reading a tensor back").to_bytes())

    def pop_error(self) -> str | None:
        err = self._ctx.popError()
        return str(err) if err else None

    # -- browser specifics ----------------------------------------------------------------------
    def wgsl_preamble(self, code: str) -> str:
        """Browsers need `enable subgroups;` before a shader may use subgroup builtins (naga
        natively rejects the line, so only this API adds it)."""
        if "subgroup" in self.features and "subgroup" in code and "enable subgroups;" not in code:
            return "enable subgroups;\n" + code
        return code

    def destroy(self) -> None:
        self._ctx.destroy()
