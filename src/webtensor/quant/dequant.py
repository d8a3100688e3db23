"""The numpy reference of each block type's values: ggml blocks (uint8 (B, block bytes)) -> their
integers and the scale and offset of each run of 16 values (`RUNS`), and the dequantized float32
(B, block values) made from them (`DEQUANTIZE`), one function per type (layouts in `quant.types`).

Every type's value is `scale (q - ZP) + min` with an integer q (`Runs.q` holds q - ZP) and one
(scale, min) per run of 16 consecutive values (min 0 for the types without one); this is the form
the WebGPU kernels read (`kernels/quant_dequant.wgsl`'s units) and the one the integer-dot product
reference (`quant.q8`) sums exactly.

`DEQUANTIZE` is bit-exact with `gguf.quants.dequantize` (tests/quant/test_quant_reference.py): the
same float32 operations in the same order. Most dequantized values are exact products, so the order
barely matters: d q (Q8_0, Q4_0, Q5_0; 11 x 8 significant bits), d sc and dmin mn (Q4_K; 11 x 6
bits) and (d sc) q (Q4_K; 17 x 4 bits) are all exact in float32, leaving one rounding in the d q + m
of Q4_1 and Q5_1 and Q4_K's (d sc) q - dmin mn, and one in Q6_K's (d sc) q (19 x 6 bits). The
WGSL `wvec` dequantizers compute the same exact products and the same single rounding (an FMA or
not gives the same bits when the product is exact), so tiles and embeddings see exactly these
weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from .types import IQ4_VALUES


class Runs(NamedTuple):
    """A type's blocks as integers and per-run factors: value = scale * q + min, run by run."""

    q: npt.NDArray[np.int8]  # (B, values): q - ZP, the integer each value scales
    scale: npt.NDArray[np.float32]  # (B, values / 16)
    min: npt.NDArray[np.float32] | None  # (B, values / 16), or None: no offset


