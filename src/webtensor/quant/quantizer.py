"""Quantizers for the 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): float rows -> ggml blocks, bit for
bit ggml's reference quantizers (`quantize_row_*_ref`, which the `gguf` package reproduces;
tests/quant/test_quant_reference.py checks against it). The K-quants (Q4_K, Q6_K) are only read:
llama.cpp's quantizer searches scales iteratively, and webtensor takes such files as they are.

Per block of 32 float32 values x, everything in float32, the scale stored as float16 only at the end:

- Q8_0: d = max|x| / 127, q = roundf(x / d) (C's roundf: half away from zero), x ~ d q.
- Q4_0: d = x* / -8 where x* is the first value of largest |x| (keeping its sign), q =
  min(15, trunc(x / d + 8.5)), x ~ d (q - 8).
- Q4_1: d = (max x - min x) / 15, m = min x, q = min(15, trunc((x - m) / d + 0.5)), x ~ d q + m.
- Q5_0: as Q4_0 with -16, 16.5 and 31 (x ~ d (q - 16)); Q5_1: as Q4_1 with 31 (x ~ d q + m); the
  fifth bits of the 32 values go to a little-endian u32 (bit j: value j), the low four as Q4's.

with 1 / d taken as 0 for an all-zero (Q4_1: constant) block. Rows whose length is not a multiple
of 32 are padded with zeros to the next multiple: the padding is quantized with its block and
dropped again by `QuantWeight.dequantize` (Q8_0 and Q4_0 give it exactly 0; Q4_1 may not, which is
why it is never read against real inputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ArgumentError
from .types import QUANTIZABLE, block_type
from .weight import QuantWeight, padded


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf, exactly: floor(|v|) plus one where the fraction is >= 0.5 (computing |v| + 0.5
    instead would round 0.49999997 up in float32)."""
    a = np.abs(v)
    whole = np.floor(a)
    out: npt.NDArray[np.floating[Any]] = np.copysign(whole + (a - whole >= 0.5), v)  # (numpy types ufuncs Any)
    return out


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _half(v: np.ndarray, what: str, qtype: str) -> np.ndarray:
    """float32 -> little-endian float16 bytes (B, 2); ArgumentError where the value overflows."""
    with np.errstate(over="ignore"):
        h = v.astype("<f2")
    if not np.isfinite(h).all():
        bad = float(v[~np.isfinite(h)].reshape(-1)[0])
        raise ArgumentError(f"cannot quantize to {qtype}: a block's {what} {bad:g} overflows float16")
    return h.reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(B, 32) values 0..15 -> (B, 16) bytes: value j in the low nibble of byte j, j + 16 in its high."""
    b = q.astype(np.uint8)
    return b[:, :16] | (b[:, 16:] << np.uint8(4))


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """(B, 32) values 0..31 -> (B, 4) bytes: the little-endian u32 whose bit j is value j's bit 4."""
    return np.packbits((q.astype(np.uint8) >> 4) & 1, axis=1, bitorder="little")


def _q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1) / np.float32(127)
    q = _round_half_away(x * _inverse(d)[:, None])
    return np.concatenate([_half(d, "scale", "Q8_0"), q.astype(np.int8).view(np.uint8)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]  # first of largest |x|
    d = peak / np.float32(-8)
    q = np.minimum(np.trunc(x * _inverse(d)[:, None] + np.float32(8.5)), 15)
    return np.concatenate([_half(d, "scale", "Q4_0"), _pack_nibbles(q)], axis=1)


def _q4_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / np.float32(15)
    q = np.minimum(np.trunc((x - lo[:, None]) * _inverse(d)[:, None] + np.float32(0.5)), 15)
    return np.concatenate([_half(d, "scale", "Q4_1"), _half(lo, "minimum", "Q4_1"), _pack_nibbles(q)], axis=1)


def _q5_0(x: np.ndarray) -> np.ndarray:
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = peak / np.float32(-16)
    q = np.minimum(np.trunc(x * _inverse(d)[:, None] + np.float32(16.5)), 31)
    return np.concatenate([_half(d, "scale", "Q5_0"), _fifth_bits(q), _pack_nibbles(q % 16)], axis=1)


def _q5_1(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = (hi - lo) / np.float32(31)
    q = np.minimum(np.trunc((x - lo[:, None]) * _inverse(d)[:, None] + np.float32(0.5)), 31)
    return np.concatenate([_half(d, "scale", "Q5_1"), _half(lo, "minimum", "Q5_1"), _fifth_bits(q),
                           _pack_nibbles(q % 16)], axis=1)


_QUANTIZERS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1}


def quantize(w: np.ndarray, qtype: str = "Q8_0") -> QuantWeight:
    """`w` (N, K), a float matrix with K along the last axis (nn.Linear's (out, in); quantize HF
    Conv1D's (in, out) transposed), as a QuantWeight of ggml type `qtype` ("Q8_0", "Q4_0",
    "Q4_1", "Q5_0" or "Q5_1"; module docstring).

    ArgumentError for another type, a non-2-D or non-float input, non-finite values, or a block
    whose scale (or Q4_1 minimum) overflows float16."""
    if qtype not in QUANTIZABLE:
        block_type(qtype, ArgumentError)  # an unknown type: its own message
        raise ArgumentError(f"webtensor quantizes to {', '.join(QUANTIZABLE)}; {qtype} needs llama.cpp's "
                            "quantizer (llama-quantize)")
    w = np.asarray(w)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
        raise ArgumentError(f"{qtype} quantizes a 2-D float matrix, got {w.dtype} of shape {w.shape}")
    n, k = w.shape
    kp = padded(k, qtype)
    x = np.zeros((n, kp), np.float32)
    x[:, :k] = w
    if not np.isfinite(x).all():
        raise ArgumentError(f"cannot quantize to {qtype}: the matrix {w.shape} holds {int((~np.isfinite(x)).sum())} "
                            "non-finite values")
    t = block_type(qtype)
    blocks = _QUANTIZERS[qtype](x.reshape(-1, t.values)) if x.size else np.zeros((0, t.nbytes), np.uint8)
    return QuantWeight(qtype, blocks.reshape(n, kp // t.values * t.nbytes), (n, k))
