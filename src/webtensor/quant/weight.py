"""`QuantWeight`: a quantized matrix held in ggml's blocks on the host (numpy), its dequantization
and `quant_matmul`, the numpy reference of a product with it.

A weight is (N, K), the layout of ggml and of `nn.Linear`: one row per output (or per token of an
embedding table), K the reduction dimension, each row cut into blocks along K. `blocks` is uint8
(N, padded_k / QK * block bytes): every row's blocks as stored in a GGUF file, row after row, so a
GGUF tensor becomes a QuantWeight without a copy of its meaning. K itself is a multiple of the block
for anything read from a file; `quantize` also takes other K and pads each row with zeros to whole
blocks (`padded_k`), which `dequantize` drops again.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ArgumentError
from .dequant import DEQUANTIZE
from .types import HALVES, Quantized, block_type, check_blocks, row_bytes


def padded(k: int, qtype: str = "Q8_0") -> int:
    """k rounded up to whole blocks of `qtype`."""
    q = block_type(qtype, ArgumentError).values
    return -(-k // q) * q


class QuantWeight(Quantized):
    """A matrix of logical shape `shape` = (N, K) in ggml type `qtype` ("Q8_0", "Q4_0", "Q4_1",
    "Q4_K", "Q6_K"); `blocks` uint8 (N, padded_k / QK * block bytes), C-contiguous (module
    docstring). Immutable by convention: the device copies and the CPU reference's float32 cache
    are keyed by the object."""

    __slots__ = ("qtype", "shape", "blocks", "__weakref__")

    def __init__(self, qtype: str, blocks: np.ndarray, shape: tuple[int, int]):
        t = block_type(qtype, ArgumentError)
        n, k = (int(s) for s in shape)
        want = (n, padded(k, qtype) // t.values * t.nbytes)
        if not isinstance(blocks, np.ndarray) or blocks.dtype != np.uint8 or blocks.shape != want:
            got = f"{blocks.dtype} {blocks.shape}" if isinstance(blocks, np.ndarray) else type(blocks).__name__
            raise ArgumentError(f"a {qtype} weight of shape {(n, k)} holds uint8 blocks of shape {want}, got {got}")
        self.qtype, self.shape, self.blocks = qtype, (n, k), np.ascontiguousarray(blocks)

    @classmethod
    def from_blocks(cls, qtype: str, raw: Any, shape: tuple[int, ...]) -> QuantWeight:
        """The weight of logical shape (N, K) from ggml's bytes as stored (a GGUF tensor's data: a
        buffer, or a numpy array of any dtype over those bytes), not copied where it is already
        contiguous. CheckpointError for an unknown type, a shape that is not (N, K) with K a
        multiple of the block, or a byte count that does not fit the shape."""
        buf = raw.reshape(-1).view(np.uint8) if isinstance(raw, np.ndarray) else np.frombuffer(raw, np.uint8)
        n, k = check_blocks(qtype, tuple(shape), buf.size)
        return cls(qtype, buf.reshape(n, row_bytes(qtype, k)), (n, k))

    @property
    def padded_k(self) -> int:
        return padded(self.shape[1], self.qtype)

    @property
    def nbytes(self) -> int:
        """Bytes held: the blocks, as on disk."""
        return self.blocks.nbytes

    def to_blocks(self) -> np.ndarray:
        """ggml's bytes: uint8 (N, bytes per row), each row its blocks as stored."""
        return self.blocks

    def dequantize(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """float32 (n, K): every row, or only `rows` (a slice or an index array, e.g. the token ids
        of an embedding lookup), exactly as ggml (and `gguf.quants.dequantize`) reads them."""
        b = self.blocks if rows is None else self.blocks[rows]
        n = b.shape[0]
        t = self.block
        vals = DEQUANTIZE[self.qtype](b.reshape(-1, t.nbytes)) if b.size else np.zeros((0, t.values), np.float32)
        return vals.reshape(n, self.padded_k)[:, : self.shape[1]]

    def __repr__(self) -> str:
        return f"QuantWeight({self.qtype}, shape={self.shape}, {self.nbytes:,} bytes)"


_F32: weakref.WeakKeyDictionary[QuantWeight, npt.NDArray[np.float32]] = weakref.WeakKeyDictionary()
_F32_LOCK = threading.Lock()


def dequantized(w: QuantWeight) -> npt.NDArray[np.float32]:
    """`w.dequantize()` transposed, (K, N) contiguous: computed once per weight and kept while the weight lives
    (the CPU reference's products: 4 bytes a value, so a model's quantized matrices cost float32 memory there).
    (K, N) is the layout the CPU device keeps float matrices in: numpy's stacked products of one-row matrices
    (`runtime.batch.StepBatch.invariant`) take BLAS's matrix-vector path on it, where a transposed view is ~10x
    slower."""
    with _F32_LOCK:
        f = _F32.get(w)
    if f is None:
        f = np.ascontiguousarray(w.dequantize().T)
        f.setflags(write=False)
        with _F32_LOCK:
            _F32[w] = f
    return f


def quant_matmul(x: np.ndarray, w: QuantWeight) -> np.ndarray:
    """``x @ w.dequantize().T`` in float32: x (..., K) -> (..., N), the reference for the quantized
    kernels (a linear layer, or a tied LM head with w the embedding table)."""
    x32 = np.asarray(x, np.float32)
    n, k = w.shape
    if x32.ndim < 1 or x32.shape[-1] != k:
        raise ArgumentError(f"quant_matmul: x has shape {x32.shape}, expected (..., {k}) for a {w.qtype} weight of "
                            f"shape {w.shape}")
    return x32 @ dequantized(w)


# random_weight's log2_scale per type for weights of a model's size (values of about 0.03: the float16 scales times
# the typical random quant and sub-block scale), for random GGUF files of published shapes
MODEL_LOG2_SCALE = {"Q8_0": -12, "Q4_0": -8, "Q4_1": -9, "Q5_0": -9, "Q5_1": -10, "Q2_K": -9, "Q3_K": -10,
                    "Q4_K": -13, "Q5_K": -14, "Q6_K": -14, "IQ4_NL": -11, "IQ4_XS": -14}


def random_weight(qtype: str, shape: tuple[int, int], rng: np.random.Generator, log2_scale: int = -7) -> QuantWeight:
    """A weight of `shape` = (N, K) (K whole blocks) in `qtype` whose blocks are random bytes but for their float16
    numbers (d, m, dmin: `types.HALVES`), each +-2^log2_scale times a random mantissa in [1, 1.5): valid blocks of
    any type, K-quants included (for tests and benchmarks; webtensor quantizes only the 32-value types)."""
    t = block_type(qtype, ArgumentError)
    n, k = shape
    if not -14 <= log2_scale <= 15 or k % t.values:
        raise ArgumentError(f"random_weight: log2_scale {log2_scale} (-14 .. 15), K {k} (a multiple of {t.values})")
    raw = rng.integers(0, 256, (n, k // t.values, t.nbytes), dtype=np.uint8)
    for off in HALVES[qtype]:  # high byte: sign, the exponent, the mantissa's top two bits
        raw[:, :, off + 1] = ((log2_scale + 15) << 2) | (raw[:, :, off + 1] & 0x80) | (raw[:, :, off + 1] & 0x01)
    return QuantWeight.from_blocks(qtype, raw.reshape(n, -1), (n, k))


__all__ = ["QuantWeight", "quant_matmul", "dequantized", "padded", "random_weight", "MODEL_LOG2_SCALE"]
