"""llama.cpp's q8_0 under its old names, for GPT-2's int8 path (models/gpt2 imports these): q8_0
is now the Q8_0 case of `webtensor.quant` (same bytes, same rounding, bit for bit ggml's
reference). New code uses `webtensor.quant` directly; this module goes when models/gpt2 does.
"""

from __future__ import annotations

import numpy as np

from ..quant.quantizer import quantize as _quantize
from ..quant.weight import QuantWeight, quant_matmul
from ..quant.weight import padded as _padded

Q8Weight = QuantWeight  # any quantized weight; the int8 path makes only Q8_0 ones
BLOCK = 32  # values per block (ggml's QK8_0)
q8_matmul = quant_matmul


def padded(k: int) -> int:
    """K rounded up to a whole number of 32-blocks."""
    return _padded(k, "Q8_0")


def quantize(w: np.ndarray) -> QuantWeight:
    """q8_0 of a float matrix (N, K): `quant.quantize(w, "Q8_0")`."""
    return _quantize(w, "Q8_0")


def dequantize(w: QuantWeight) -> np.ndarray:
    """float32 (N, K)."""
    return w.dequantize()
