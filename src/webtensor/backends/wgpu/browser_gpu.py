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

Buffer aliasing: browsers enforce WebGPU's rule that a written binding may not alias any other in
a dispatch. webtensor's kernels declare their inputs `var<storage, read>` (and the layout says so,
from `signatures.py`), unused inputs get a dummy buffer, and `WgpuContext.launch` refuses a written
binding that aliases, so the same shaders run here unchanged.
"""

from __future__ import annotations

import array
import json
from pathlib import Path
from typing import Any

from ...errors import GPUError, NoAdapterError
from .gpu_api import AdapterInfo, Command

HELPER_JS = Path(__file__).with_name("gpu_helper.js")
_DISPATCH, _COPY = 0, 1


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

    __slots__ = ("id", "_release")

    def __init__(self, id_: int, release: Any):
        self.id, self._release = id_, release

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
        self.fallback = bool(d.get("isFallbackAdapter"))  # the browser says: a software fallback (SwiftShader, WARP)
        sw = self.fallback or any(s in name.lower() for s in ("swiftshader", "llvmpipe", "warp"))
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
        self.shader_checks = True  # the browser's compiler decides (WebGPU offers no way to drop its checks)
        self._release_js = ctx.release
        self._sizes: dict[int, int] = {}  # buffer handle -> size

    @classmethod
    async def create_async(cls, max_binding: int | None = None,
                           features: tuple[str, ...] | None = None) -> BrowserGpu:
        """Request an adapter and a device with the limits webtensor uses, and the optional features
        it uses (or only those of `features`); raises NoAdapterError with the browser's reason (no
        WebGPU at all, or no adapter)."""
        helper = _helper()
        ctx = await helper.createContext(int(max_binding or 0), ",".join(features) if features is not None else "*")
        if isinstance(ctx, str):
            raise NoAdapterError(ctx)
        return cls(ctx, json.loads(ctx.describe()))

    # -- GpuApi ---------------------------------------------------------------------------------
    def memory_bytes(self) -> int | None:
        """The browser does not say how much memory an adapter has."""
        return None

    def create_buffer(self, size: int, usage: int, label: str = "") -> int:
        h = int(self._ctx.createBuffer(int(size), int(usage), label))
        self._sizes[h] = int(size)
        return h

    def destroy_buffer(self, buffer: int) -> None:
        self._sizes.pop(buffer, None)
        self._ctx.destroyBuffer(buffer)

    def buffer_alive(self, buffer: int) -> bool:
        return buffer in self._sizes

    def write_buffer(self, buffer: int, offset: int, data: Any) -> None:
        mv = memoryview(data)
        if mv.nbytes == 0:
            return
        if not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
        self._ctx.writeBuffer(buffer, int(offset), mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv)

    def enable_directives(self, features: set[str]) -> str:
        # browsers need `enable subgroups;` before subgroup builtins (naga natively rejects it)
        return "".join(line for f, line in (("shader-f16", "enable f16;\n"), ("subgroup", "enable subgroups;\n"))
                       if f in features)

    def create_pipeline(self, wgsl: str, read_only: tuple[bool, ...], label: str, uniform_size: int) -> int:
        mask = sum(1 << i for i, ro in enumerate(read_only) if ro)
        promise = self._ctx.createPipeline(wgsl, len(read_only), label, uniform_size, mask)
        return int(_run_sync(promise, "compiling a kernel"))

    def check_shaders(self, shaders: list[tuple[str, str]]) -> list[str | None]:
        """All of them in one call: the browser's compiler reports each module's errors (getCompilationInfo)."""
        listed = json.dumps([dict(label=label, code=wgsl) for label, wgsl in shaders])
        found = json.loads(str(_run_sync(self._ctx.checkShaders(listed), "compiling kernels")))
        return [m or None for m in found]

    def create_bind_group(self, pipeline: int, uniform: int, storage: list[int]) -> BindGroupHandle:
        bg = int(self._ctx.createBindGroup(pipeline, uniform, *storage))
        return BindGroupHandle(bg, self._release_js)

    def encode(self, commands: list[Command]) -> array.array[int]:
        """The command list as the helper's flat uint32 words."""
        words = array.array("I")
        for c in commands:
            kind = c[0]
            if kind == "dispatch":
                words.extend((_DISPATCH, c[1], c[2].id, c[3], c[4], c[5], c[6]))
            elif kind == "copy":
                words.extend((_COPY, c[1], c[2], c[3], c[4], c[5]))
            elif kind != "pass":  # (passes are a native measurement aid; one pass per submit here)
                raise GPUError(f"the browser backend does not support {kind!r} commands")
        return words

    def submit(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> memoryview | None:
        token = self.submit_async(commands, read)
        return None if token is None else self.finish(token)

    def submit_async(self, commands: list[Command], read: tuple[Any, int, int] | None = None) -> Any:
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

    def timestamps(self, commands: list[Command]) -> list[float] | None:
        return None  # (timestamp queries are not wired through the helper)

    # -- browser specifics ----------------------------------------------------------------------
    def destroy(self) -> None:
        self._ctx.destroy()
