"""q8_0 (int8) weights on WebGPU: the GPU layout and its inverse, and the kernels (gemv_quant for
M <= 8, matmul_quant_regs on CPU adapters / matmul_quant on GPUs for M > 8, built for Q8_0) against
the numpy reference (`backends.cpu.quant_linear`: quant_matmul, then linear's epilogue), with every
epilogue combination, strided and batched activations, and row-chunked weights. On lavapipe the GPU variants run through
the kernel policy's gpu_style; each test checks which kernel ran.

Bound: float32 activations, norm-wise relative error <= 1e-5 (dequantization is exact in f32, so
only the summation order differs from the reference), with tolerance.py's floor of |x| @ |W| (+ |bias|
+ |residual|) for outputs that cancel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import expected_kernel, spy_kernels
from tolerance import assert_close, layer_norm_scale, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu import quant_ops
from webtensor.quant.weight import QuantWeight, quant_matmul

SETTINGS = settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ACTS = [None, "gelu", "relu", "silu", "gelu_erf"]
TOL = 1e-5


@pytest.fixture(params=["cpu-adapter", "gpu-style"])
def style(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, gpu: wt.Device,
          gpu_small: wt.Device) -> dict[str, Any]:
    """The kernel family under test (GPU variants forced on a CPU adapter), and the kernels that ran."""
    gpu_style = request.param == "gpu-style"
    set_policy(monkeypatch, gpu, gpu_small, gpu_style=gpu_style)
    return {"gpu_style": gpu_style, "ran": spy_kernels(monkeypatch)}


def ran(style: dict[str, Any]) -> list[str]:
    """The kernels that ran since the list was last cleared."""
    return [which for which, _, _ in style["ran"]]


def weight(rng: np.random.Generator, N: int, K: int) -> QuantWeight:
    w = rng.standard_normal((N, K)).astype(np.float32)
    if N > 1 and K >= 64:
        w[1, 32:64] = 0  # an all-zero block (scale 0)
    return quant.quantize(w, "Q8_0")


def parts(w: QuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """(qs int8 (N, K), d float16 (N, blocks)) of a Q8_0 weight, from its 34-byte blocks."""
    b = w.to_blocks().reshape(w.shape[0], -1, 34)
    return (np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(w.shape[0], -1),
            np.ascontiguousarray(b[:, :, :2]).view("<f2").reshape(w.shape[0], -1))


def check(dev: wt.Device, cpu: wt.Device, rng: np.random.Generator, M: int, N: int, K: int, lead: int,
          has_bias: bool, act: str | None, has_res: bool, pad: int, qw: QuantWeight | None = None) -> None:
    """wt.linear on `dev` (x (lead, M, K), or (M, K) with lead 0, as a column slice of a (.., K + pad)
    array when pad) against the CPU reference, both fed the same q8_0 weight."""
    qw = weight(rng, N, K) if qw is None else qw
    lead_shape = (lead,) if lead else ()
    x_store = rng.standard_normal((*lead_shape, M, K + pad)).astype(np.float32)
    x_np = x_store[..., :K]
    b_np = rng.standard_normal(N).astype(np.float32) if has_bias else None
    r_np = rng.standard_normal((*lead_shape, M, N)).astype(np.float32) if has_res else None

    def run(d: wt.Device) -> np.ndarray:
        x = wt.tensor(x_store, device=d)[..., :K] if pad else wt.tensor(x_np, device=d)
        b = None if b_np is None else wt.tensor(b_np, device=d)
        r = None if r_np is None else wt.tensor(r_np, device=d)
        y = wt.linear(x, qw, b, act, r)
        assert y.shape == (*lead_shape, M, N) and y.dtype is wt.float32
        return y.numpy()

    want = run(cpu)
    got = run(dev)
    assert_close(got, want, linear_scale(x_np, qw.dequantize().T, b_np, r_np), rtol=TOL,
                 what=(M, N, K, lead, has_bias, act, has_res, pad))


# -- the layout ---------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(1, 7), st.integers(0, 2**32 - 1))
def test_pack_unpack_roundtrip(n: int, blocks: int, seed: int) -> None:
    k = 32 * blocks
    qw = weight(np.random.default_rng(seed), n, k)
    quants, scales = quant_ops.pack(qw)
    qs, d = parts(qw)
    assert quants.dtype == np.dtype("<u4") and quants.shape == (n, k // 4)
    assert scales.dtype == np.dtype("<u4") and scales.shape == (n, (blocks + 1) // 2)
    # value k of row n is byte k % 4 of word k / 4; block j's scale the low / high half of word j / 2
    assert np.array_equal((quants[:, 0] & 0xFF).astype(np.uint8).view(np.int8), qs[:, 0])
    assert np.array_equal(((quants[:, -1] >> 24) & 0xFF).astype(np.uint8).view(np.int8), qs[:, k - 1])
    assert np.array_equal((scales[:, 0] & 0xFFFF).astype(np.uint16).view(np.float16), d[:, 0])
    if blocks % 2:
        assert not (scales[:, -1] >> 16).any()  # the odd last block leaves the high half 0
    back = quant_ops.unpack("Q8_0", quants, scales, qw.shape)
    assert np.array_equal(back.to_blocks(), qw.to_blocks())


def test_upload_and_read_back(gpu: wt.Device, gpu_small: wt.Device) -> None:
    rng = np.random.default_rng(1)
    for dev, (n, k), chunks in ((gpu, (37, 96), 1), (gpu_small, (300, 256), 2), (gpu_small, (1000, 160), 3)):
        qw = weight(rng, n, k)
        g = quant_ops.upload(dev, qw)
        assert len(g.chunks()) == chunks and g.nbytes == n * k + n * quant_ops.scale_words("Q8_0", k) * 4
        assert sum(rows for _, rows, _, _ in g.chunks()) == n
        assert np.array_equal(g.to_quant_weight().to_blocks(), qw.to_blocks())


@SETTINGS
@given(st.integers(0, 40), st.integers(1, 7), st.integers(0, 2**32 - 1), st.booleans())
def test_upload_blocks_equals_upload(gpu: wt.Device, gpu_small: wt.Device, n: int, blocks: int, seed: int,
                                     small: bool) -> None:
    """ggml's bytes straight to the device (the page's loader, no numpy) == a Q8Weight's upload:
    even and odd block counts, one chunk or several."""
    dev = gpu_small if small else gpu
    k = 32 * blocks
    qw = weight(np.random.default_rng(seed), n, k) if n else QuantWeight("Q8_0", np.zeros((0, 34 * blocks), np.uint8),
                                                                          (0, k))
    raw = qw.to_blocks().tobytes()
    g, ref = quant_ops.upload_blocks(dev, "Q8_0", memoryview(raw), (n, k)), quant_ops.upload(dev, qw)
    assert g.shape == (n, k) and g.nbytes == ref.nbytes and g.chunk_rows == ref.chunk_rows
    assert np.array_equal(g.to_quant_weight().to_blocks(), qw.to_blocks())
    if n:
        x = wt.tensor(np.random.default_rng(seed + 1).standard_normal((3, k)).astype(np.float32), device=dev)
        assert np.array_equal(wt.linear(x, g).numpy(), wt.linear(x, ref).numpy())


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 700), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_gemv_outputs_per_thread_give_the_same_bits(gpu: wt.Device, cpu: wt.Device, M: int, N: int, blocks: int,
                                                     seed: int) -> None:
    """gemv_quant on a CPU adapter with NR = 1, 2, 3 or 4 outputs a thread: the same sums in the same
    order, so the same bits (N not a multiple of NR: the rows past N are computed, never written),
    and the CPU reference within tolerance."""
    rng = np.random.default_rng(seed)
    K = 32 * blocks
    qw = weight(rng, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    xt, bt = wt.tensor(x, device=gpu), wt.tensor(bias, device=gpu)
    old = gpu.kernel_policy
    try:
        outs = []
        for nr in (1, 2, 3, 4):
            gpu.kernel_policy = old.replace(gemv_quant_nr=nr)
            outs.append(wt.linear(xt, qw, bt, act="gelu").numpy())
    finally:
        gpu.kernel_policy = old
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    want = wt.linear(wt.tensor(x, device=cpu), qw, wt.tensor(bias, device=cpu), act="gelu").numpy()
    assert_close(outs[0], want, linear_scale(x, qw.dequantize().T, bias), rtol=TOL)


def test_upload_blocks_refuses_bad_bytes(gpu: wt.Device) -> None:
    raw = weight(np.random.default_rng(0), 4, 64).to_blocks().tobytes()
    with pytest.raises(wt.CheckpointError, match="needs 272 bytes, got 271"):
        quant_ops.upload_blocks(gpu, "Q8_0", raw[:-1], (4, 64))
    with pytest.raises(wt.CheckpointError, match="multiple of 32"):
        quant_ops.upload_blocks(gpu, "Q8_0", raw, (8, 34))


@pytest.mark.parametrize("gpu_style", [False, True], ids=["cpu-adapter", "gpu-style"])
def test_q8_linear_with_layer_norm(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch, gpu_style: bool) -> None:
    """`ln` in gemv_quant's prologue (GPU-style lanes), else a layer_norm launch: the reference's result."""
    set_policy(monkeypatch, gpu, gpu_style=gpu_style)
    rng = np.random.default_rng(3)
    for m, n, k in ((1, 37, 64), (5, 100, 160), (8, 9, 32)):
        w = quant.quantize(rng.standard_normal((n, k)).astype(np.float32), "Q8_0")
        x, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k,), (k,)))
        outs = [wt.linear(*(wt.tensor(v, device=d) for v in (x,)), w,
                          ln=(wt.tensor(g, device=d), wt.tensor(b, device=d), 1e-5)).numpy()
                for d in (wt.Device.cpu(), gpu)]
        # (the fused norm: one shifted float32 pass)
        assert_close(outs[1], outs[0], linear_scale(layer_norm_scale(x, g, b, 1e-5), w.dequantize().T), rtol=2e-5,
                     what=(m, n, k))


def test_unused_inputs_get_the_dummy_not_the_output(gpu: wt.Device) -> None:
    """wgpu-native rejects a buffer bound read-only and writable in one dispatch: a missing bias /
    residual is bound to the context's dummy buffer, and a launch that aliases the output is refused."""
    ctx = gpu.ctx
    g = quant_ops.upload(gpu, quant.quantize(np.ones((4, 32), np.float32), "Q8_0"))
    x = wt.tensor(np.ones((1, 32), np.float32), device=gpu)
    out = gops.empty(gpu, (1, 4), wt.float32)
    kern, _, _, _ = quant_ops.kernel_for(ctx, "Q8_0", 1, 32)
    ((_, _, qb, sb),) = g.chunks()
    params = dict(M=1, N=4, K=32, a_off4=0, lda4=8, d_ld=1, ldc=4)
    bufs = dict(a=x._storage.buffer, qs=qb, scales=sb, c=out._storage.buffer)
    ctx.launch(kern, params, bufs, (1, 1, 1))
    assert np.allclose(out.numpy(), 32 * 127 * float(np.float16(1 / 127)))
    with pytest.raises(wt.GPUError, match="also bound to another binding"):
        ctx.launch(kern, params, dict(bufs, bias=out._storage.buffer), (1, 1, 1))


