"""Parity of the GPU prefill kernels against float64 numpy: matmul_engine.wgsl (every workgroup
tile, k-major and n-major B, the fused epilogue, row-chunked weights; float32; float16 x float16
read as u32 words or as vec4<f16>, with f32 tiles and FMAs, f16 tiles and f32 FMAs, or packed f16
FMAs; float32 x float16 and float16 x float32, GPT-2 in float16's activations x weights) and
attention_prefill.wgsl (float32 / float16, head dims 16..128, causal or not, T from 1 to 300, with
and without subgroups). Split-K (engine slices, then matmul_splitk_sum)
is checked against numpy like the engine. On CPU adapters (lavapipe) the tests ask for the GPU kernel variants
explicitly; each test checks that the kernel under test really ran.

Bounds: float32 and mixed float32 / float16 operands (f32 output), norm-wise relative error
<= 1e-5 with tolerance.py's floor of |A| @ |B| (+ |bias| + |residual|). float16 matmul (f16
output), element-wise, u = 2^-11:
|c - c_ref| <= u |c_ref| + g (|A| @ |B|) + 1e-6, where g = K 2^-24 with f32 FMAs (products of
halves are exact in f32, so only the f32 sum and the output's rounding err) and g = BK u with
packed f16 FMAs (the f16 accumulation of one BK = 16 step, worst case; the f32 sums across steps
add ~K/BK 2^-24). float16 attention (f32 arithmetic, f16 inputs and output): norm-wise relative
error <= 1e-3. Attention: tolerance.attention_scale's floor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tolerance import assert_close, attention_scale, linear_scale

import webtensor as wt
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu.policy import KernelPolicy

# the fixtures are set once per test (counters are read as differences), not per example
SETTINGS = settings(max_examples=6, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
U16 = 2.0 ** -11
H200 = KernelPolicy(gpu_style=True, compute_units=132)  # the rule's numbers as measured there
BK16 = 16  # matmul_engine's K step for float16 operands: the span of one f16 accumulation
TILES = [(1, 1), (1, 2), (2, 1), (2, 2)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, gpu: wt.Device, gpu_small: wt.Device) -> dict[str, int]:
    """Run the GPU kernel variants on any adapter and count the engine / prefill launches."""
    from webtensor.backends.wgpu.context import WgpuContext

    # (the H200's numbers: H200 below)
    set_policy(monkeypatch, gpu, gpu_small, gpu_style=True, compute_units=132)
    seen = {"engine": 0, "prefill": 0, "splitk": 0, "tiled": 0}
    launch = WgpuContext.launch

    def counted(self: WgpuContext, kernel: Any, *args: Any) -> None:
        stem = kernel.name.split("-")[0]
        key = {"matmul_engine": "engine", "attention_prefill": "prefill", "matmul_splitk_sum": "splitk",
               "attention_tiled": "tiled"}.get(stem)
        if key is not None:
            seen[key] += 1
        launch(self, kernel, *args)

    monkeypatch.setattr(WgpuContext, "launch", counted)
    return seen


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def pad4(n: int) -> int:
    return (n + 3) // 4 * 4


def operands(dev: wt.Device, seed: int, M: int, K: int, N: int, kmajor: bool, dtype: str, b_dtype: str | None = None
             ) -> tuple[wt.Tensor, wt.Tensor, np.ndarray, np.ndarray]:
    """A (M, K) `dtype` and B (K, N) `b_dtype` (default: dtype) as device views whose rows are
    4-aligned (padded storage, as the engine needs), B k-major (stored (N, K), the layout GPT-2's
    weights have on WebGPU) or n-major; and the same values as numpy arrays."""
    rng = np.random.default_rng(seed)
    b_dtype = b_dtype or dtype

    def cols(x: np.ndarray, n: int) -> wt.Tensor:  # (row-chunked tensors cannot be sliced: only pads)
        t = wt.tensor(x, device=dev)
        return t if x.shape[1] == n else t[:, :n]

    a_store = rng.standard_normal((M, pad4(K))).astype(dtype)
    if kmajor:
        b_store = rng.standard_normal((N, pad4(K))).astype(b_dtype)
        b, b_np = cols(b_store, K).T, b_store[:, :K].T
    else:
        b_store = rng.standard_normal((K, pad4(N))).astype(b_dtype)
        b, b_np = cols(b_store, N), b_store[:, :N]
    return cols(a_store, K), b, a_store[:, :K], b_np


def linear_ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, act: bool, res: np.ndarray | None) -> np.ndarray:
    c = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        c = c + bias
    if act:
        c = gelu(c)
    return c + res if res is not None else c


def run_linear(gpu: wt.Device, seed: int, M: int, K: int, N: int, kmajor: bool, dtype: str, epi: int,
               b_dtype: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Engine output, float64 reference, and |A| @ |B| + |bias| + |residual| (the magnitude each output
    sums: tolerance.linear_scale); epi bits: 1 bias, 2 GELU, 4 residual (bias and residual in the
    output's dtype: float32 unless both are float16)."""
    a, b, a_np, b_np = operands(gpu, seed, M, K, N, kmajor, dtype, b_dtype)
    out_dtype = dtype if dtype == (b_dtype or dtype) else "float32"
    rng = np.random.default_rng(seed + 7)
    bias = rng.standard_normal(N).astype(out_dtype) if epi & 1 else None
    res = rng.standard_normal((M, N)).astype(out_dtype) if epi & 4 else None
    got = wt.linear(a, b, None if bias is None else wt.tensor(bias, device=gpu), "gelu" if epi & 2 else None,
                    None if res is None else wt.tensor(res, device=gpu)).numpy()
    want = linear_ref(a_np, b_np, bias, bool(epi & 2), res)
    return got, want, linear_scale(a_np, b_np, bias, res), a_np


