"""The dtypes a tensor can hold, and how they map to numpy, WGSL and safetensors.

Kept free of numpy at import time so the browser (Pyodide without numpy) can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DTypeError


@dataclass(frozen=True)
class DType:
    name: str  # "float32", "float16", "int32"
    itemsize: int
    wgsl: str  # WGSL scalar type
    struct_code: str  # array.array / struct typecode ("e" is half precision)

    def __repr__(self) -> str:
        return f"webtensor.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.name.startswith("float")


float32 = DType("float32", 4, "f32", "f")
float16 = DType("float16", 2, "f16", "e")
int32 = DType("int32", 4, "i32", "i")

ALL = {d.name: d for d in (float32, float16, int32)}


def as_dtype(x: object) -> DType:
    """Accept a DType, a name ("float16"), or a numpy dtype / type; raise DTypeError otherwise."""
    if isinstance(x, DType):
        return x
    name = x if isinstance(x, str) else getattr(getattr(x, "dtype", x), "name", None)
    if name is None:
        name = getattr(x, "__name__", str(x))
    name = {"half": "float16", "float": "float32", "int": "int32", "f32": "float32", "f16": "float16"}.get(
        name, name
    )
    if name not in ALL:
        raise DTypeError(f"unsupported dtype {x!r}: webtensor tensors hold {', '.join(ALL)}")
    return ALL[name]
