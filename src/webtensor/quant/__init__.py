"""Quantized weights in ggml's block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS): what ops.linear and ops.embedding take in place of a float weight.

- `types`: the block types as numpy-free facts, the stored-size checks, and `Quantized`, the base
  class of every quantized weight (what the ops test for, without numpy);
- `weight`: `QuantWeight` (ggml's blocks on the host), `quant_matmul` (the numpy reference product),
  `random_weight` (valid random blocks of any type, for tests and benchmarks);
- `dequant`: each type's integers and per-run scales (`RUNS`), and the numpy dequantizers, bit-exact
  with the `gguf` package's;
- `quantizer`: `quantize`, float -> Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1, bit-exact with ggml's reference
  quantizers;
- `q8`: int8 activations and the reference of the integer-dot product the GPUs' GEMV computes.

The WebGPU side (GPU layout, numpy-free upload of a GGUF tensor's bytes, kernels) is
`backends.wgpu.quant_ops`. Importing this package needs no numpy; the names that do
(`QuantWeight`, `quantize`, `quant_matmul`, `dequantized`, `padded`, `random_weight`) load their module on
first use.
"""

from __future__ import annotations

from typing import Any

from .types import (
    HALVES,
    IQ4_VALUES,
    QUANTIZABLE,
    TYPES,
    BlockType,
    Quantized,
    block_type,
    check_blocks,
    check_shape,
    row_bytes,
)

_LAZY = {"QuantWeight": "weight", "quant_matmul": "weight", "dequantized": "weight", "padded": "weight",
         "random_weight": "weight", "quantize": "quantizer"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


__all__ = ["TYPES", "QUANTIZABLE", "HALVES", "IQ4_VALUES", "BlockType", "Quantized", "block_type", "check_blocks",
           "check_shape", "row_bytes", *_LAZY]