dims = st.integers(2, 150)


# every tile with k-major B (the weights' layout), the smallest and largest with n-major B
@pytest.mark.parametrize(("tile", "kmajor"), [(t, True) for t in TILES] + [((1, 1), False), ((2, 2), False)])
@SETTINGS
@given(seed=st.integers(0, 2**31), M=dims, K=st.integers(1, 70), N=dims, epi=st.integers(0, 7))
def test_engine_float32(gpu, calls, monkeypatch, tile, kmajor, seed, M, K, N, epi):
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: tile)
    M = max(M, gpu.kernel_policy.gemv_max_rows + 1)  # fewer rows go to the GEMV
    before = calls["engine"]
    got, want, mag, _ = run_linear(gpu, seed, M, K, N, kmajor, "float32", epi)
    assert calls["engine"] == before + 1
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert_close(got, want, mag)


@pytest.mark.parametrize("tile", TILES)
@settings(SETTINGS, max_examples=4)
@given(seed=st.integers(0, 2**31), M=dims, K=st.integers(1, 100), N=dims, epi=st.integers(0, 7),
       b_dtype=st.sampled_from(["float32", "float16"]))
def test_engine_k_steps_of_16(gpu, calls, monkeypatch, tile, seed, M, K, N, epi, b_dtype):
    """f32 tiles 16 deep (policy.engine_bk = 16: 16 to 32 KiB of workgroup memory, which lavapipe has):
    float32 activations x float32 or float16 weights."""
    if b_dtype == "float16" and not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: tile)
    set_policy(monkeypatch, gpu, engine_bk=16)
    assert gops.engine_bk(gpu.ctx, tile) == 16
    M = max(M, gpu.kernel_policy.gemv_max_rows + 1)
    before = calls["engine"]
    got, want, mag, _ = run_linear(gpu, seed, M, K, N, True, "float32", epi, b_dtype=b_dtype)
    assert calls["engine"] == before + 1 and got.dtype == np.float32
    assert_close(got, want, mag)


def test_engine_k_step_within_the_device_limit():
    """engine_bk = 16 only where the device's workgroup memory holds the tiles at that depth."""
    from types import SimpleNamespace

    def ctx(limit: int, bk: int = 16) -> Any:
        return SimpleNamespace(policy=H200.replace(engine_bk=bk), workgroup_limit=limit)

    assert [gops.engine_bk(ctx(16384), t) for t in TILES] == [16, 8, 8, 8]  # WebGPU's default: 16 KiB
    assert [gops.engine_bk(ctx(32768), t) for t in TILES] == [16, 16, 16, 16]
    assert [gops.engine_bk(ctx(24576), t) for t in TILES] == [16, 16, 16, 8]
    assert [gops.engine_bk(ctx(49152, 8), t) for t in TILES] == [8, 8, 8, 8]
    with pytest.raises(ValueError, match="engine_bk must be 8 or 16"):
        H200.replace(engine_bk=32)