def _f16(b: np.ndarray, off: int) -> npt.NDArray[np.float32]:
    """The float16 at byte `off` of each block, as float32 (B, 1)."""
    return np.ascontiguousarray(b[:, off : off + 2]).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> npt.NDArray[np.uint8]:
    """(B, 16) bytes -> (B, 32) values: the low nibbles, then the high nibbles (ggml's 32-block)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _per_run(v: np.ndarray, runs: int) -> npt.NDArray[np.float32]:
    """(B, 1) or (B, g) factors -> (B, runs): each repeated over the runs it covers."""
    return np.repeat(v.astype(np.float32), runs // v.shape[1], axis=1)


def _fifth_bits(b: np.ndarray, off: int) -> npt.NDArray[np.uint8]:
    """(B, 32) the fifth bit (0 / 16) of each value: bit j of the little-endian u32 at byte `off`."""
    qh = np.ascontiguousarray(b[:, off : off + 4]).view("<u4")  # (B, 1)
    return (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def q8_0(b: np.ndarray) -> Runs:
    return Runs(b[:, 2:34].view(np.int8), _per_run(_f16(b, 0), 2), None)


def q4_0(b: np.ndarray) -> Runs:
    return Runs(_nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8), _per_run(_f16(b, 0), 2), None)


def q4_1(b: np.ndarray) -> Runs:
    return Runs(_nibbles(b[:, 4:20]).astype(np.int8), _per_run(_f16(b, 0), 2), _per_run(_f16(b, 2), 2))


def q5_0(b: np.ndarray) -> Runs:
    q = (_nibbles(b[:, 6:22]) | _fifth_bits(b, 2)).astype(np.int8) - np.int8(16)
    return Runs(q, _per_run(_f16(b, 0), 2), None)


def q5_1(b: np.ndarray) -> Runs:
    q = (_nibbles(b[:, 8:24]) | _fifth_bits(b, 4)).astype(np.int8)
    return Runs(q, _per_run(_f16(b, 0), 2), _per_run(_f16(b, 2), 2))


def q4_k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs of Q4_K's 12 packed bytes (B, 12) -> two uint8 (B, 8):
    sub-block j < 4 has the low 6 bits of bytes j and j + 4; j >= 4 the nibbles of byte j + 4 with
    the top two bits of bytes j - 4 (scale) and j (min) above them."""
    lo, mid, top = sc12[:, 0:4], sc12[:, 4:8], sc12[:, 8:12]
    sc = np.concatenate([lo & 63, (top & 0x0F) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, mn


def q4_k(b: np.ndarray) -> Runs:
    n = b.shape[0]
    sc, mn = q4_k_scales(b[:, 4:16])
    d = _f16(b, 0) * sc.astype(np.float32)  # (B, 8): d sc of each 32-value sub-block
    dm = _f16(b, 2) * mn.astype(np.float32)
    qs = b[:, 16:144].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)  # chunk, nibble, byte
    q = (qs & 0x0F).reshape(n, 256).astype(np.int8)  # sub-block 2c + nibble
    return Runs(q, _per_run(d, 16), _per_run(-dm, 16))


def q6_k(b: np.ndarray) -> Runs:
    # value 128 h + 32 t + l (half h, quarter t, l < 32): low 4 bits from nibble t // 2 of
    # ql[64 h + 32 (t % 2) + l], high 2 bits from bits 2t of qh[32 h + l]; scale (value // 16)
    n = b.shape[0]
    d = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)  # (B, 16)
    ql4 = b[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql4 & 0x0F).reshape(n, 2, 4, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = (ql | ((qh & 0x03) << 4)).astype(np.int8) - np.int8(32)
    return Runs(q.reshape(n, 256), d, None)


def _crumbs(qs: np.ndarray) -> npt.NDArray[np.uint8]:
    """(B, 64) bytes -> (B, 256) 2-bit values: value 128 h + 32 t + l is bits 2t .. 2t + 1 of qs[32 h + l] (the
    low bits of Q2_K and Q3_K)."""
    n = qs.shape[0]
    out = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    return out.reshape(n, 256).astype(np.uint8, copy=False)


def _bits(mask: np.ndarray) -> npt.NDArray[np.uint8]:
    """(B, 32) bytes -> (B, 256) bits: value 32 j + l is bit j of mask[l] (Q5_K's fifth bits, Q3_K's third)."""
    n = mask.shape[0]
    out = (mask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    return out.reshape(n, 256).astype(np.uint8, copy=False)


def q5_k(b: np.ndarray) -> Runs:
    n = b.shape[0]
    sc, mn = q4_k_scales(b[:, 4:16])
    d = _f16(b, 0) * sc.astype(np.float32)  # (B, 8): d sc of each 32-value sub-block
    dm = _f16(b, 2) * mn.astype(np.float32)
    qs = b[:, 48:176].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)  # as Q4_K's
    q = ((qs & 0x0F).reshape(n, 256) | (_bits(b[:, 16:48]) << 4)).astype(np.int8)
    return Runs(q, _per_run(d, 16), _per_run(-dm, 16))


def q3_k_scales(sc12: np.ndarray) -> npt.NDArray[np.uint8]:
    """Q3_K's sixteen 6-bit scales from its 12 packed bytes (B, 12) -> uint8 (B, 16): scale s has the nibble s // 8
    of byte s % 8 under bits 2 (s // 4) .. of byte 8 + s % 4."""
    lo = np.concatenate([sc12[:, :8] & 0x0F, sc12[:, :8] >> 4], axis=1)
    hi = (sc12[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)) & np.uint8(3)
    out: npt.NDArray[np.uint8] = (lo | (hi.reshape(-1, 16) << np.uint8(4))).astype(np.uint8, copy=False)
    return out


def q3_k(b: np.ndarray) -> Runs:
    d = _f16(b, 108) * (q3_k_scales(b[:, 96:108]).astype(np.int8) - np.int8(32)).astype(np.float32)  # (B, 16)
    q = (_crumbs(b[:, 32:96]) | (_bits(b[:, :32]) << 2)).astype(np.int8) - np.int8(4)
    return Runs(q, d, None)


def q2_k(b: np.ndarray) -> Runs:
    sc = b[:, :16]
    d = _f16(b, 80) * (sc & 0x0F).astype(np.float32)  # (B, 16)
    dm = _f16(b, 82) * (sc >> 4).astype(np.float32)
    return Runs(_crumbs(b[:, 16:80]).astype(np.int8), d, -dm)


_IQ4 = np.array(IQ4_VALUES, np.int8)


def iq4_nl(b: np.ndarray) -> Runs:
    return Runs(_IQ4[_nibbles(b[:, 2:18])], _per_run(_f16(b, 0), 2), None)


def iq4_xs(b: np.ndarray) -> Runs:
    n = b.shape[0]
    sh = np.ascontiguousarray(b[:, 2:4]).view("<u2")  # (B, 1)
    hi = ((sh >> np.arange(0, 16, 2, dtype=np.uint16)) & 3).astype(np.uint8)  # (B, 8)
    lo = np.stack([b[:, 4:8] & 0x0F, b[:, 4:8] >> 4], axis=2).reshape(n, 8)
    d = _f16(b, 0) * ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)  # (B, 8)
    q = _IQ4[_nibbles(b[:, 8:136].reshape(n * 8, 16))].reshape(n, 256)
    return Runs(q, _per_run(d, 16), None)


RUNS: dict[str, Callable[[np.ndarray], Runs]] = {
    "Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q4_K": q4_k, "Q6_K": q6_k,
    "Q5_K": q5_k, "Q3_K": q3_k, "Q2_K": q2_k, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}


def dequantize_runs(r: Runs) -> npt.NDArray[np.float32]:
    """float32 (B, values): scale * q (+ min), one rounding each (the types' own order)."""
    n, v = r.q.shape
    out = (r.scale[:, :, None] * r.q.reshape(n, v // 16, 16).astype(np.float32))
    if r.min is not None:
        out = out + r.min[:, :, None]
    return out.reshape(n, v)


def _dequantizer(runs: Callable[[np.ndarray], Runs]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: dequantize_runs(runs(b))


DEQUANTIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {name: _dequantizer(f) for name, f in RUNS.items()}
