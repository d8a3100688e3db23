"""Self-tests and micro-benchmarks that run inside the browser (and natively, for checking them).

`run_cases` runs webtensor ops on cases described in JSON-able dicts, with tensors as base64 of
their little-endian bytes, so a test can build inputs and expected values natively with numpy and
compare what the browser computed:

    {"name": "matmul", "op": "matmul", "inputs": [{"shape": [4, 8], "dtype": "float32", "b64": ...}, ...],
     "args": [{"input": 0}, {"input": 1}], "kwargs": {}}

`bench_dispatch` measures what one dispatch costs: many in one submit against one per submit.

`check_kernels` hands the device's own shader compiler every kernel variant of a list (tests/data/
kernel_variants.txt: what the runtime builds) at once and reports what it refuses: a browser's compiler (Tint)
refuses WGSL that naga accepts. Standard library only (no numpy).
"""

from __future__ import annotations

import array
import base64
import statistics
import time
from typing import Any

from .. import ops
from ..device import Device
from ..errors import GPUError
from ..tensor import Tensor, from_buffer


def _tensor_from_spec(spec: dict[str, Any], device: Device) -> Tensor:
    return from_buffer(base64.b64decode(spec["b64"]), spec["shape"], spec["dtype"], device)


def run_cases(device: Device, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run each case's op; results carry shape, dtype and base64 bytes, or the error's text."""
    results = []
    for case in cases:
        name = case.get("name", case["op"])
        try:
            inputs = [_tensor_from_spec(s, device) for s in case.get("inputs", [])]
            args = [inputs[a["input"]] if isinstance(a, dict) and "input" in a else a
                    for a in case.get("args", [{"input": i} for i in range(len(inputs))])]
            kwargs = {k: inputs[v["input"]] if isinstance(v, dict) and "input" in v else v
                      for k, v in case.get("kwargs", {}).items()}
            out = getattr(ops, case["op"])(*args, **kwargs)
            results.append(dict(name=name, shape=list(out.shape), dtype=out.dtype.name,
                                b64=base64.b64encode(out.tobytes()).decode("ascii")))
        except Exception as e:  # reported per case, so one failure does not hide the others
            results.append(dict(name=name, error=f"{type(e).__name__}: {e}"))
    return results


def _best(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) if reps < 3 else statistics.median(times)


def bench_dispatch(device: Device, n: int = 200, size: int = 1024, reps: int = 5) -> dict[str, Any]:
    """Cost of one small dispatch (an elementwise add of `size` floats), in microseconds:

    - `op_batched_us`: `n` webtensor adds inside one dispatch scope (one submit), then a readback
    - `op_unbatched_us`: `n` adds outside a scope (one submit each), then a readback
    - `raw_batched_us` / `raw_unbatched_us`: the same prepared dispatch handed straight to the GPU
      API, `n` in one submit / one per submit (no webtensor op overhead: FFI, encoding, GPU)
    - `encode_us`: Python-side encoding of one command (the flat word list)
    - `readback_us`: an empty submit plus a 4-byte readback (the floor of any synchronising step)
    All per dispatch (divided by `n`) except readback."""
    ctx, api = device.ctx, device.ctx.api
    a = from_buffer(array.array("f", [float(i % 7) for i in range(size)]), (size,), "float32", device)
    b = from_buffer(array.array("f", [1.0] * size), (size,), "float32", device)
    probe = ops.add(a, b)
    probe.tobytes()  # compiled, bind group cached

    def op_batched() -> None:
        with device.dispatch_scope():
            for _ in range(n):
                out = ops.add(a, b)
        out.tobytes()

    def op_unbatched() -> None:
        for _ in range(n):
            out = ops.add(a, b)
        out.tobytes()

    keep = ops.add(a, b)  # hold its output buffer, so the captured command stays valid
    with device.dispatch_scope():
        cmd_out = ops.add(a, b)
        cmd = ctx._pending[-1]
    read = (keep._storage.buffer.handle, 0, 4)

    def raw_batched() -> None:
        api.submit([cmd] * n, read)

    def raw_unbatched() -> None:
        for _ in range(n - 1):
            api.submit([cmd])
        api.submit([cmd], read)

    def readback() -> None:
        api.submit([], read)

    encode = getattr(api, "encode", None)
    res = dict(
        n=n, size=size, adapter=ctx.info.name, backend=ctx.info.backend,
        op_batched_us=_best(op_batched, reps) / n * 1e6,
        op_unbatched_us=_best(op_unbatched, reps) / n * 1e6,
        raw_batched_us=_best(raw_batched, reps) / n * 1e6,
        raw_unbatched_us=_best(raw_unbatched, reps) / n * 1e6,
        readback_us=_best(readback, max(reps, 10)) * 1e6,
        encode_us=(_best(lambda: [encode([cmd] * n) for _ in range(20)], reps) / n / 20 * 1e6
                   if encode else None),
    )
    del cmd_out
    return res



def variant_line(file: str, defines: dict[str, str]) -> str:
    """A kernel variant as one line of a variant list: `gemv_quant LANES=32u Q4_K=true ...` (defines sorted)."""
    return " ".join([file, *(f"{k}={v}" for k, v in sorted(defines.items()))])


def parse_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    """The variants of a list of `variant_line`s (blank lines and `#` comments skipped)."""
    out = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            out.append((words[0], dict(w.split("=", 1) for w in words[1:])))
    return out


def check_kernels(device: Device, variants: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
    """Every kernel variant of `variants` ((kernel file, its defines)) made as `device` makes it
    (`WgpuContext.wgsl`: the defines' header, the API's enable directives, the declaration checked) and compiled
    to a shader module by the device's compiler, all in one call: {compiled: how many, errors: {variant line: the
    compiler's (or the declaration check's) message}, skipped: {variant line: the features it needs that the
    device lacks}, adapter, features}."""
    ctx = device.ctx
    texts: list[tuple[str, str]] = []
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for file, defines in variants:
        name = variant_line(file, defines)
        try:
            t = ctx.wgsl(file, defines)
        except GPUError as e:  # (its declaration disagrees with the shader)
            errors[name] = str(e)
            continue
        if t.missing:
            skipped[name] = ", ".join(sorted(t.missing))
        else:
            texts.append((name, t.code))
    for (name, _), err in zip(texts, ctx.api.check_shaders(texts), strict=True):
        if err:
            errors[name] = err
    return dict(compiled=len(texts), errors=errors, skipped=skipped, adapter=ctx.info.name,
                features=sorted(ctx.api.features))