F16_CASES = [  # (tile, k-major B, u32-word loads, float16 arithmetic); the largest tile compiles slowly on lavapipe
    ((1, 1), True, True, "f32"), ((1, 1), False, True, "f32"), ((2, 2), True, True, "f32"),  # the default
    ((1, 1), True, True, "f16"), ((1, 1), False, True, "chunked"), ((1, 2), True, True, "chunked"),
    ((1, 1), True, False, "f32"), ((1, 1), False, False, "f16"), ((1, 1), True, False, "chunked"),
    ((2, 2), True, False, "chunked"),
]


@pytest.mark.parametrize(("tile", "kmajor", "words", "math"), F16_CASES)
@SETTINGS
@given(seed=st.integers(0, 2**31), M=dims, K=st.integers(1, 100), N=dims, epi=st.sampled_from([0, 1, 7]))
def test_engine_float16(gpu, calls, monkeypatch, tile, kmajor, words, math, seed, M, K, N, epi):
    if not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: tile)
    set_policy(monkeypatch, gpu, engine_f16_words=words)
    set_policy(monkeypatch, gpu, engine_f16_math=math)
    M = max(M, gpu.kernel_policy.gemv_max_rows + 1)
    before = calls["engine"]
    got, want, mag, _ = run_linear(gpu, seed, M, K, N, kmajor, "float16", epi & 1)  # bias only: bound stays linear
    assert calls["engine"] == before + 1 and got.dtype == np.float16
    g = BK16 * U16 if math == "chunked" else K * 2.0 ** -24
    bound = U16 * np.abs(want) + g * mag + 1e-6
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound)
    assert_close(got, want, rtol=2e-3)  # (and typically far inside the bound; 18 outputs or more: no floor)


# float32 activations x float16 weights (GPT-2 in float16), and the reverse; every epilogue
@pytest.mark.parametrize(("dtypes", "kmajor", "words"), [(("float32", "float16"), True, True),
                                                         (("float32", "float16"), False, True),
                                                         (("float32", "float16"), True, False),
                                                         (("float16", "float32"), True, True)])
@SETTINGS
@given(seed=st.integers(0, 2**31), M=dims, K=st.integers(1, 70), N=dims, epi=st.integers(0, 7))
def test_engine_mixed(gpu, calls, monkeypatch, dtypes, kmajor, words, seed, M, K, N, epi):
    if not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: (1, 1))
    set_policy(monkeypatch, gpu, engine_f16_words=words)
    set_policy(monkeypatch, gpu, engine_f16_math="chunked")  # (applies to float16 x float16 only)
    M = max(M, gpu.kernel_policy.gemv_max_rows + 1)
    before = calls["engine"]
    got, want, mag, _ = run_linear(gpu, seed, M, K, N, kmajor, dtypes[0], epi, b_dtype=dtypes[1])
    assert calls["engine"] == before + 1
    assert got.dtype == np.float32 and got.shape == (M, N)
    assert_close(got, want, mag)


def test_engine_f16_math_checked(gpu):
    """A kernel policy names one of the engine's float16 arithmetics, or is refused when made."""
    with pytest.raises(ValueError, match="engine_f16_math must be one of"):
        gpu.kernel_policy.replace(engine_f16_math="bf16")
    with pytest.raises(ValueError, match="no field"):
        gpu.kernel_policy.replace(engine_f16_maths="f32")
    assert gpu.kernel_policy.replace(engine_f16_math="chunked").engine_f16_math == "chunked"


@pytest.mark.parametrize(("dtype", "kmajor", "K"), [("float32", True, 72), ("float32", False, 600),
                                                    ("float16", True, 72), ("float16", True, 80),
                                                    ("float16", False, 600)])
