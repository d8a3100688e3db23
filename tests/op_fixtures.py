"""Helpers the op parity tests share: random float32 inputs, tensors of them on a device, random quantized weights
of every type, a spy on the kernel the quantized linear picks (and the one the policy should pick), and a KV-cache
append followed by cached attention
(the append fused into the attention, or written first with cache_write)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import webtensor as wt


def rnd(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard normal float32 values of `shape` (times `scale`) from `seed`."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def on(dev: wt.Device, *arrays: np.ndarray) -> list[wt.Tensor]:
    return [wt.tensor(a, device=dev) for a in arrays]


def quant_weight(rng: np.random.Generator, qtype: str, n: int, k: int) -> Any:
    """A QuantWeight (n, k): quantized from normal floats (with an all-zero block) for the 32-value types,
    random blocks with finite scales of about 2^-7 for the K-quants."""
    from webtensor import quant

    if qtype in quant.QUANTIZABLE:
        w = rng.standard_normal((n, k)).astype(np.float32)
        if n > 1 and k >= 64:
            w[1, 32:64] = 0
        return quant.quantize(w, qtype)
    return quant.random_weight(qtype, (n, k), rng, -7)


def quant_linear_case(rng: np.random.Generator, qtype: str, M: int, N: int, blocks: int, has_bias: bool,
                      has_res: bool) -> tuple[Any, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A quantized linear's operands: W (N, K) of `blocks` whole `qtype` blocks a row (`quant_weight`), rows x
    (M, K), a bias (N,) and a residual (M, N) where asked (else None), standard normal float32."""
    from webtensor import quant

    K = blocks * quant.TYPES[qtype].values
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if has_bias else None
    r = rng.standard_normal((M, N)).astype(np.float32) if has_res else None
    return qw, x, b, r


def spy_kernels(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """The quantized-linear kernels picked from now on, as (which, MR, prologue) in order (prologue: the norm's
    code, 3 for the SwiGLU one)."""
    from webtensor.backends.wgpu import quant_ops

    ran: list[tuple[str, int, int]] = []
    pick = quant_ops.kernel_for

    def spy(ctx: Any, qtype: str, M: int, K: int, norm: int = 0, stack: bool = False,
            glu: bool = False) -> tuple[Any, str, int, int]:
        k, which, mr, nr = pick(ctx, qtype, M, K, norm, stack, glu=glu)
        ran.append((which, mr, 3 if glu else norm))
        return k, which, mr, nr

    monkeypatch.setattr(quant_ops, "kernel_for", spy)
    return ran


def expected_kernel(dev: wt.Device, M: int, gpu_style: bool) -> str:
    """The quantized-linear kernel the policy should pick for M rows: GEMV up to gemv_max_rows, then the matrix
    engine (GPU-style, or a hardware adapter; matmul_quant's plain tiles where the policy turns the engine off)
    or the register-blocked one (a software adapter's CPU-style)."""
    if M <= dev.kernel_policy.gemv_max_rows:
        return "gemv"
    if gpu_style or not dev.ctx.info.is_software:
        return "engine" if dev.kernel_policy.engine else "tiled"
    return "regs"


def append_and_attend(q: wt.Tensor, k_cache: wt.Tensor, v_cache: wt.Tensor, pos: wt.Tensor, slot: wt.Tensor,
                      k: wt.Tensor, v: wt.Tensor, scale: float, fused: bool) -> wt.Tensor:
    """Row t's k, v appended to slot[t]'s caches at pos[t], then cached attention of q over them: the append fused
    into cached_attention (`fused`), or written first by cache_write."""
    if fused:
        return wt.cached_attention(q, k_cache, v_cache, pos, slot, scale=scale, k_new=k, v_new=v)
    wt.cache_write(k_cache, k, pos, slot)
    wt.cache_write(v_cache, v, pos, slot)
    return wt.cached_attention(q, k_cache, v_cache, pos, slot, scale=scale)
