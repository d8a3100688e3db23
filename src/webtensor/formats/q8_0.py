"""llama.cpp's q8_0 weight format, and a numpy reference for matrix products with it.

A weight matrix is held as (N, K): one row per output, K the input (reduction) dimension, the
layout of ggml and of `nn.Linear` (HF GPT-2's Conv1D matrices are (K, N): quantize their
transpose). Each row is cut into blocks of 32 consecutive values along K. A block stores one
float16 scale ``d = max|x| / 127`` and 32 int8 values ``q = roundf(x / d)`` (``q = 0`` where the
block is all zeros); a value reads back as ``q * d``. On disk (GGUF) a block is 34 bytes: ``d``
(little-endian float16) then the 32 ``q``.

Rounding follows ggml's reference ``quantize_row_q8_0_ref`` bit for bit: the scale and its
reciprocal are computed in float32 from the unrounded ``max|x| / 127``, each ``x * (1/d)`` is
rounded half away from zero (C's ``roundf``), and only then is ``d`` stored as float16.

Padding rule: where K is not a multiple of 32, each row is padded with zeros up to the next
multiple (``padded_k``). Zeros do not change a block's ``max|x|``, quantize to 0 and add nothing
to a dot product, so the padded columns are invisible: `dequantize` drops them and `q8_matmul`
never reads them against real inputs. GGUF itself only holds q8_0 tensors whose K is a multiple of
32 (all GPT-2 widths are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, CheckpointError

BLOCK = 32  # values per block (ggml's QK8_0)
BLOCK_BYTES = 2 + BLOCK  # one float16 scale + 32 int8 values
_F16_MAX = float(np.finfo(np.float16).max)
_MATMUL_CHUNK_BYTES = 1 << 20  # float32 scratch for one slab of dequantized rows in q8_matmul: cache-sized
# (a 1 MiB slab stays in a core's L2 between the cast and the product; 4 MiB slabs ran ~10x slower here)


def padded(k: int) -> int:
    """K rounded up to a whole number of blocks."""
    return -(-k // BLOCK) * BLOCK


@dataclass(frozen=True, eq=False)
class Q8Weight:
    """A q8_0 matrix of logical shape ``shape`` = (N, K).

    qs: int8 (N, padded_k), C-contiguous; d: float16 (N, padded_k // 32), the scale of each block.
    Columns K.. of `qs` are the zero padding (see the module docstring)."""

    qs: np.ndarray
    d: np.ndarray
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        n, k = self.shape
        kp = padded(k)
        if self.qs.dtype != np.int8 or self.qs.shape != (n, kp):
            raise ArgumentError(f"q8_0 values must be int8 of shape {(n, kp)}, got {self.qs.dtype} {self.qs.shape}")
        if self.d.dtype != np.float16 or self.d.shape != (n, kp // BLOCK):
            raise ArgumentError(f"q8_0 scales must be float16 of shape {(n, kp // BLOCK)}, got "
                                f"{self.d.dtype} {self.d.shape}")

    @property
    def padded_k(self) -> int:
        return self.qs.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held: the int8 values and the float16 scales (34 bytes per block, as on disk)."""
        return self.qs.nbytes + self.d.nbytes

    def dequantize(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """float32 (n, K): every row, or only `rows` (a slice or an index array, e.g. token ids
        for an embedding lookup)."""
        qs, d = (self.qs, self.d) if rows is None else (self.qs[rows], self.d[rows])
        n = qs.shape[0]
        blocks = qs.reshape(n, -1, BLOCK).astype(np.float32) * d.astype(np.float32)[:, :, None]
        return blocks.reshape(n, self.padded_k)[:, : self.shape[1]]

    def to_blocks(self) -> np.ndarray:
        """The ggml byte layout: uint8 (N, padded_k // 32 * 34), per block the float16 scale
        (little-endian) then the 32 int8 values."""
        n, nb = self.d.shape
        out = np.empty((n, nb, BLOCK_BYTES), np.uint8)
        out[:, :, :2] = self.d.astype("<f2").view(np.uint8).reshape(n, nb, 2)
        out[:, :, 2:] = self.qs.view(np.uint8).reshape(n, nb, BLOCK)
        return out.reshape(n, nb * BLOCK_BYTES)

    @classmethod
    def from_blocks(cls, raw: np.ndarray | bytes | memoryview, shape: tuple[int, int]) -> Q8Weight:
        """A Q8Weight from ggml's bytes for a matrix of logical shape (N, K), K a multiple of 32
        (GGUF's rule). Raises CheckpointError when the byte count does not fit the shape."""
        n, k = (int(s) for s in shape)
        if k % BLOCK:
            raise CheckpointError(f"a q8_0 tensor needs rows of a multiple of {BLOCK} values, got shape {(n, k)}")
        buf = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.reshape(-1).view(np.uint8)
        nb = k // BLOCK
        if buf.size != n * nb * BLOCK_BYTES:
            raise CheckpointError(f"a q8_0 tensor of shape {(n, k)} needs {n * nb * BLOCK_BYTES} bytes, "
                                  f"got {buf.size}")
        blocks = buf.reshape(n, nb, BLOCK_BYTES)
        d = np.ascontiguousarray(blocks[:, :, :2]).view("<f2").reshape(n, nb).astype(np.float16)
        qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k)
        return cls(qs, d, (n, k))


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf, exactly: floor(|v|) plus one where the fraction is >= 0.5 (computing |v| + 0.5
    instead would round 0.49999997 up in float32)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), v)