def test_engine_row_chunked_weights(gpu_small, calls, dtype, kmajor, K):
    """Weights over the binding limit (64 KiB here) live in row chunks: k-major chunks fill column
    blocks of C, n-major chunks are partial sums over K (the epilogue runs on the last one). In
    float16 the k-major chunks are 455 (K = 72) or 409 (K = 80) columns wide: blocks starting on an
    even column write u32 words and end in a word only half theirs, blocks starting on an odd one
    write halves; the n-major partial sums read the words back."""
    if dtype == "float16" and not gpu_small.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    M, N = (20, 300 if dtype == "float32" else 1000) if kmajor else (10, 64)
    stored = (N, pad4(K)) if kmajor else (K, pad4(N))
    n_chunks = len(wt.tensor(np.zeros(stored, dtype), device=gpu_small)._storage.chunks)
    assert n_chunks > 1
    got, want, mag, _ = run_linear(gpu_small, 3, M, K, N, kmajor, dtype, 7 if dtype == "float32" else 5)
    assert calls["engine"] == n_chunks  # one launch per chunk
    if dtype == "float32":
        assert_close(got, want, mag)
    else:  # (the n-major partial sums are rounded to float16 between chunks)
        bound = U16 * np.abs(want) + (n_chunks * U16 + K * 2.0 ** -24) * mag + 1e-6
        assert np.all(np.abs(got.astype(np.float64) - want) <= bound)


def test_engine_float16_words_keep_the_other_half(gpu, calls):
    """A float16 output written as u32 words with N odd and an even row stride: each row's last
    word is half in range, and its other half (column N, outside the product) keeps its bits."""
    if not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    M, K, N, ldc = 20, 16, 37, 40
    rng = np.random.default_rng(4)
    a_np, b_np = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((N, K)).astype(np.float16)
    a, b = wt.tensor(a_np, device=gpu), wt.tensor(b_np, device=gpu)
    out = wt.tensor(np.full((M, ldc), -3.5, np.float16), device=gpu)
    f16 = wt.float16
    k = gops.engine_kernel(gpu.ctx, f16, f16, f16, f16, True, (1, 1), even_out=True)
    gpu.ctx.launch(k, dict(M=M, N=N, K=K, a_off4=0, lda4=K // 4, b_off4=0, ldb4=K // 4, c_off=0, ldc=ldc),
                   dict(a=gops._buf(a), b=gops._buf(b), c=gops._buf(out)), (1, 1, 1))
    got = out.numpy()
    assert np.all(got[:, N:] == np.float16(-3.5))
    want = a_np.astype(np.float64) @ b_np.astype(np.float64).T
    assert np.all(np.abs(got[:, :N] - want) <= U16 * np.abs(want) + K * 2.0 ** -24 * (np.abs(a_np) @ np.abs(b_np).T)
                  + 1e-6)


def test_engine_tile_choice():
    """The tile rule (ops.engine_tile; measured by tools/h200/engine_sweep.py): 128 x 64 from 256 rows,
    64-row tiles below (64 x 128 where that grid has 2 workgroups an SM)."""
    assert gops.engine_tile(4096, 3072, H200) == (2, 1)
    assert gops.engine_tile(1023, 2304, H200) == (2, 1)
    assert gops.engine_tile(16, 768, H200) == (1, 1)
    assert gops.engine_tile(64, 50257, H200) == (1, 2)  # a 64-row step's LM head: 393 workgroups of 64 x 128
    assert gops.engine_tile(128, 50257, H200) == (1, 1) and gops.engine_tile(192, 50257, H200) == (1, 1)
    assert gops.engine_tile(300, 768, H200) == (1, 1)  # 128-row tiles would pad 84 rows (> 300 / 8)
    assert gops.engine_tile(4160, 3072, H200) == (2, 1)
    for m, n in [(2, 5), (300, 300), (4096, 50257)]:
        mt, nt = gops.engine_tile(m, n, H200)
        assert mt in (1, 2) and nt in (1, 2)


SPLIT_CASES = [  # (A dtype, B dtype, k-major B, tile, float16 arithmetic)
    ("float32", "float32", True, (1, 1), "f32"), ("float32", "float32", False, (1, 1), "f32"),
    ("float32", "float32", True, (2, 2), "f32"), ("float32", "float16", True, (1, 2), "f32"),
    ("float16", "float16", True, (1, 1), "f32"), ("float16", "float16", False, (1, 1), "chunked"),
]


@pytest.mark.parametrize(("a_dtype", "b_dtype", "kmajor", "tile", "math"), SPLIT_CASES)
@settings(SETTINGS, max_examples=4)
@given(seed=st.integers(0, 2**31), M=dims, K=st.integers(64, 200), N=dims, epi=st.integers(0, 7),
       min_k=st.sampled_from([16, 32]))
def test_engine_split_k(gpu, calls, monkeypatch, a_dtype, b_dtype, kmajor, tile, math, seed, M, K, N, epi, min_k):
    """Split-K at every grid size (ENGINE_SMS raised), K in slices of min_k or more: the
    engine's slices into scratch, then the sum and the epilogue."""
    if "float16" in (a_dtype, b_dtype) and not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: tile)
    set_policy(monkeypatch, gpu, engine_f16_math=math)
    set_policy(monkeypatch, gpu, compute_units=1 << 20, engine_split_min_k=min_k)
    M = max(M, gpu.kernel_policy.gemv_max_rows + 1)
    S, ks = gops.engine_split(M, N, K, tile, gpu.kernel_policy)
    assert S >= 2 and ks % 16 == 0 and (S - 1) * ks < K <= S * ks
    before = dict(calls)
    f16 = a_dtype == b_dtype == "float16"
    got, want, mag, _ = run_linear(gpu, seed, M, K, N, kmajor, a_dtype, epi & 1 if f16 else epi, b_dtype=b_dtype)
    assert calls["engine"] == before["engine"] + 1 and calls["splitk"] == before["splitk"] + 1
    assert got.shape == (M, N)
    if not f16:
        assert got.dtype == np.float32
        assert_close(got, want, mag)
        return
    assert got.dtype == np.float16
    g = BK16 * U16 if math == "chunked" else (K + S) * 2.0 ** -24  # (+ the f32 sum of S slices)
    assert np.all(np.abs(got.astype(np.float64) - want) <= U16 * np.abs(want) + g * mag + 1e-6)


