"""The CPU reference backend: each op written plainly in numpy, for clarity over speed.

Every WebGPU kernel is tested against these functions. Arithmetic is done in float32 (float16
inputs are widened first, outputs rounded back), mirroring the WGSL kernels, which compute in f32.
`CpuBackend` (at the end) implements `backends.base.Backend` with them: a CPU tensor's storage is
one flat numpy array (`CpuStorage`) and a tensor is a strided view of it, as on the GPU.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DeviceMismatchError, GraphCaptureError, ShapeError
from ..quant.kv import q8_load, q8_store
from ..quant.types import Quantized
from .base import replay_times

F32 = np.float32
F32_DTYPE = np.dtype(F32)


def _f32(x: np.ndarray) -> npt.NDArray[np.float32]:
    return x.astype(F32, copy=False)


def add(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) + _f32(b)).astype(out_dtype)


def sub(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) - _f32(b)).astype(out_dtype)


def mul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    return (_f32(a) * _f32(b)).astype(out_dtype)


def div(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (_f32(a) / _f32(b)).astype(out_dtype)


def matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    # a: (..., M, K), b: (..., K, N) -> (..., M, N)
    return (_f32(a) @ _f32(b)).astype(out_dtype)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
           out_dtype: np.dtype) -> np.ndarray:
    # x: (..., K) @ w: (K, N) + b: (N,) -> act -> + residual: (..., N)
    return _epilogue(_f32(x) @ _f32(w), b, act, residual, out_dtype)


def quant_linear(x: np.ndarray, w: Any, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
                 out_dtype: np.dtype = F32_DTYPE) -> np.ndarray:
    # `linear` with a quantized weight w (a QuantWeight of shape (N, K)): x (..., K) @ dequantize(w).T
    # in float32 (the dequantized matrix computed once per weight and kept: quant.weight.dequantized),
    # then the same epilogue
    from ..quant.weight import quant_matmul

    return _epilogue(quant_matmul(_f32(x), w), b, act, residual, out_dtype)


def moe_route(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    # logits (T, E) -> weights float32 (T, k), ids int32 (T, k): the k largest logits in descending order
    # (a stable sort: the lower id first among ties), their softmax probabilities (over all E), renormalized
    # to sum 1 where `normalize`
    v = _f32(logits)
    ids = np.argsort(-v, axis=-1, kind="stable")[:, :k].astype(np.int32)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    p = np.take_along_axis(e, ids, axis=-1) / e.sum(axis=-1, keepdims=True)
    if normalize:
        p = p / p.sum(axis=-1, keepdims=True)
    return p.astype(F32), ids


def _check_experts(ids: np.ndarray, E: int) -> None:
    # a step's expert ids are host data here: checked on every call (and replay), as an embedding's ids are
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        bad = ids[(ids < 0) | (ids >= E)].reshape(-1)[0]
        raise ShapeError(f"expert_linear: expert id {bad} is out of range for {E} experts")


def expert_linear(x: np.ndarray, kn: np.ndarray, ids: np.ndarray, E: int) -> np.ndarray:
    # x (T, X, K), X = 1 or k; kn: the stack (E x N, K) transposed, float32 (K, E x N); ids (T, k) -> (T, k, N)
    # float32. Grouped by expert, each expert's slots as a stack of one-row products with its (K, N) columns of
    # kn (BLAS's matrix-vector path: a row's bits are those of the row alone, whatever else the step holds)
    _check_experts(ids, E)
    T, k = ids.shape
    N = kn.shape[1] // E
    out = np.empty((T, k, N), F32)
    for e in np.unique(ids):
        t, j = np.nonzero(ids == e)
        xs = _f32(x[t, j if x.shape[1] > 1 else 0])[:, None, :]  # (m, 1, K)
        out[t, j] = (xs @ kn[:, int(e) * N:(int(e) + 1) * N])[:, 0]
    return out


_STACKS_KN: dict[int, np.ndarray] = {}  # id of a live stack Tensor -> its (K, E x N) copy (Tensors compare by op)
_STACKS_LOCK = threading.Lock()


def experts_kn(experts: Any) -> np.ndarray:
    """An expert stack (E x N, K) — a CPU Tensor or a QuantWeight — as float32 (K, E x N), made once per stack and
    kept while it lives (as `quant.weight.dequantized` keeps a quantized matrix's): the products read its column
    blocks in place."""
    from ..quant.weight import dequantized

    if isinstance(experts, Quantized):
        return dequantized(experts)  # type: ignore[arg-type]
    key = id(experts)
    with _STACKS_LOCK:
        kn = _STACKS_KN.get(key)
    if kn is None:
        kn = np.ascontiguousarray(_f32(view(experts)).T)
        kn.setflags(write=False)
        with _STACKS_LOCK:
            _STACKS_KN[key] = kn
        weakref.finalize(experts, _STACKS_KN.pop, key, None)  # (dropped with the Tensor: its id may be reused)
    return kn


def _epilogue(y: np.ndarray, b: np.ndarray | None, act: str | None, residual: np.ndarray | None,
              out_dtype: np.dtype) -> np.ndarray:
    # linear's fused epilogue on the float32 product y: + bias, the activation, + residual
    if b is not None:
        y = y + _f32(b)
    if act is not None:
        y = activation(act, y)
    if residual is not None:
        y = y + _f32(residual)
    return y.astype(out_dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    # GPT-2's tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3),
    # written as the identical x * sigmoid(2u): no cancellation where tanh(u) is near -1
    # (below u = -40 the value is under 1e-33 in magnitude and is -0.0, as in the WGSL kernel; gelu(-inf) = -0.0)
    v = _f32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        u = F32(np.sqrt(2.0 / np.pi)) * (v + F32(0.044715) * v * v * v)
        y = np.where(u < -40, F32(-0.0), v / (F32(1.0) + np.exp(F32(-2.0) * np.maximum(u, -40))))
    return y.astype(x.dtype)


def _erfc(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # erfc to ~1.2e-7 relative, the Chebyshev fit epilogue.wgsl uses (numpy has no erf); in float64
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r: npt.NDArray[np.float64] = t * np.exp(-z * z + poly)
    return np.where(x >= 0, r, 2.0 - r)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))  # torch's threshold of 20


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow of exp(-x)


def _gelu_erf(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 0.5 * v * _erfc(-v / np.sqrt(2.0))


# the activations of webtensor.activations.CODES (gelu_tanh is `gelu` above), in float64
_ACTS: dict[str, Callable[[npt.NDArray[np.float64]], np.ndarray]] = {
    "gelu_erf": _gelu_erf,
    "gelu_erf_clip10": lambda v: np.clip(_gelu_erf(v), -10.0, 10.0),
    "quick_gelu": lambda v: v * _sigmoid(1.702 * v),
    "relu": lambda v: np.maximum(v, 0.0),
    "relu2": lambda v: np.maximum(v, 0.0) ** 2,
    "relu6": lambda v: np.clip(v, 0.0, 6.0),
    "leaky_relu": lambda v: np.where(v >= 0, v, 0.01 * v),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda v: v * _sigmoid(v),
    "hardswish": lambda v: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0,
    "mish": lambda v: v * np.tanh(_softplus(v)),
    "laplace": lambda v: 0.5 * _erfc(-(v - 0.707107) / (0.282095 * np.sqrt(2.0))),
    "sqrt_softplus": lambda v: np.sqrt(_softplus(v)),
}


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """The activation `name` (a key of webtensor.activations.CODES) elementwise, in x's dtype."""
    if name == "gelu_tanh":
        return gelu(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return _ACTS[name](x.astype(np.float64)).astype(x.dtype)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    # x: (..., C); normalise over C, then scale by w (C,) and shift by b (C,). Statistics in
    # float64: no overflow of the variance for any float32 input.
    v = x.astype(np.float64)
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    y: npt.NDArray[np.float64] = (v - mean) / np.sqrt(var + eps)
    return (y * w.astype(np.float64) + b.astype(np.float64)).astype(x.dtype)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    # x: (..., C); x / sqrt(mean(x^2) + eps) * w (C,). The mean square in float64: no overflow for
    # any float32 input (rms_norm.wgsl scales big rows instead)
    v = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # (inf and NaN: docs/numerics.md)
        ms = (v * v).mean(axis=-1, keepdims=True)
        y: npt.NDArray[np.float64] = v / np.sqrt(ms + eps)
        return (y * w.astype(np.float64)).astype(x.dtype)


def swiglu(g: np.ndarray, u: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    # silu(g) * u = g * sigmoid(g) * u in float32, sigmoid as 1 / (1 + exp(-g)) (elementwise.wgsl's
    # order: exp(-g) overflowing to inf gives sigmoid 0, so silu(-large) = -0)
    gv = _f32(g)
    with np.errstate(over="ignore", invalid="ignore"):
        sig: npt.NDArray[np.float32] = F32(1.0) / (F32(1.0) + np.exp(-gv))
        return (gv * sig * _f32(u)).astype(out_dtype)


def geglu(g: np.ndarray, u: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    # gelu_tanh(g) * u in float32 (`gelu`'s expression, then the product)
    return (gelu(_f32(g)) * _f32(u)).astype(out_dtype)


GLU = {"swiglu": swiglu, "geglu": geglu}  # linear's gated prologues: (gate, up, out dtype) -> act(gate) * up


def _check_positions(pos: np.ndarray, P: int) -> None:
    # rope's positions are host data here: checked on every call (and replay), as webtensor.ops
    # checks positions given from the host (rope.wgsl clamps them to the table instead)
    if pos.size and (pos.min() < 0 or pos.max() >= P):
        bad = pos[(pos < 0) | (pos >= P)].reshape(-1)[0]
        raise ShapeError(f"rope: position {bad} is outside the cos / sin tables of {P} rows")


def rope(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    # x: (T, H, D); pos: (T,); cos, sin: (P, R/2) float32. Pairs (a, b) = dims (i, i + R/2), or
    # (2i, 2i + 1) when interleaved, rotate by the angle of row pos[t], column i: a c - b s, b c + a s,
    # in float32; dims R.. pass through. -> (T, H, D) in x's dtype
    half = cos.shape[1]
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]  # (T, 1, R/2)
    v = _f32(x)
    out = v.copy()
    ia, ib = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else (slice(0, half), slice(half, 2 * half))
    a, b = v[..., ia], v[..., ib]
    out[..., ia] = a * c - b * s
    out[..., ib] = b * c + a * s
    return out.astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    v = _f32(x)
    e: npt.NDArray[np.float32] = np.exp(v - v.max(axis=-1, keepdims=True))
    total: npt.NDArray[np.float32] = e.sum(axis=-1, keepdims=True)
    return (e / total).astype(x.dtype)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    # cap * tanh(x / cap) in float32, in x's dtype (Gemma 2's logit soft-capping: transformers' order)
    c = F32(cap)
    out: np.ndarray = (np.tanh(_f32(x) / c) * c).astype(x.dtype)
    return out


def _softcap_scores(scores: np.ndarray, cap: float | None) -> None:
    # attention scores soft-capped in place: scores / cap, tanh, * cap (float32; transformers' order)
    if cap is not None:
        c = F32(cap)
        np.true_divide(scores, c, out=scores)
        np.tanh(scores, out=scores)
        np.multiply(scores, c, out=scores)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float, window: int | None = None,
              cap: float | None = None) -> np.ndarray:
    # q: (T, H, D), k and v: (S, KVH, D) with S >= T; query head h reads kv head h // (H // KVH);
    # query t (position t + S - T) sees keys j <= t + (S - T) if causal, and of those j > t + (S - T) - window;
    # the scores soft-capped by `cap` before the mask
    T, S = q.shape[0], k.shape[0]
    H, KVH = q.shape[1], k.shape[1]
    if KVH != H:  # grouped-query: each kv head repeated for its H // KVH query heads
        heads = np.arange(H) // (H // KVH)
        k, v = k[:, heads], v[:, heads]  # (S, H, D)
    qh, kh, vh = (_f32(t).transpose(1, 0, 2) for t in (q, k, v))  # (H, T, D), (H, S, D)
    scores = (qh @ kh.transpose(0, 2, 1)) * F32(scale)  # (H, T, S)
    _softcap_scores(scores, cap)
    if causal:
        at = np.arange(T)[:, None] + (S - T)  # each query's position
        visible = np.arange(S)[None, :] <= at
        if window is not None:
            visible &= np.arange(S)[None, :] > at - window
        scores = np.where(visible[None], scores, -np.inf)
    probs = softmax(scores)
    return (probs @ vh).transpose(1, 0, 2).astype(q.dtype)  # (T, H, D)


def embedding(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    # table: (V, C), ids: (...) -> (..., C)
    rows: np.ndarray = table[ids]
    return rows


def _check_ids(ids: np.ndarray, V: int) -> None:
    # the ids of an embedding are host data here: checked on every call (and replay), as
    # webtensor.ops checks ids given from the host (a WebGPU kernel skips out-of-range ids)
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        bad = ids[(ids < 0) | (ids >= V)].reshape(-1)[0]
        raise ShapeError(f"embedding: id {bad} is out of range for a table of {V} rows")


def _host_weight(op: str, w: Any, other: str) -> None:
    # a quantized weight on the CPU device is the host QuantWeight itself; a device's upload of one
    # lives elsewhere
    from ..quant.weight import QuantWeight

    if not isinstance(w, QuantWeight):
        raise DeviceMismatchError(f"{op}: the {w.qtype} weight lives on {w.device.describe()}, {other} on the CPU; "
                                  "pass the QuantWeight (it is uploaded where it is used)")


def argmax(x: np.ndarray) -> np.ndarray:
    ids: np.ndarray = np.argmax(x, axis=-1)
    return ids.astype(np.int32)


def token_mask(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """x where column c's bit (bit c % 32 of word c // 32, least significant first) is set, else -inf."""
    V = x.shape[-1]
    keep = np.unpackbits(np.ascontiguousarray(bits, "<i4").view(np.uint8), axis=-1, bitorder="little")[..., :V]
    return np.where(keep.astype(bool), x, np.array(-np.inf, x.dtype))


def cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return x.astype(dtype)


def _check_slots(slot: np.ndarray, n_slots: int) -> None:
    # a KV cache's slots are host data here: checked on every call (and replay); the WGSL kernels
    # skip a row whose slot is out of range instead (never writing outside the cache)
    if slot.size and (slot.min() < 0 or slot.max() >= n_slots):
        bad = slot[(slot < 0) | (slot >= n_slots)].reshape(-1)[0]
        raise ShapeError(f"KV cache: slot {bad} is out of range for a cache of {n_slots} slots")


def kv_rows(pos: np.ndarray, slot: np.ndarray, cache_shape: tuple[int, ...], table: np.ndarray | None) -> np.ndarray:
    """The pool rows (of the cache's (n_blocks * block_size) rows) of positions pos[i] of sequences slot[i]: through
    the block table, row table[s, p // block_size] * block_size + p % block_size (kv_pages.wgsl's kv_row); without
    one, sequence s is block s. -1 where the position is negative or past the table; a ShapeError for a slot outside
    the table (the cache) or a position whose table entry is not a block of the pool (host data here: checked on
    every call and replay, where the WGSL kernels skip such a row)."""
    n_blocks, bs = cache_shape[:2]
    p, s = pos.astype(np.int64), slot.astype(np.int64)
    if table is None:
        _check_slots(slot, n_blocks)
        return np.where((p >= 0) & (p < bs), s * bs + p, -1)
    n_seqs, max_blocks = table.shape
    _check_slots(slot, n_seqs)
    j = p // bs
    ok = (p >= 0) & (j < max_blocks)
    blk = np.full(p.shape, -1, np.int64)
    blk[ok] = table[s[ok], j[ok]]
    bad = ok & ((blk < 0) | (blk >= n_blocks))
    if bad.any():
        i = int(np.argmax(bad.reshape(-1)))
        raise ShapeError(f"KV cache: position {p.reshape(-1)[i]} of slot {s.reshape(-1)[i]} has no block in the table "
                         f"(entry {blk.reshape(-1)[i]}; the pool has {n_blocks} blocks)")
    return np.where(ok, blk * bs + p % bs, -1)


def seq_rows(table: np.ndarray | None, seq: int, n: int, cache_shape: tuple[int, ...],
             first: int = 0) -> slice | np.ndarray:
    """The pool rows of positions first .. n - 1 of sequence `seq` (`kv_rows` for a run of positions; a window's
    reads start past 0, and the table's entries before `first` are not read: they may be blocks given back): a
    slice where they are consecutive (a contiguous cache, or blocks in order: a view, no copy), else an index array.
    The checks and errors of `kv_rows`."""
    n_blocks, bs = cache_shape[:2]
    first = min(first, n)
    if table is None:
        _check_slots(np.array([seq]), n_blocks)
        return slice(seq * bs + min(first, bs), seq * bs + min(n, bs))
    _check_slots(np.array([seq]), table.shape[0])
    b0, nb = first // bs, -(-n // bs)
    blk = table[seq, b0:nb]
    if len(blk) and (blk.min() < 0 or blk.max() >= n_blocks):
        return kv_rows(np.arange(first, n), np.full(n - first, seq), cache_shape, table)  # (raises, naming it)
    lo, k = first - b0 * bs, len(blk)
    if k and blk[-1] - blk[0] == k - 1 and (k == 1 or bool((np.diff(blk) == 1).all())):
        return slice(int(blk[0]) * bs + lo, int(blk[0]) * bs + lo + n - first)
    return (blk[:, None].astype(np.int64) * bs + np.arange(bs)).reshape(-1)[lo:lo + n - first]


def _pool_rows(cache: np.ndarray) -> np.ndarray:
    # a pool (n_blocks, block_size, KVH, last) as its (n_blocks * block_size, KVH, last) rows (a view)
    return cache.reshape(-1, *cache.shape[2:])


def kv_store(cache: np.ndarray, rows: np.ndarray, x: np.ndarray) -> None:
    """Pool rows `rows` (>= 0) of a cache get x (n, KVH, D) in the cache's type: float32, float16 (rounded), or
    q8_0 (int32 pools: `quant.kv.q8_store`)."""
    flat = _pool_rows(cache)
    with np.errstate(over="ignore"):  # (past float16's range: inf, as the kernels store it)
        val = q8_store(x) if cache.dtype == np.int32 else x.astype(cache.dtype)
    if len(set(rows.tolist())) == len(rows):
        flat[rows] = val
    else:  # (a position written twice in one call: the last row's value, as in order)
        for r, v in zip(rows.tolist(), val, strict=True):
            flat[r] = v


def kv_load(cache: np.ndarray, rows: np.ndarray | slice, head_dim: int) -> np.ndarray:
    """Pool rows `rows` (>= 0, or a slice) of a cache as float32 (n, KVH, D): as stored, widened (q8_0: quant *
    scale); a float32 cache's slice is a view."""
    v = _pool_rows(cache)[rows]
    return q8_load(v, head_dim) if cache.dtype == np.int32 else _f32(v)


def cache_write(cache: np.ndarray, src: np.ndarray, pos: np.ndarray, slot: np.ndarray,
                table: np.ndarray | None = None) -> None:
    # position pos[t] of sequence slot[t] gets src[t] (T, H, D); rows whose position is negative or past the table
    # are skipped, as in cache_write.wgsl
    rows = kv_rows(pos, slot, cache.shape, table)
    keep = rows >= 0
    if keep.any():
        kv_store(cache, rows[keep], _f32(src[keep]))


def _check_one_slot(slot: np.ndarray) -> None:
    # chunk_attention's rows are one sequence's: every slot is slot[0] (checked on every call and
    # replay; the WGSL kernel reads slot[0] only)
    if slot.size and (slot != slot[0]).any():
        other = slot[slot != slot[0]][0]
        raise ShapeError(f"chunk_attention: the rows are in slots {slot[0]} and {other}: they must be one "
                         "sequence's (one slot)")


def chunk_attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: np.ndarray, slot: np.ndarray,
                    scale: float, table: np.ndarray | None = None, window: int | None = None,
                    cap: float | None = None) -> np.ndarray:
    # q: (T, H, D), the rows of one sequence (every slot slot[0]'s) at positions pos; kc, vc: pools (blocks,
    # block_size, KVH, D or q8_0 words) read through `table` (None: sequence s is block s). Row t attends to
    # positions 0..pos[t] (within the table) of the sequence, as stored, the last `window` of them where it slides
    # (`_seen`): every row's scores against the keys the rows see, in one product a KV head (query head h = kv
    # head h // G, member h % G), soft-capped by `cap`, the invisible ones masked -> (T, H, D) float32
    _check_slots(slot, kc.shape[0] if table is None else table.shape[0])
    _check_one_slot(slot)
    T, H, D = q.shape
    KVH = kc.shape[2]
    n_ctx = kc.shape[1] if table is None else table.shape[1] * kc.shape[1]
    G = H // KVH
    if T == 0:
        return np.empty(q.shape, F32)
    lim = np.minimum(pos.astype(np.int64) + 1, n_ctx)  # (T,) keys lo <= j < lim each row sees
    lo = np.zeros_like(lim) if window is None else np.clip(pos.astype(np.int64) + 1 - window, 0, lim)
    n = max(int(lim.max()), 1)  # (position 0 exists: rows at negative positions see nothing, NaN)
    bs = kc.shape[1]
    j0 = min(int(lo[lim > 0].min()) if (lim > 0).any() else 0, n - 1) // bs * bs  # keys from the block of the first
    rows_n = seq_rows(table, int(slot[0]), n, kc.shape, j0)  # one a row sees (none before it is read)
    k, v = kv_load(kc, rows_n, D).transpose(1, 2, 0), kv_load(vc, rows_n, D).transpose(1, 0, 2)  # (KVH, D|n', n'|D)
    qh = _f32(q).reshape(T, KVH, G, D).transpose(1, 0, 2, 3).reshape(KVH, T * G, D)  # rows (t, g)
    scores = (qh @ k) * F32(scale)  # (KVH, T G, n - j0)
    _softcap_scores(scores, cap)
    j = np.arange(j0, n)[None, :]
    visible = np.repeat((j < lim[:, None]) & (j >= lo[:, None]), G, axis=0)  # (T G, n)
    scores = np.where(visible[None], scores, F32(-np.inf))
    with np.errstate(invalid="ignore"):  # (a row that sees nothing: NaN)
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out = (e / e.sum(axis=-1, keepdims=True)) @ v  # (KVH, T G, D)
    rows: np.ndarray = out.reshape(KVH, T, G, D).transpose(1, 0, 2, 3).reshape(T, H, D).astype(F32, copy=False)
    return rows


def _query_groups(q: np.ndarray, KVH: int) -> np.ndarray:
    # q (T, H, D) as (T, KVH, H // KVH, D): query head h = kv head h // G, member h % G (a view:
    # splitting one axis never copies, so a captured step's view follows the tensor)
    T, H, D = q.shape
    return q.reshape(T, KVH, H // KVH, D)


def _seen(p: int, n_ctx: int, window: int | None) -> tuple[int, int]:
    # the cache positions lo..n-1 a query at position p attends to: 0..p (within the cache), the last `window` of
    # them where it slides
    n = min(p + 1, n_ctx)
    return (0 if window is None else max(0, min(n, p + 1 - window))), n


def _attend(out: np.ndarray, q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: np.ndarray, slot: np.ndarray,
            scale: float, table: np.ndarray | None, window: int | None = None, cap: float | None = None) -> None:
    # cached_attention into float32 `out` (q float32), row by row: row t's keys and values at positions
    # 0..pos[t] of its sequence read from the pool (as stored, widened; the last `window` of them where it slides,
    # `_seen`), then the G = H // KVH query heads of a kv
    # head as G rows against its keys, each as `attention` computes one query (non-causal: the same numpy
    # operations in the same order, without its conversions and masks). The eager op and the captured step both
    # run this, so their numbers are the same bit for bit.
    n_ctx = kc.shape[1] if table is None else table.shape[1] * kc.shape[1]
    _check_slots(slot, kc.shape[0] if table is None else table.shape[0])
    qh = _query_groups(q, kc.shape[2])  # (T, KVH, G, D)
    sc, D = F32(scale), q.shape[2]
    for t, (p, s) in enumerate(zip(pos.tolist(), slot.tolist(), strict=True)):
        lo, n = _seen(p, n_ctx, window)
        if n <= lo:  # (a negative position, or a window past the cache: attends to nothing, as the kernels: 0 / 0)
            out[t] = np.nan
            continue
        rows = seq_rows(table, s, n, kc.shape, lo)  # (positions before the window: not read)
        k, v = kv_load(kc, rows, D).transpose(1, 2, 0), kv_load(vc, rows, D).transpose(1, 0, 2)
        scores = qh[t] @ k  # (KVH, G, n - lo)
        np.multiply(scores, sc, out=scores)
        _softcap_scores(scores, cap)
        np.subtract(scores, np.maximum.reduce(scores, axis=-1, keepdims=True), out=scores)  # (.max's reduce)
        np.exp(scores, out=scores)
        np.true_divide(scores, np.add.reduce(scores, axis=-1, keepdims=True), out=scores)  # (.sum's)
        out[t] = (scores @ v).reshape(out.shape[1:])  # (KVH, G, D) -> (H, D)


def cached_attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: np.ndarray, slot: np.ndarray,
                     scale: float, table: np.ndarray | None = None, window: int | None = None,
                     cap: float | None = None) -> np.ndarray:
    # q: (T, H, D); kc, vc: pools (blocks, block_size, KVH, D or q8_0 words); row t attends to positions 0..pos[t]
    # of sequence slot[t] (the last `window` of them where it slides; scores soft-capped by `cap`), query head h
    # to kv head h // (H // KVH)
    out = np.empty(q.shape, F32)
    _attend(out, _f32(q), kc, vc, pos, slot, scale, table, window, cap)
    return out


def cache_gather(cache: np.ndarray, slot: int, n: int, head_dim: int, table: np.ndarray | None = None) -> np.ndarray:
    # positions 0 .. n - 1 of sequence `slot` as stored, float32 (n, KVH, D)
    return np.array(kv_load(cache, seq_rows(table, slot, n, cache.shape), head_dim))


def advance_tokens(new: np.ndarray, ids: np.ndarray, pos: np.ndarray, tokens: np.ndarray,
                   count: np.ndarray) -> None:
    # the end of a decode step (advance_tokens.wgsl): new tokens become the next ids, positions
    # move on, and the tokens are appended to the ring `tokens` (ring, B) at step count[0]
    n, B = int(count[0]), new.shape[0]
    ids[:] = new
    pos += 1
    if n < tokens.size // max(B, 1):
        tokens.reshape(-1, B)[n] = new
    count[0] = n + 1


LnArgs = tuple[np.ndarray, np.ndarray, float]  # layer_norm's (w, b, eps)
RmsArgs = tuple[np.ndarray, float]  # rms_norm's (w, eps)


def _normed(x: np.ndarray, ln: LnArgs | None, rms: RmsArgs | None, glu: str | None = None) -> np.ndarray:
    # linear's prologue: x layer-normalised (ln = (w, b, eps)), RMS-normalised (rms = (w, eps)),
    # gated (glu: swiglu / geglu of x's halves (..., 2K) -> (..., K), in x's dtype as `swiglu` / `geglu` give
    # it) or as is
    if ln is not None:
        return layer_norm(_f32(x), *ln)
    if rms is not None:
        return rms_norm(_f32(x), *rms)
    if glu is not None:
        K = x.shape[-1] // 2
        return GLU[glu](x[..., :K], x[..., K:], x.dtype)
    return x


# -- in-place forms, for graphs ------------------------------------------------------------------
# A captured graph (CpuGraph) runs these instead of the functions above where they apply: the same
# numpy operations in the same order on the same float32 / float64 values, written into buffers
# allocated once at capture time instead of fresh arrays, so the numbers are bit for bit the same
# (tests/test_cpu_graph.py checks them against the functions above) and a replay allocates nothing.
# Each `*_step` allocates its scratch and returns the step, a function of no arguments.

def _layer_norm_step(out: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> Callable[[], None]:
    # layer_norm(x, w, b, eps) into out; x float32, C-contiguous (so that the float64 copy has
    # x.astype's layout and the sums over C run as layer_norm's do)
    C = x.shape[-1]
    v, sq = np.empty(x.shape, np.float64), np.empty(x.shape, np.float64)
    mean, var = np.empty(x.shape[:-1] + (1,), np.float64), np.empty(x.shape[:-1] + (1,), np.float64)

    def step() -> None:
        np.copyto(v, x)
        np.add.reduce(v, axis=-1, keepdims=True, out=mean)  # v.mean(...): the sum, then / C
        np.true_divide(mean, C, out=mean)
        np.subtract(v, mean, out=v)  # v - mean (both of layer_norm's uses)
        np.multiply(v, v, out=sq)  # (v - mean) ** 2
        np.add.reduce(sq, axis=-1, keepdims=True, out=var)
        np.true_divide(var, C, out=var)
        np.add(var, eps, out=var)
        np.sqrt(var, out=var)
        np.true_divide(v, var, out=v)
        np.multiply(v, w, out=v)  # (w, b float32: widened to float64 exactly, as by astype)
        np.add(v, b, out=v)
        np.copyto(out, v)  # (astype(float32): the same rounding)
    return step


_GELU_C = F32(np.sqrt(2.0 / np.pi))


def _gelu_step(y: np.ndarray) -> Callable[[], None]:
    # gelu(y) in place (y float32): gelu's expression, operation by operation
    u, t, low = np.empty(y.shape, F32), np.empty(y.shape, F32), np.empty(y.shape, bool)

    def step() -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            np.multiply(F32(0.044715), y, out=t)  # 0.044715 v v v, left to right
            np.multiply(t, y, out=t)
            np.multiply(t, y, out=t)
            np.add(y, t, out=t)
            np.multiply(_GELU_C, t, out=u)  # u
            np.maximum(u, -40, out=t)
            np.multiply(F32(-2.0), t, out=t)
            np.exp(t, out=t)
            np.add(F32(1.0), t, out=t)
            np.true_divide(y, t, out=y)  # v / (1 + exp(-2 max(u, -40)))
            np.less(u, -40, out=low)
            np.copyto(y, F32(-0.0), where=low)
    return step


def _rms_norm_step(out: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> Callable[[], None]:
    # rms_norm(x, w, eps) into out; x float32, C-contiguous (as _layer_norm_step)
    C = x.shape[-1]
    v, sq = np.empty(x.shape, np.float64), np.empty(x.shape, np.float64)
    ms = np.empty(x.shape[:-1] + (1,), np.float64)

    def step() -> None:
        np.copyto(v, x)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            np.multiply(v, v, out=sq)
            np.add.reduce(sq, axis=-1, keepdims=True, out=ms)  # .mean(...): the sum, then / C
            np.true_divide(ms, C, out=ms)
            np.add(ms, eps, out=ms)
            np.sqrt(ms, out=ms)
            np.true_divide(v, ms, out=v)
            np.multiply(v, w, out=v)  # (w float32: widened to float64 exactly, as by astype)
        np.copyto(out, v)
    return step


def _swiglu_step(out: np.ndarray, g: np.ndarray, u: np.ndarray) -> Callable[[], None]:
    # swiglu(g, u) into out (all float32): its expression, operation by operation
    t = np.empty(g.shape, F32)

    def step() -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            np.negative(g, out=t)
            np.exp(t, out=t)
            np.add(F32(1.0), t, out=t)
            np.true_divide(F32(1.0), t, out=t)  # sigmoid(g)
            np.multiply(g, t, out=t)
            np.multiply(t, u, out=out)
    return step


def _geglu_step(out: np.ndarray, g: np.ndarray, u: np.ndarray) -> Callable[[], None]:
    # geglu(g, u) into out (all float32): gelu's steps on a copy of g, then the product
    gelu_in_place = _gelu_step(out)

    def step() -> None:
        np.copyto(out, g)
        gelu_in_place()
        np.multiply(out, u, out=out)
    return step


_GLU_STEPS = {"swiglu": _swiglu_step, "geglu": _geglu_step}


def _rope_step(out: np.ndarray, x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               interleaved: bool) -> Callable[[], None]:
    # rope(x, pos, cos, sin) into out (x float32): the tables' rows gathered into scratch, then rope's
    # products and sums, each into scratch or out
    T, half = x.shape[0], cos.shape[1]
    c, s = np.empty((T, 1, half), F32), np.empty((T, 1, half), F32)
    t1, t2 = np.empty(x.shape[:-1] + (half,), F32), np.empty(x.shape[:-1] + (half,), F32)
    ia, ib = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else (slice(0, half), slice(half, 2 * half))
    a, b, oa, ob = x[..., ia], x[..., ib], out[..., ia], out[..., ib]

    def step() -> None:
        _check_positions(pos, cos.shape[0])
        np.take(cos, pos, axis=0, out=c[:, 0])
        np.take(sin, pos, axis=0, out=s[:, 0])
        np.copyto(out, x)  # (the dims past R)
        np.multiply(a, c, out=t1)
        np.multiply(b, s, out=t2)
        np.subtract(t1, t2, out=oa)
        np.multiply(b, c, out=t1)
        np.multiply(a, s, out=t2)
        np.add(t1, t2, out=ob)
    return step


def _linear_step(out: np.ndarray, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, act: str | None,
                 residual: np.ndarray | None, ln: LnArgs | None, rms: RmsArgs | None = None,
                 glu: str | None = None) -> Callable[[], None] | None:
    """linear (with its layer-norm, RMS-norm or SwiGLU prologue) into float32 `out`, or None where this
    form does not apply (other dtypes or activations, a non-contiguous input to the norm)."""
    norm_arrays = ln[:2] if ln is not None else rms[:1] if rms is not None else ()
    arrays = [a for a in (x, w, b, residual, *norm_arrays) if a is not None]
    norm = ln is not None or rms is not None
    if any(a.dtype != F32 for a in arrays) or out.dtype != F32 or act not in (None, "gelu_tanh") or \
            (norm and not x.flags.c_contiguous):
        return None
    parts: list[Callable[[], object]] = []
    if norm:
        xn = np.empty(x.shape, F32)
        if ln is not None:
            parts.append(_layer_norm_step(xn, x, *ln))
        elif rms is not None:
            parts.append(_rms_norm_step(xn, x, *rms))
        x = xn
    if glu is not None:  # swiglu / geglu of the halves into scratch (..., K)
        K = x.shape[-1] // 2
        xg = np.empty(x.shape[:-1] + (K,), F32)
        parts.append(_GLU_STEPS[glu](xg, x[..., :K], x[..., K:]))
        x = xg
    parts.append(lambda: np.matmul(x, w, out=out))
    if b is not None:
        parts.append(lambda: np.add(out, b, out=out))
    if act is not None:
        parts.append(_gelu_step(out))
    if residual is not None:
        parts.append(lambda: np.add(out, residual, out=out))

    def step() -> None:
        for p in parts:
            p()
    return step


# -- the Backend ---------------------------------------------------------------------------------
class CpuStorage:
    """A CPU tensor's memory: one flat numpy array (`chunks` is for the GPU's row chunking)."""

    __slots__ = ("array", "__weakref__")

    def __init__(self, array: np.ndarray):
        self.array = array  # 1-d, contiguous

    @property
    def chunks(self) -> tuple[np.ndarray]:
        return (self.array,)


def view(t: Any) -> np.ndarray:
    """The numpy view of tensor `t` (shares its memory: writing to it writes the tensor)."""
    a = t._storage.array
    if t.size == 0:
        return np.empty(t.shape, a.dtype)
    # (np.ndarray over the storage's buffer: the same view as as_strided, several times cheaper,
    # which counts at ~140 views a decode step)
    return np.ndarray(t.shape, a.dtype, a, t._offset * a.itemsize, tuple(s * a.itemsize for s in t._strides))


class CpuGraph:
    """The CPU's graph: the ops `fn` made while it was captured, as a plan of steps (one per op),
    each a function of no arguments over the numpy arrays of its inputs and output, resolved at
    capture time. A replay runs the steps in order: no validation, no Tensors, no views, the
    results written in place into the arrays of the tensors fn returned (and of its intermediates)."""

    def __init__(self, steps: list[Callable[[], Any]], names: list[str], outputs: Any):
        self.steps: list[Callable[[], Any]] | None = steps  # (None once released)
        self.names, self.outputs = names, outputs
        self._lock = threading.Lock()  # (its intermediates are shared: one replay at a time)

    @property
    def n_dispatches(self) -> int:
        return 0 if self.steps is None else len(self.steps)  # (released: none, as the WebGPU graph's)

    def replay(self, times: int = 1) -> Any:
        times = replay_times(times)
        with self._lock:
            steps = self.steps
            if steps is None:
                raise GraphCaptureError("this graph was released")
            for _ in range(times):
                for step in steps:
                    step()
        return self.outputs

    def release(self) -> None:
        self.steps, self.outputs = None, None


class _Recording(threading.local):
    """The plan being captured on this thread (None when none is): other threads run eagerly."""

    steps: list[Callable[[], Any]] | None = None
    names: list[str] | None = None


def _no_capture(rec: _Recording, what: str) -> None:
    if rec.steps is not None:
        raise GraphCaptureError(f"{what} while a graph is being captured: a graph replays device work only; "
                                "write its inputs and read its outputs between replays")


_DTYPES: dict[Any, Any] = {}  # numpy dtype -> webtensor DType, and "Tensor" -> the Tensor class (CpuBackend._wrap)


class CpuBackend:
    """The numpy reference device (see backends/base.py for the protocol).

    Every op goes through `_op` (a result) or `_inplace` (a write into existing tensors). Eagerly
    they run the reference function now. While `capture` records, nothing runs (as on WebGPU):
    a result gets an empty array of its shape and dtype, and the op is appended to the plan as a
    step that computes into that array, over the input arrays resolved now."""

    name = "cpu"
    kmajor_weights = False  # matrices as the checkpoint has them
    widens_f16 = True  # numpy's float16 products have no BLAS: operands are widened to float32 each call
    host_memory = True  # tensors live in host memory (reading them is free)

    def __init__(self) -> None:
        self._rec = _Recording()

    def _wrap(self, device: Any, arr: np.ndarray) -> Any:
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
            arr = arr.copy(order="C")
        dtype = _DTYPES.get(arr.dtype)
        if dtype is None:  # (imports and dtype lookups cached: a decode step wraps ~30 results)
            from ..dtypes import as_dtype
            from ..tensor import Tensor

            dtype = _DTYPES[arr.dtype] = as_dtype(arr.dtype)
            _DTYPES["Tensor"] = Tensor
        return _DTYPES["Tensor"](device, arr.shape, dtype, storage=CpuStorage(arr.reshape(-1)))

    def _op(self, name: str, device: Any, shape: tuple[int, ...], dtype: Any, compute: Callable[[], np.ndarray],
            into: Callable[[np.ndarray], Callable[[], None] | None] | None = None) -> Any:
        """A result tensor of (shape, dtype): `compute()`'s array, eagerly. While capturing, an empty
        array `out` and a step: `into(out)` (an in-place form, bit for bit compute's numbers) where
        given and not None, else one writing `compute()` into `out`."""
        rec = self._rec
        if rec.steps is None:
            return self._wrap(device, compute())
        out = np.empty(shape, dtype)
        step = None if into is None else into(out)
        if step is None:
            def step() -> None:
                np.copyto(out, compute(), casting="no")
        rec.steps.append(step)
        rec.names.append(name)  # type: ignore[union-attr]
        return self._wrap(device, out)

    def _inplace(self, name: str, run: Callable[[], None],
                 plan: Callable[[], Callable[[], None]] | None = None) -> None:
        """An op that writes into existing tensors: `run()` now, or appended to the plan being
        captured (`plan()`'s step where given: a faster form of run, the same writes)."""
        rec = self._rec
        if rec.steps is None:
            run()
        else:
            rec.steps.append(run if plan is None else plan())
            rec.names.append(name)  # type: ignore[union-attr]

    def _constant(self, device: Any, arr: np.ndarray) -> Any:
        """A new tensor holding `arr` (owned). Made while capturing, it is written again by every
        replay, as running fn again would make it afresh (fn may write into it)."""
        t = self._wrap(device, arr)
        if self._rec.steps is not None:
            out, saved = view(t), arr.copy()
            self._inplace("constant", lambda: np.copyto(out, saved))
        return t

    def from_numpy(self, device: Any, arr: np.ndarray, owned: bool, done: Callable[[int, int], None] | None = None
                   ) -> Any:
        """`arr` as a tensor: kept as it is when `owned` (a fresh array nobody else holds), else copied."""
        t = self._constant(device, arr if owned else arr.copy())
        if done is not None and not owned:
            done(0, arr.nbytes)
        return t

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, device: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._wrap(device, np.empty(shape, dtype.name))

    def zeros(self, device: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._constant(device, np.zeros(shape, dtype.name))

    def from_bytes(self, device: Any, shape: tuple[int, ...], dtype: Any, data: memoryview) -> Any:
        return self._constant(device, np.frombuffer(data, dtype.name).reshape(shape).copy())

    def to_bytes(self, t: Any) -> bytes:
        _no_capture(self._rec, "a readback")
        return np.ascontiguousarray(view(t)).tobytes()

    def to_numpy(self, t: Any) -> np.ndarray:
        _no_capture(self._rec, "a readback")
        return np.array(view(t))

    def upload_into(self, t: Any, data: bytes) -> None:
        _no_capture(self._rec, "an upload into an existing tensor")
        view(t)[...] = np.frombuffer(data, t.dtype.name).reshape(t.shape)

    def read_async(self, t: Any) -> Any:
        data = self.to_bytes(t)
        return _Ready(data)

    # -- ops ------------------------------------------------------------------------------------
    def binary(self, op: str, a: Any, b: Any, shape: tuple[int, ...], out_dtype: Any) -> Any:
        fn = {"add": add, "sub": sub, "mul": mul, "div": div}[op]
        av, bv, dtype = view(a), view(b), out_dtype.name
        return self._op(op, a.device, shape, dtype, lambda: fn(av, bv, dtype))

    def gelu(self, x: Any) -> Any:
        xa = view(x)

        def into(out: np.ndarray) -> Callable[[], None] | None:
            if out.dtype != F32:
                return None
            g = _gelu_step(out)

            def step() -> None:
                np.copyto(out, xa)
                g()
            return step
        return self._op("gelu", x.device, x.shape, xa.dtype, lambda: gelu(xa), into)

    def swiglu(self, gate: Any, up: Any, out_dtype: Any) -> Any:
        ga, ua, dtype = view(gate), view(up), out_dtype.name
        fast = ga.dtype == ua.dtype == F32
        return self._op("swiglu", gate.device, gate.shape, dtype, lambda: swiglu(ga, ua, dtype),
                        (lambda out: _swiglu_step(out, ga, ua)) if fast else None)

    def geglu(self, gate: Any, up: Any, out_dtype: Any) -> Any:
        ga, ua, dtype = view(gate), view(up), out_dtype.name
        fast = ga.dtype == ua.dtype == F32
        return self._op("geglu", gate.device, gate.shape, dtype, lambda: geglu(ga, ua, dtype),
                        (lambda out: _geglu_step(out, ga, ua)) if fast else None)

    def softcap(self, x: Any, cap: float) -> Any:
        xa = view(x)
        return self._op("softcap", x.device, x.shape, xa.dtype, lambda: softcap(xa, cap))

    def cast(self, x: Any, dtype: Any) -> Any:
        xa, name = view(x), dtype.name
        return self._op("cast", x.device, x.shape, name, lambda: cast(xa, name))

    def copy(self, x: Any) -> Any:
        xa = view(x)
        return self._op("copy", x.device, x.shape, xa.dtype, xa.copy, lambda out: lambda: np.copyto(out, xa))

    def copy_into(self, dst: Any, src: Any) -> None:
        d, s = view(dst), view(src)

        def run() -> None:
            d[...] = s.astype(d.dtype)  # (numpy handles overlapping views by buffering)
        self._inplace("copy_into", run)

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        xa, wa, ba = view(x), view(w), view(b)
        fast = xa.dtype == wa.dtype == ba.dtype == F32 and xa.flags.c_contiguous
        return self._op("layer_norm", x.device, x.shape, xa.dtype, lambda: layer_norm(xa, wa, ba, eps),
                        (lambda out: _layer_norm_step(out, xa, wa, ba, eps)) if fast else None)

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        xa, wa = view(x), view(w)
        fast = xa.dtype == wa.dtype == F32 and xa.flags.c_contiguous
        return self._op("rms_norm", x.device, x.shape, xa.dtype, lambda: rms_norm(xa, wa, eps),
                        (lambda out: _rms_norm_step(out, xa, wa, eps)) if fast else None)

    def rope(self, x: Any, pos: Any, cos: Any, sin: Any, interleaved: bool) -> Any:
        xa, pa, ca, sa = view(x), view(pos), view(cos), view(sin)

        def compute() -> np.ndarray:
            _check_positions(pa, ca.shape[0])
            return rope(xa, pa, ca, sa, interleaved)
        fast = xa.dtype == F32
        return self._op("rope", x.device, x.shape, xa.dtype, compute,
                        (lambda out: _rope_step(out, xa, pa, ca, sa, interleaved)) if fast else None)

    def _rope_stored(self, x: Any, pos: Any, n_ctx: int, cos: Any, sin: Any, interleaved: bool) -> Any:
        """`rope` of the rows a cache_write stores (positions 0 .. n_ctx - 1; the others, which it skips,
        are rotated by position 0 and their positions not checked against the tables: as the kernel)."""
        xa, pa, ca, sa = view(x), view(pos), view(cos), view(sin)
        kept = np.empty_like(pa)

        def positions() -> None:
            np.copyto(kept, pa)
            kept[(pa < 0) | (pa >= n_ctx)] = 0

        def compute() -> np.ndarray:
            positions()
            _check_positions(kept, ca.shape[0])
            return rope(xa, kept, ca, sa, interleaved)

        def into(out: np.ndarray) -> Callable[[], None]:
            rows = _rope_step(out, xa, kept, ca, sa, interleaved)

            def step() -> None:
                positions()
                rows()
            return step
        return self._op("rope", x.device, x.shape, xa.dtype, compute, into if xa.dtype == F32 else None)

    def softmax(self, x: Any) -> Any:
        xa = view(x)
        return self._op("softmax", x.device, x.shape, xa.dtype, lambda: softmax(xa))

    def argmax(self, x: Any) -> Any:
        xa = view(x)
        return self._op("argmax", x.device, x.shape[:-1], np.int32, lambda: argmax(xa))

    def token_mask(self, x: Any, bits: Any) -> Any:
        xa, ba = view(x), view(bits)
        return self._op("token_mask", x.device, x.shape, xa.dtype, lambda: token_mask(xa, ba))

    def matmul(self, a: Any, b: Any, out_dtype: Any) -> Any:
        av, bv, dtype = view(a), view(b), out_dtype.name
        return self._op("matmul", a.device, a.shape[:-1] + b.shape[-1:], dtype, lambda: matmul(av, bv, dtype))

    def linear(self, x: Any, w: Any, bias: Any, act: str | None, residual: Any, ln: Any, out_dtype: Any,
               rms: Any = None, glu: str | None = None) -> Any:
        xa, wa, dtype = view(x), view(w), out_dtype.name
        ba = None if bias is None else view(bias)
        ra = None if residual is None else view(residual)
        lna = None if ln is None else (view(ln[0]), view(ln[1]), ln[2])
        rmsa = None if rms is None else (view(rms[0]), rms[1])

        def compute() -> np.ndarray:
            return linear(_normed(xa, lna, rmsa, glu), wa, ba, act, ra, dtype)
        return self._op("linear", x.device, x.shape[:-1] + w.shape[-1:], dtype, compute,
                        lambda out: _linear_step(out, xa, wa, ba, act, ra, lna, rmsa, glu))

    def quant_linear(self, x: Any, w: Any, bias: Any, act: str | None, residual: Any, ln: Any,
                     rms: Any = None, glu: str | None = None) -> Any:
        _host_weight("linear", w, "the input")
        xa = view(x)
        ba = None if bias is None else view(bias)
        ra = None if residual is None else view(residual)
        lna = None if ln is None else (view(ln[0]), view(ln[1]), ln[2])
        rmsa = None if rms is None else (view(rms[0]), rms[1])

        def compute() -> np.ndarray:
            return quant_linear(_normed(xa, lna, rmsa, glu), w, ba, act, ra)
        return self._op("quant_linear", x.device, x.shape[:-1] + (w.shape[0],), F32, compute)

    def quant_embedding(self, table: Any, ids: Any) -> Any:
        _host_weight("embedding", table, "the ids")
        idx = view(ids)

        def compute() -> np.ndarray:
            _check_ids(idx, table.shape[0])
            rows: np.ndarray = table.dequantize(idx.reshape(-1))  # float32 (ids, C)
            return rows.reshape(*idx.shape, table.shape[1])
        return self._op("quant_embedding", ids.device, ids.shape + (table.shape[1],), F32, compute)

    def moe_route(self, logits: Any, k: int, normalize: bool) -> Any:
        la = view(logits)
        T = logits.shape[0]
        out: list[np.ndarray] = []

        def route() -> np.ndarray:  # (the pair computed once, by the weights' step; the ids' step takes its half)
            out[:] = moe_route(la, k, normalize)
            return out[0]
        weights = self._op("moe_route", logits.device, (T, k), F32, route)
        ids = self._op("moe_route_ids", logits.device, (T, k), np.int32, lambda: out[1])
        return weights, ids

    def expert_linear(self, x: Any, experts: Any, ids: Any, n_experts: int, invariant: bool = True) -> Any:
        # (one-row products either way: the reference's numbers are the same for every `invariant`)
        xa, ia = view(x), view(ids)
        if isinstance(experts, Quantized):
            _host_weight("expert_linear", experts, "the input")
        kn = experts_kn(experts)
        T, k = ids.shape
        return self._op("expert_linear", x.device, (T, k, experts.shape[0] // n_experts), F32,
                        lambda: expert_linear(xa, kn, ia, n_experts))

    def attention(self, q: Any, k: Any, v: Any, causal: bool, scale: float, window: int | None = None,
                  softcap: float | None = None) -> Any:
        qa, ka, va = view(q), view(k), view(v)
        return self._op("attention", q.device, q.shape, qa.dtype,
                        lambda: attention(qa, ka, va, causal, scale, window, softcap))

    def embedding(self, table: Any, ids: Any) -> Any:
        ta, idx = view(table), view(ids)

        def compute() -> np.ndarray:
            _check_ids(idx, ta.shape[0])
            return embedding(ta, idx)
        return self._op("embedding", table.device, ids.shape + ta.shape[1:], ta.dtype, compute)

    def cache_write(self, cache: Any, src: Any, pos: Any, slot: Any, rope: Any = None, table: Any = None) -> None:
        if rope is not None:  # the reference of the fused form: rope of the rows it stores, then the store
            src = self._rope_stored(src, pos, cache.shape[1] * (1 if table is None else table.shape[1]), *rope)
        c, s, p, sl = view(cache), view(src), view(pos), view(slot)
        tb = None if table is None else view(table)
        self._inplace("cache_write", lambda: cache_write(c, s, p, sl, tb))

    def cached_attention(self, q: Any, kc: Any, vc: Any, pos: Any, slot: Any, scale: float,
                         k_new: Any = None, v_new: Any = None, rope: Any = None, table: Any = None,
                         window: int | None = None, softcap: float | None = None) -> Any:
        if rope is not None:  # the reference of the fused form: q and the new key rotated first
            q = self.rope(q, pos, *rope)
            k_new = None if k_new is None else self.rope(k_new, pos, *rope)
        if k_new is not None:
            self.cache_write(kc, k_new, pos, slot, table=table)
            self.cache_write(vc, v_new, pos, slot, table=table)
        qa, ka, va, p, sl = view(q), view(kc), view(vc), view(pos), view(slot)
        tb = None if table is None else view(table)

        def into(out: np.ndarray) -> Callable[[], None] | None:
            if qa.dtype != F32:
                return None
            return lambda: _attend(out, qa, ka, va, p, sl, scale, tb, window, softcap)
        return self._op("cached_attention", q.device, q.shape, F32,
                        lambda: cached_attention(qa, ka, va, p, sl, scale, tb, window, softcap), into)

    def cache_gather(self, cache: Any, slot: int, n: int, head_dim: int, table: Any = None) -> Any:
        c = view(cache)
        tb = None if table is None else view(table)
        return self._op("cache_gather", cache.device, (n, cache.shape[2], head_dim), F32,
                        lambda: cache_gather(c, slot, n, head_dim, tb))

    def chunk_attention(self, q: Any, kc: Any, vc: Any, pos: Any, slot: Any, scale: float, table: Any = None,
                        window: int | None = None, softcap: float | None = None) -> Any:
        qa, ka, va, p, sl = view(q), view(kc), view(vc), view(pos), view(slot)
        tb = None if table is None else view(table)
        return self._op("chunk_attention", q.device, q.shape, F32,
                        lambda: chunk_attention(qa, ka, va, p, sl, scale, tb, window, softcap))

    def advance_tokens(self, new: Any, ids: Any, pos: Any, tokens: Any, count: Any) -> None:
        n, i, p, t, c = view(new), view(ids), view(pos), view(tokens), view(count)
        self._inplace("advance_tokens", lambda: advance_tokens(n, i, p, t, c))

    # -- execution ------------------------------------------------------------------------------
    def scope(self) -> Any:
        return contextlib.nullcontext()

    def capture(self, fn: Any) -> CpuGraph:
        """Record fn's ops as a plan (nothing runs: see the class docstring); uploads into existing
        tensors and readbacks inside fn are refused (GraphCaptureError), as on WebGPU."""
        rec = self._rec
        if rec.steps is not None:
            raise GraphCaptureError("a graph is already being captured on this device")
        rec.steps, rec.names = [], []
        try:
            outputs = fn()
            return CpuGraph(rec.steps, rec.names, outputs)
        finally:
            rec.steps = rec.names = None

    def synchronize(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return dict(dispatches=0, submits=0, readbacks=0, bytes_uploaded=0, bytes_read=0, bytes_in_use=0)

    def describe(self) -> str:
        return "CPU (reference)"

    def max_binding_bytes(self) -> int:
        return 2**63 - 1

    def has_f16(self) -> bool:
        return True

    def memory_bytes(self) -> int | None:
        import os

        try:  # (the host's RAM: the CPU device's arrays live there)
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            return None

    def has_subgroups(self) -> bool:
        return False

    def same_as(self, other: Any) -> bool:
        return isinstance(other, CpuBackend)

    def empty_cache(self) -> None:
        pass

    def release(self) -> None:
        pass


class _Ready:
    """A readback that is already complete (the CPU's answer to WebGPU's read_async)."""

    def __init__(self, data: bytes):
        self.data = data

    def wait(self) -> memoryview:
        return memoryview(self.data)
