"""The KV cache's element types (`--kv-dtype`) and the q8_0 pool's layout, with its numpy reference.

A KV pool holds float32, float16 or q8_0 (docs/design-kv.md). q8_0 is llama.cpp's `block_q8_0` per 32
consecutive values of one head's key or value — d = max|x| / 127, q = roundf(x / d), d kept as float16 —
laid out per (position, head) as the head's D int8 quants, then its D / 32 float16 scales, padded to a
whole u32: `q8_words(D)` u32 words, so a q8_0 pool is an int32 tensor (..., KVH, q8_words(D)). Same bytes
as llama.cpp's 34-byte blocks where D / 32 is even; every four quants one aligned word. The numpy part
(`q8_store`, `q8_load`) is the reference the WGSL kernels (kernels/kv_pages.wgsl) are tested against;
the rest is numpy-free (the page)."""

from __future__ import annotations

from typing import Any

KV_DTYPES = ("float32", "float16", "q8_0")
Q8_BLOCK = 32  # values a q8_0 scale covers


def q8_words(head_dim: int) -> int:
    """u32 words a (position, head) of a q8_0 pool takes: D / 4 of quants, ceil(D / 64) of scales."""
    return head_dim // 4 + -(-head_dim // 64)


def q8_head_dim(words: int) -> int | None:
    """The head dim D (a multiple of 32) whose q8_0 row is `words` words, or None."""
    d = 32 * max(1, (words * 4) // 34)
    for cand in (d - 32, d, d + 32):
        if cand >= 32 and q8_words(cand) == words:
            return cand
    return None


def q8_store(x: Any) -> Any:
    """float values (..., D), D a multiple of 32 -> their q8_0 rows, int32 (..., q8_words(D)), as
    quantize_row_q8_0_ref makes each block (float32 arithmetic; a scale beyond float16 becomes inf)."""
    import numpy as np

    from .quantizer import _inverse, _round_half_away

    x = np.asarray(x, np.float32)
    D = x.shape[-1]
    blocks = x.reshape(-1, D // Q8_BLOCK, Q8_BLOCK)
    d = np.abs(blocks).max(axis=-1) / np.float32(127)  # (n, D / 32)
    inv = _inverse(d.reshape(-1)).reshape(d.shape)  # (1 / d in float32; 0 for an all-zero block)
    q = np.clip(_round_half_away(blocks * inv[..., None]), -127, 127)
    n = blocks.shape[0]
    out = np.zeros((n, 4 * q8_words(D)), np.uint8)
    out[:, :D] = q.astype(np.int8).reshape(n, D).view(np.uint8)
    with np.errstate(over="ignore"):
        out[:, D:D + 2 * (D // Q8_BLOCK)] = d.astype("<f2").view(np.uint8).reshape(n, -1)
    return out.view("<i4").reshape(*x.shape[:-1], q8_words(D))


def q8_load(rows: Any, head_dim: int) -> Any:
    """q8_0 rows int32 (..., q8_words(D)) -> float32 (..., D): each quant times its block's scale."""
    import numpy as np

    D = head_dim
    raw = np.ascontiguousarray(rows, "<i4").view(np.uint8).reshape(-1, 4 * q8_words(D))
    q = raw[:, :D].view(np.int8).astype(np.float32).reshape(-1, D // Q8_BLOCK, Q8_BLOCK)
    d = raw[:, D:D + 2 * (D // Q8_BLOCK)].copy().view("<f2").astype(np.float32)
    out: Any = (q * d[..., None]).reshape(*np.shape(rows)[:-1], D)
    return out