def test_engine_split_k_by_default(gpu, calls):
    """With the default switches a small grid with a long K is split (here 1 x 2 workgroups, K = 256:
    two slices); a full grid is not."""
    assert gops.engine_split(20, 100, 256, (1, 1), H200) == (2, 128)
    got, want, mag, _ = run_linear(gpu, 5, 20, 256, 100, True, "float32", 7)
    assert calls["engine"] == calls["splitk"] == 1
    assert_close(got, want, mag)


def test_engine_split_choice():
    # from 128 rows: slices double while the grid is under 2 workgroups an SM and grid x S under 8 an SM
    assert gops.engine_split(128, 768, 768, (1, 1), H200) == (4, 192)  # 24 workgroups; 8 slices would be under 128
    assert gops.engine_split(128, 768, 3072, (1, 1), H200) == (8, 384)
    assert gops.engine_split(1023, 768, 3072, (2, 1), H200) == (8, 384)  # GPT-2's MLP down at 1,023 tokens: 96 x 8
    assert gops.engine_split(1023, 2304, 768, (2, 1), H200) == (1, 0)  # 288 workgroups: full enough
    assert gops.engine_split(128, 768, 200, (1, 1), H200) == (1, 0)  # K too short for two slices
    # below 128 rows (a batched decode step): under 1 workgroup an SM, enough slices for 2 an SM
    assert gops.engine_split(64, 768, 768, (1, 1), H200) == (6, 128)
    assert gops.engine_split(64, 50257, 768, (1, 2), H200) == (1, 0)
    assert gops.engine_split(128, 768, 768, (1, 1), H200.replace(engine_split_k=False)) == (1, 0)


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    T, _, D = q.shape
    S = k.shape[0]
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(D)
    if causal:
        s[:, np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T)] = -np.inf
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", e / e.sum(-1, keepdims=True), v.astype(np.float64))