# -- the kernels --------------------------------------------------------------------------------
@SETTINGS
@given(M=st.one_of(st.just(1), st.integers(1, 8), st.integers(9, 70)), N=st.integers(1, 150),
       blocks=st.integers(1, 8), has_bias=st.booleans(), act=st.sampled_from(ACTS), has_res=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_q8_linear_matches_reference(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], M: int, N: int,
                                     blocks: int, has_bias: bool, act: str | None, has_res: bool,
                                     seed: int) -> None:
    style["ran"].clear()
    check(gpu, cpu, np.random.default_rng(seed), M, N, 32 * blocks, 0, has_bias, act, has_res, 0)
    assert ran(style) == [expected_kernel(gpu, M, style["gpu_style"])]


@pytest.mark.parametrize("M", [1, 3, 8, 9, 33])
def test_strided_and_batched_activations(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], M: int) -> None:
    rng = np.random.default_rng(M)
    check(gpu, cpu, rng, M, 70, 96, 0, True, "gelu", True, 4)  # rows 100 apart: read in place
    check(gpu, cpu, rng, M, 70, 96, 0, False, None, False, 3)  # rows 99 apart: copied first
    assert ran(style) == [expected_kernel(gpu, M, style["gpu_style"])] * 2
    check(gpu, cpu, rng, M, 45, 64, 2, True, "relu", True, 0)  # (2, M, K): the batch folds into the rows
    assert ran(style)[-1] == expected_kernel(gpu, 2 * M, style["gpu_style"])


