"""The workgroup memory a kernel's WGSL declares, in bytes: what `WgpuContext.kernel` checks against the device's
`max-compute-workgroup-storage-size` before it builds a pipeline.

Neither wgpu-native (0.32) nor every driver checks this: a shader over the limit reached NVIDIA's Vulkan driver and
hung the GPU (2026-12-05, the prompt kernel attention_tiled_cache at D = 64 declared 49,416 bytes where the H200
allows 49,152), where lavapipe, whose limit is 32,768, never chose that variant. A planner that picks a tile by the
limit must count every workgroup variable of the variant it builds; this check turns a miscount into an error that
names the kernel instead of a hang.

The sum is taken over the `var<workgroup>` declarations the entry point reaches (named in a function its calls
reach: common.wgsl's `wg_red`, for one, counts only where `wg_reduce` is called, as drivers count it), each rounded
up to 16 bytes (the most any backend pads a variable to); array counts are WGSL constant expressions over the
shader's module-scope `const`s (integer arithmetic, `select`, `min`, `max`), types are scalars, vectors,
`atomic<T>` and arrays of them, through `alias`es.
"""

from __future__ import annotations

import re
from typing import Any

_SCALAR_BYTES = {"f32": 4, "u32": 4, "i32": 4, "f16": 2, "bool": 4}
_ALIGN = 16


def workgroup_bytes(code: str) -> int:
    """Bytes of workgroup memory `code` (a whole WGSL module) uses; ValueError naming a declaration this reader
    cannot size."""
    text = re.sub(r"//[^\n]*", "", code)
    aliases = dict(re.findall(r"^\s*alias\s+(\w+)\s*=\s*([^;]+);", text, flags=re.M))
    consts: dict[str, Any] = {}
    for name, expr in re.findall(r"^const\s+(\w+)\s*(?::\s*\w+\s*)?=\s*([^;]+);", text, flags=re.M):
        try:
            consts[name] = _evaluate(expr, consts)
        except (ValueError, SyntaxError, NameError, TypeError, ZeroDivisionError):
            pass  # (a float or another constant no array count uses)
    reached = _reached_code(text)
    total = 0
    for m in re.finditer(r"var<workgroup>\s+(\w+)\s*:\s*([^;]+);", text):
        name, typ = m.group(1), m.group(2)
        if not re.search(rf"\b{name}\b", reached):
            continue  # declared, never reached from the entry point: not in the pipeline
        size = _type_bytes(typ.strip(), aliases, consts)
        total += -(-size // _ALIGN) * _ALIGN
    return total


def _reached_code(text: str) -> str:
    """The bodies of the functions the entry point (the `@compute` one) calls, directly or through others, and its
    own."""
    bodies: dict[str, str] = {}
    entry = None
    for m in re.finditer(r"\bfn\s+(\w+)\s*\(", text):
        start = text.index("{", m.end())
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        bodies[m.group(1)] = text[start:i + 1]
        if "@compute" in text[max(0, m.start() - 200):m.start()].split(";")[-1].split("}")[-1]:
            entry = m.group(1)
    if entry is None:
        raise ValueError("no @compute entry point")
    seen, todo = {entry}, [entry]
    while todo:
        for callee in re.findall(r"\b(\w+)\s*\(", bodies[todo.pop()]):
            if callee in bodies and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return "\n".join(bodies[f] for f in seen)


def _type_bytes(typ: str, aliases: dict[str, str], consts: dict[str, Any]) -> int:
    typ = typ.strip()
    if typ in aliases:
        return _type_bytes(aliases[typ], aliases, consts)
    if typ in _SCALAR_BYTES:
        return _SCALAR_BYTES[typ]
    m = re.fullmatch(r"atomic<\s*(\w+)\s*>", typ)
    if m:
        return 4
    m = re.fullmatch(r"vec([234])<\s*(\w+)\s*>", typ)
    if m:
        n, lane = int(m.group(1)), _type_bytes(m.group(2), aliases, consts)
        return (4 if n == 3 else n) * lane
    m = re.fullmatch(r"array<(.+)>", typ)
    if m:
        elem, count = _split_array(m.group(1))
        esize = _type_bytes(elem, aliases, consts)
        stride = -(-esize // _alignment(elem, aliases)) * _alignment(elem, aliases)
        return stride * int(_evaluate(count, consts))
    raise ValueError(f"workgroup variable of type {typ!r}: not a type this reader sizes")


def _alignment(typ: str, aliases: dict[str, str]) -> int:
    typ = aliases.get(typ.strip(), typ.strip())
    m = re.fullmatch(r"vec([234])<\s*(\w+)\s*>", typ)
    if m:
        elem = 2 if aliases.get(m.group(2), m.group(2)) == "f16" else 4
        return (4 if m.group(1) == "3" else int(m.group(1))) * elem
    return 2 if typ == "f16" else 4


def _split_array(inner: str) -> tuple[str, str]:
    """array<ELEM, COUNT>'s ELEM and COUNT (ELEM may hold commas inside <...>)."""
    depth = 0
    for i, c in enumerate(inner):
        depth += c == "<"
        depth -= c == ">"
        if c == "," and depth == 0:
            return inner[:i], inner[i + 1:]
    raise ValueError(f"array<{inner}> without an element count (a runtime-sized array in workgroup memory)")


def _evaluate(expr: str, consts: dict[str, Any]) -> Any:
    """A WGSL constant expression of integers and booleans (u / i suffixes, hex, / as integer division, select,
    min, max, u32 / i32 casts) over `consts`."""
    py = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[ui]\b", r"\1", expr)
    if re.search(r"\d\.\d|\d[fh]\b|\d[eE][+-]?\d", py):
        raise ValueError(f"{expr!r}: not an integer expression")
    py = py.replace("&&", " and ").replace("||", " or ").replace("/", "//").replace("!=", "__NE__")
    py = py.replace("!", " not ").replace("__NE__", "!=")
    names = {"select": lambda f, t, c: t if c else f, "min": min, "max": max, "u32": int, "i32": int,
             "true": True, "false": False, **consts}
    return eval(py, {"__builtins__": {}}, names)  # noqa: S307 - a constant expression of the kernel's own source
