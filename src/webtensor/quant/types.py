"""The ggml block types webtensor runs quantized, as numpy-free facts: values and bytes per block,
the shape and byte-count checks a stored tensor must pass, and `Quantized`, the base class of every
quantized weight (the numpy `QuantWeight` and its WebGPU upload `QuantGpu`), which is how the ops
tell a quantized weight from a Tensor without importing numpy (the page, under Pyodide, has none).
Q5_0 and Q5_1 are here because llama.cpp's Q4_K_M / Q5_K_M files hold them: they are its fallback
for Q4_K / Q5_K where a row is not a multiple of 256 values (SmolLM2's 576-wide rows).

Block layouts (ggml's `block_*` structs, little-endian; d, m, dmin float16):

    Q8_0  34 B / 32 values:  d, qs[32] int8                      x = d q
    Q4_0  18 B / 32 values:  d, qs[16] (x[j] low nibble of qs[j],
                             x[j + 16] its high nibble)            x = d (q - 8)
    Q4_1  20 B / 32 values:  d, m, qs[16] (nibbles as Q4_0)       x = d q + m
    Q5_0  22 B / 32 values:  d, qh (u32: bit j the fifth bit of value j), qs[16] (nibbles as Q4_0)
                                                                   x = d (q - 16)
    Q5_1  24 B / 32 values:  d, m, qh, qs[16]                      x = d q + m
    Q4_K 144 B / 256 values: d, dmin, scales[12] (eight 6-bit scales and mins, one pair per
                             sub-block of 32), qs[128] (64-value chunk c: bytes 32c..32c+31,
                             low nibbles values 64c.., high nibbles 64c + 32..)
                                                                   x = d sc q - dmin mn
    Q6_K 210 B / 256 values: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8 (one
                             per 16 values), d                     x = d sc (q - 32)
    Q5_K 176 B / 256 values: d, dmin, scales[12] (as Q4_K), qh[32] (bit s of qh[l]: the fifth bit
                             of value 32 s + l), qs[128] (nibbles as Q4_K)
                                                                   x = d sc q - dmin mn
    Q3_K 110 B / 256 values: hmask[32] (bit 4h + t of hmask[l]: the third bit of value 128 h + 32 t
                             + l), qs[64] (bits 2t of qs[32 h + l]: its low two), scales[12]
                             (sixteen 6-bit scales, one per 16 values), d
                                                                   x = d (sc - 32) (q - 4)
    Q2_K  84 B / 256 values: scales[16] (low nibble sc, high nibble mn, one byte per 16 values),
                             qs[64] (2-bit values as Q3_K's low bits), d, dmin
                                                                   x = d sc q - dmin mn
    IQ4_NL 18 B / 32 values: d, qs[16] (nibbles as Q4_0)          x = d KV[q]
    IQ4_XS 136 B / 256 values: d, scales_h (u16: bits 2s, 2s + 1 the top of sub-block s's scale),
                             scales_l[4] (nibble s % 2 of byte s / 2: its low four bits), qs[128]
                             (sub-block s: bytes 16 s .., low nibbles values 32 s .., high 32 s + 16 ..)
                                                                   x = d (ls - 32) KV[q]

with KV (`IQ4_VALUES`) the sixteen int8 levels of ggml's non-linear 4-bit types.
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import CheckpointError


class BlockType(NamedTuple):
    name: str
    values: int  # values per block (ggml's QK)
    nbytes: int  # bytes per block (ggml's type size)


TYPES: dict[str, BlockType] = {t.name: t for t in (
    BlockType("Q8_0", 32, 34), BlockType("Q4_0", 32, 18), BlockType("Q4_1", 32, 20), BlockType("Q5_0", 32, 22),
    BlockType("Q5_1", 32, 24), BlockType("Q4_K", 256, 144), BlockType("Q6_K", 256, 210),
    BlockType("Q5_K", 256, 176), BlockType("Q3_K", 256, 110), BlockType("Q2_K", 256, 84),
    BlockType("IQ4_NL", 32, 18), BlockType("IQ4_XS", 256, 136),
)}
# what `quant.quantize` makes (the K-quants need llama.cpp's quantizer)
QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
# the byte offsets of each block's float16 numbers (d, and m / dmin where the type has one)
HALVES: dict[str, tuple[int, ...]] = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
                                      "Q4_K": (0, 2), "Q6_K": (208,), "Q5_K": (0, 2), "Q3_K": (108,), "Q2_K": (80, 82),
                                      "IQ4_NL": (0,), "IQ4_XS": (0,)}
# the int8 levels of the non-linear 4-bit types (ggml's kvalues_iq4nl): IQ4_NL's and IQ4_XS's value of nibble q
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class Quantized:
    """Base of every quantized weight: a matrix (N, K) (nn.Linear's layout, K the reduction dim) or
    an embedding table (V, C) held in one ggml block type. Subclasses set `qtype` (a key of
    `TYPES`) and `shape`."""

    __slots__ = ()
    qtype: str
    shape: tuple[int, int]

    @property
    def block(self) -> BlockType:
        return TYPES[self.qtype]


def block_type(qtype: str, error: type[Exception] = CheckpointError) -> BlockType:
    """The BlockType of ggml type name `qtype`; `error` (CheckpointError by default) for any other."""
    t = TYPES.get(qtype) if isinstance(qtype, str) else None
    if t is None:
        raise error(f"ggml type {qtype!r} is not a quantized type webtensor runs (it runs {', '.join(TYPES)})")
    return t


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one stored row of k values (k a multiple of the block)."""
    t = TYPES[qtype]
    return k // t.values * t.nbytes


def check_shape(qtype: str, shape: tuple[int, ...], error: type[Exception] = CheckpointError) -> tuple[int, int]:
    """(N, K) of a stored matrix of `shape` in `qtype`: 2-D, N >= 0, K a positive multiple of the
    block (GGUF's rule). `error` (CheckpointError, or ShapeError for a device's upload) otherwise."""
    t = block_type(qtype, error)
    if len(shape) != 2:
        raise error(f"a {qtype} weight is a 2-D matrix (N, K), got shape {tuple(shape)}")
    n, k = (int(s) for s in shape)
    if n < 0 or k <= 0 or k % t.values:
        raise error(f"a {qtype} tensor needs rows of a positive multiple of {t.values} values, got shape {(n, k)}")
    return n, k


def check_blocks(qtype: str, shape: tuple[int, ...], nbytes: int) -> tuple[int, int]:
    """(N, K) after `check_shape`, and that `nbytes` stored bytes are exactly N rows of K values;
    CheckpointError naming the byte counts otherwise."""
    n, k = check_shape(qtype, shape)
    want = n * row_bytes(qtype, k)
    if nbytes != want:
        raise CheckpointError(f"a {qtype} tensor of shape {(n, k)} needs {want} bytes, got {nbytes}")
    return n, k


__all__ = ["TYPES", "QUANTIZABLE", "HALVES", "IQ4_VALUES", "BlockType", "Quantized", "block_type", "row_bytes",
           "check_shape", "check_blocks"]