@pytest.mark.parametrize("M", [1, 4, 9])  # (M = 8 runs in the strided test: each variant costs lavapipe seconds)
def test_long_rows(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], M: int) -> None:
    """K = 3072 (GPT-2's MLP down-projection): 96 units of 32 values, 32 lanes per output on GPUs (at most ~4
    units a lane)."""
    assert quant_ops.gemv_lanes(gpu.ctx, 3072) == (32 if style["gpu_style"] or not gpu.ctx.info.is_software else 1)
    check(gpu, cpu, np.random.default_rng(M), M, 40, 3072, 0, True, None, True, 0)
    assert ran(style) == [expected_kernel(gpu, M, style["gpu_style"])]


@pytest.mark.parametrize("M", [1, 4, 20])
def test_row_chunked_weight(gpu_small: wt.Device, cpu: wt.Device, style: dict[str, Any], M: int) -> None:
    """A weight over the 64 KiB binding limit is split by output rows: one dispatch per chunk, each
    writing its block of columns, bias and residual offset to match."""
    rng = np.random.default_rng(M)
    qw = weight(rng, 300, 256)  # 76.8 KB of quants: 2 chunks of 256 and 44 rows
    assert len(quant_ops.on_device(gpu_small, qw).chunks()) == 2
    check(gpu_small, cpu, rng, M, 300, 256, 0, True, "gelu", True, 0, qw)
    check(gpu_small, cpu, rng, M, 300, 256, 0, False, None, False, 0, qw)
    assert ran(style) == [expected_kernel(gpu_small, M, style["gpu_style"])] * 2