def quantize(w: np.ndarray) -> Q8Weight:
    """q8_0 of a float matrix (N, K), K along the last axis (see the module docstring).

    Raises ArgumentError for a non-2-D or non-finite input, or values too large for a float16
    scale (|x| > 127 * 65504)."""
    w = np.asarray(w)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
        raise ArgumentError(f"q8_0 quantizes a 2-D float matrix, got {w.dtype} of shape {w.shape}")
    n, k = w.shape
    kp = padded(k)
    x = np.zeros((n, kp), np.float32)
    x[:, :k] = w
    if not np.isfinite(x).all():
        raise ArgumentError(f"cannot quantize to q8_0: the matrix {w.shape} holds {int((~np.isfinite(x)).sum())} "
                            "non-finite values")
    blocks = x.reshape(n, kp // BLOCK, BLOCK)
    d = np.abs(blocks).max(axis=2) / np.float32(127)
    if d.size and float(d.max()) > _F16_MAX:
        raise ArgumentError(f"cannot quantize to q8_0: max |x| = {float(d.max()) * 127:g} overflows the float16 scale")
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = _round_half_away(blocks * inv[:, :, None])
    return Q8Weight(q.astype(np.int8).reshape(n, kp), d.astype(np.float16), (n, k))


def dequantize(w: Q8Weight) -> np.ndarray:
    """float32 (N, K)."""
    return w.dequantize()


def q8_matmul(x: np.ndarray, w: Q8Weight) -> np.ndarray:
    """``x @ dequantize(w).T`` in float32: x (..., K) -> (..., N), the reference for the int8
    kernels (a linear layer, or the tied LM head with w = q8_0 of wte).

    Rows of `w` are dequantized a slab at a time (about 1 MiB of float32), so the full float matrix
    never exists at once."""
    x = np.asarray(x, np.float32)
    n, k = w.shape
    if x.ndim < 1 or x.shape[-1] != k:
        raise ArgumentError(f"q8_matmul: x has shape {x.shape}, expected (..., {k}) for a weight of shape {w.shape}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    out = np.empty((x2.shape[0], n), np.float32)
    step = max(1, _MATMUL_CHUNK_BYTES // (4 * w.padded_k))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        out[:, r0:r1] = x2 @ w.dequantize(slice(r0, r1)).T
    return out.reshape(*lead, n)