@pytest.mark.parametrize("subgroups", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@settings(SETTINGS, max_examples=4)
@given(seed=st.integers(0, 2**31), T=st.integers(1, 300), extra=st.integers(0, 9), H=st.integers(1, 2),
       D=st.sampled_from([16, 64, 80, 128]), causal=st.booleans())
def test_attention_prefill(gpu, calls, monkeypatch, subgroups, dtype, seed, T, extra, H, D, causal):
    """q from the fused qkv layout (T, 3, H, D), k and v the first S rows of a (S + 3, H, D) cache;
    partial scores summed by subgroup shuffles or through workgroup memory."""
    if dtype == "float16" and not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    if subgroups and not gpu.ctx.has_subgroups:
        pytest.skip("this adapter has no subgroups")
    flash_min = gpu.kernel_policy.flash_min_queries
    # the kernel at every T here (attention_tiled's own test is below)
    set_policy(monkeypatch, gpu, prefill_subgroups=subgroups, prefill_min_queries=flash_min, tiled=False)
    S = T + extra
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((T, 3, H, D)).astype(dtype)
    kc = rng.standard_normal((S + 3, H, D)).astype(dtype)
    vc = rng.standard_normal((S + 3, H, D)).astype(dtype)
    before = calls["prefill"]
    got = wt.attention(wt.tensor(qkv, device=gpu)[:, 0], wt.tensor(kc, device=gpu)[:S],
                       wt.tensor(vc, device=gpu)[:S], causal=causal).numpy()
    assert calls["prefill"] == before + (1 if T >= flash_min else 0)
    assert got.dtype == np.dtype(dtype) and got.shape == (T, H, D)
    mag = attention_scale(qkv[:, 0], kc[:S], vc[:S], causal)
    assert_close(got, attention_ref(qkv[:, 0], kc[:S], vc[:S], causal), mag, rtol=1e-5 if dtype == "float32" else 1e-3)


def gqa_attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    """float64 attention where query head h reads KV head h // (H // KVH)."""
    G = q.shape[1] // k.shape[1]
    k, v = np.repeat(k.astype(np.float64), G, axis=1), np.repeat(v.astype(np.float64), G, axis=1)
    T, S = q.shape[0], k.shape[0]
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k) * scale
    if causal:
        s[:, np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T)] = -np.inf
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hts,shd->thd", e / e.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("subgroups", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@settings(SETTINGS, max_examples=5)
@given(seed=st.integers(0, 2**31), T=st.integers(1, 200), extra=st.integers(0, 70), kvh=st.integers(1, 2),
       G=st.sampled_from([1, 3]), D=st.sampled_from([16, 32, 64, 128]), keys=st.sampled_from([16, 32, 64]),
       causal=st.booleans())
def test_attention_tiled(gpu, calls, monkeypatch, subgroups, dtype, seed, T, extra, kvh, G, D, keys, causal):
    """attention_tiled.wgsl against float64 numpy: q a column slice of the fused qkv (T, 3, H, D), k
    and v the first S rows of (S + 3, KVH, D) caches, H = G KVH query heads (grouped-query: head h
    reads KV head h // G); tiles of 16, 32 or 64 keys where the device's workgroup memory holds
    them (else the planner refuses, the test checks that it did and the result is the other
    kernels'); the row maxima and sums by subgroup shuffles (the subgroup size taken as 8,
    lavapipe's) or through workgroup memory."""
    if dtype == "float16" and not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    if subgroups and not gpu.ctx.has_subgroups:
        pytest.skip("this adapter has no subgroups")
    set_policy(monkeypatch, gpu, tiled_min_queries=1, tiled_keys=(keys,))  # the kernel at every T here
    monkeypatch.setattr(gpu.ctx, "subgroup_size", 8 if subgroups else 0)  # SG where KG = keys / 4 <= 8
    H, S = G * kvh, T + extra
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((T, 3, H, D)).astype(dtype)
    kc = rng.standard_normal((S + 3, kvh, D)).astype(dtype)
    vc = rng.standard_normal((S + 3, kvh, D)).astype(dtype)
    q, k, v = wt.tensor(qkv, device=gpu)[:, 0], wt.tensor(kc, device=gpu)[:S], wt.tensor(vc, device=gpu)[:S]
    bk = gops.tiled_keys_per_tile(gpu.ctx, q, k, v, [q._offset, k._offset, v._offset, *q._strides[:2]])
    assert bk in (0, keys) and (bk == keys) == (D % keys == 0 and gops.tiled_tile_bytes(keys, D, q.dtype.itemsize)
                                                 <= gpu.ctx.api.limits["max-compute-workgroup-storage-size"])
    scale = float(D) ** -0.5
    before = calls["tiled"]
    got = wt.attention(q, k, v, causal=causal, scale=scale).numpy()
    assert calls["tiled"] == before + (1 if bk else 0)
    want = gqa_attention_ref(qkv[:, 0], kc[:S], vc[:S], causal, scale)
    assert got.dtype == np.dtype(dtype) and got.shape == (T, H, D)
    assert_close(got, want, attention_scale(qkv[:, 0], kc[:S], vc[:S], causal, scale),
                 rtol=1e-5 if dtype == "float32" else 1e-3)