def test_upload_is_kept_per_device(gpu: wt.Device) -> None:
    qw = weight(np.random.default_rng(0), 40, 64)
    g = quant_ops.on_device(gpu, qw)
    assert quant_ops.on_device(gpu, qw) is g and quant_ops.on_device(gpu, g) is g
    x = wt.tensor(np.ones((2, 64), np.float32), device=gpu)
    assert np.array_equal(wt.linear(x, qw).numpy(), wt.linear(x, g).numpy())


def test_vector_empty_and_transposed_inputs(gpu: wt.Device, cpu: wt.Device) -> None:
    rng = np.random.default_rng(4)
    qw = weight(rng, 30, 64)
    x = rng.standard_normal(64).astype(np.float32)
    got = wt.linear(wt.tensor(x, device=gpu), qw)
    assert got.shape == (30,)
    assert_close(got, quant_matmul(x, qw), rtol=TOL)  # (fixed inputs, 30 outputs: no cancellation)
    assert wt.linear(wt.tensor(np.zeros((0, 64), np.float32), device=gpu), qw).shape == (0, 30)
    xt = rng.standard_normal((64, 5)).astype(np.float32)  # x = xt.T: unit stride along rows, copied first
    got = wt.linear(wt.tensor(xt, device=gpu).T, qw)
    assert_close(got, wt.linear(wt.tensor(xt.T.copy(), device=cpu), qw), rtol=TOL)


def test_float16_inputs(gpu: wt.Device, cpu: wt.Device) -> None:
    if not gpu.has_f16:
        pytest.skip("no shader-f16")
    rng = np.random.default_rng(2)
    qw = weight(rng, 50, 64)
    x = rng.standard_normal((3, 64)).astype(np.float16)
    b = rng.standard_normal(50).astype(np.float16)
    want = wt.linear(wt.tensor(x, device=cpu), qw, wt.tensor(b, device=cpu)).numpy()
    got = wt.linear(wt.tensor(x, device=gpu), qw, wt.tensor(b, device=gpu))
    assert got.dtype is wt.float32
    assert_close(got, want, rtol=TOL)


def test_errors(gpu: wt.Device, cpu: wt.Device) -> None:
    rng = np.random.default_rng(3)
    qw = weight(rng, 10, 64)
    x = wt.tensor(np.ones((2, 64), np.float32), device=gpu)
    with pytest.raises(wt.ShapeError):
        wt.linear(wt.tensor(np.ones((2, 32), np.float32), device=gpu), qw)
    with pytest.raises(wt.ShapeError):
        wt.linear(x, qw, bias=wt.tensor(np.ones(9, np.float32), device=gpu))
    with pytest.raises(wt.ShapeError):
        wt.linear(x, qw, residual=wt.tensor(np.ones((2, 9), np.float32), device=gpu))
    with pytest.raises(wt.WebtensorError):
        wt.linear(x, qw, act="nope")
    with pytest.raises(wt.DTypeError):
        wt.linear(x, np.ones((64, 10), np.float32))
    with pytest.raises(wt.DeviceMismatchError):  # a weight on the GPU against a CPU tensor
        wt.linear(wt.tensor(np.ones((2, 64), np.float32), device=cpu), quant_ops.on_device(gpu, qw))
    odd = quant.quantize(rng.standard_normal((10, 40)).astype(np.float32), "Q8_0")  # K = 40: padded to 64
    with pytest.raises(wt.ShapeError):  # WebGPU needs whole blocks (GGUF's rule)
        wt.linear(wt.tensor(np.ones((2, 40), np.float32), device=gpu), odd)
    xo = rng.standard_normal((2, 40)).astype(np.float32)  # the CPU reference takes the padding
    w_odd = odd.dequantize().T
    assert_close(wt.linear(wt.tensor(xo, device=cpu), odd), xo @ w_odd, linear_scale(xo, w_odd))
