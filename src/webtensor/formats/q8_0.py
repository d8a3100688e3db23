"""llama.cpp's q8_0 under its old names, for the callers that still use them (models/loader.py,
models/gpt2): q8_0 is now the Q8_0 case of `webtensor.quant` (same bytes, same rounding, bit for
bit ggml's reference). New code uses `webtensor.quant` directly; this module goes when its last
caller does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..quant.quantizer import quantize as _quantize
from ..quant.weight import QuantWeight, quant_matmul
from ..quant.weight import padded as _padded

BLOCK = 32  # values per block (ggml's QK8_0)
q8_matmul = quant_matmul


class Q8Weight(QuantWeight):
    """A QuantWeight of type Q8_0, made by this module's old-style calls."""

    __slots__ = ()

    @classmethod
    def from_blocks(cls, raw: Any, shape: tuple[int, ...]) -> QuantWeight:  # type: ignore[override]
        """The Q8_0 matrix (N, K) of ggml's bytes: `QuantWeight.from_blocks("Q8_0", raw, shape)`."""
        w = QuantWeight.from_blocks("Q8_0", raw, shape)
        return cls("Q8_0", w.blocks, w.shape)


def padded(k: int) -> int:
    """K rounded up to a whole number of 32-blocks."""
    return _padded(k, "Q8_0")


def quantize(w: np.ndarray) -> QuantWeight:
    """q8_0 of a float matrix (N, K): `quant.quantize(w, "Q8_0")`."""
    q = _quantize(w, "Q8_0")
    return Q8Weight("Q8_0", q.blocks, q.shape)


def dequantize(w: QuantWeight) -> np.ndarray:
    """float32 (N, K)."""
    return w.dequantize()
