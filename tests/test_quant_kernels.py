"""Quantized weights of every type (`quant.TYPES`: Q8_0 ... Q6_K, IQ4_NL, IQ4_XS) on WebGPU against the CPU
reference (`backends.cpu.quant_linear`: x @ dequantize(W).T in float32, then linear's epilogue):
the GPU layout and its numpy-free packer, gemv_quant (M <= 8, stacks of one-row products, the
layer-norm and RMS-norm prologues), matmul_quant_regs / matmul_quant (M > 8), embedding_quant, row-chunked weights,
devices without optional features, and the one-line errors.

Kernel families: the CPU adapter's (one thread an output), the GPU variants (lanes and reductions,
forced on lavapipe through the kernel policy's gpu_style), and those with subgroup reductions (lavapipe's
subgroups are 8 wide). Bound: norm-wise relative error <= 1e-5 (the dequantized weights are exact,
only the summation order differs), with tolerance.py's floor of |x| @ |W| (+ |bias| + |residual|) for
outputs that cancel; embedding rows are bit for bit the reference's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import expected_kernel, quant_linear_case, quant_weight, spy_kernels
from tolerance import assert_close, layer_norm_scale, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops
from webtensor.quant.weight import QuantWeight

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TYPES = sorted(quant.TYPES)
TOL = 1e-5
seeds = st.integers(0, 2**32 - 1)


@pytest.fixture(params=["cpu-adapter", "gpu-style", "gpu-subgroups"])
def style(request: pytest.FixtureRequest, gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The kernel family under test, and the kernels that ran (which, MR, NR)."""
    gpu_style = request.param != "cpu-adapter"
    # stacks of one-row products on the GEMV at any count (over the policy's limit: test_quant_engine.py)
    set_policy(monkeypatch, gpu, gpu_style=gpu_style, gemv_stack_quant_max_rows=None)
    if request.param == "gpu-subgroups":
        if not gpu.ctx.has_subgroups:
            pytest.skip("this adapter has no subgroups")
        monkeypatch.setattr(gpu.ctx, "subgroup_size", 8)
    return {"gpu_style": gpu_style, "ran": spy_kernels(monkeypatch)}


def linear_both(dev: wt.Device, cpu: wt.Device, qw: Any, x: np.ndarray, b: np.ndarray | None = None,
                act: str | None = None, r: np.ndarray | None = None,
                ln: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """wt.linear on `dev` and on the CPU reference, the same inputs: (got, want)."""
    def run(d: wt.Device, w: Any) -> np.ndarray:
        y = wt.linear(wt.tensor(x, device=d), w, None if b is None else wt.tensor(b, device=d), act,
                      None if r is None else wt.tensor(r, device=d),
                      ln=None if ln is None else (wt.tensor(ln[0], device=d), wt.tensor(ln[1], device=d), 1e-5))
        assert y.dtype is wt.float32 and y.shape == (*x.shape[:-1], qw.shape[0])
        return y.numpy()
    return run(dev, qw), run(cpu, qw if isinstance(qw, QuantWeight) else qw.to_quant_weight())


# -- the layout ---------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(qtype=st.sampled_from(TYPES), n=st.integers(0, 9), blocks=st.integers(1, 5), seed=seeds)
def test_numpy_free_packer_equals_numpy_pack(qtype: str, n: int, blocks: int, seed: int) -> None:
    """split_blocks (the page's, plain bytes) == pack (numpy), and unpack inverts both: odd and even
    block counts (the scales' last half-word), empty weights."""
    k = blocks * quant.TYPES[qtype].values
    qw = quant_weight(np.random.default_rng(seed), qtype, n, k) if n else QuantWeight(
        qtype, np.zeros((0, quant.row_bytes(qtype, k)), np.uint8), (0, k))
    quants, scales = quant_ops.pack(qw)
    assert quants.dtype == scales.dtype == np.dtype("<u4")
    assert quants.shape == (n, quant_ops.quant_words(qtype, k)) and scales.shape == (n, quant_ops.scale_words(qtype, k))
    assert quant_ops.quant_words(qtype, k) % 4 == 0  # whole vec4<u32> a row
    q2, s2 = quant_ops.split_blocks(qtype, memoryview(qw.to_blocks().tobytes()), n, k)
    assert bytes(q2) == quants.tobytes() and bytes(s2) == scales.tobytes()
    assert np.array_equal(quant_ops.unpack(qtype, quants, scales, (n, k)).to_blocks(), qw.to_blocks())


def test_layout_places_bodies_and_heads() -> None:
    """The table of quant_ops' docstring, checked on one block of each type."""
    assert set(quant_ops.LAYOUTS) == set(quant.TYPES)
    for qtype, (body, heads) in quant_ops.LAYOUTS.items():
        t = quant.TYPES[qtype]
        raw = np.arange(t.nbytes, dtype=np.uint8).reshape(1, -1)
        q, s = quant_ops.split_blocks(qtype, raw.tobytes(), 1, t.values)
        assert bytes(q) == raw[0, body[0] : body[0] + body[1]].tobytes() and body[1] % 16 == 0
        at, parts = 0, [set(range(body[0], body[0] + body[1]))]
        for off, size in heads:  # each field its own word-aligned section (one block: no padding between)
            assert bytes(s[at : at + size]) == raw[0, off : off + size].tobytes()
            at += -(-size // 4) * 4
            parts.append(set(range(off, off + size)))
        assert len(s) == at == 4 * quant_ops.scale_words(qtype, t.values)
        assert sum(map(len, parts)) == t.nbytes and set().union(*parts) == set(range(t.nbytes))  # cut, not copied


@pytest.mark.parametrize("qtype", TYPES)
def test_upload_blocks_equals_upload_and_reads_back(gpu: wt.Device, gpu_small: wt.Device, qtype: str) -> None:
    rng = np.random.default_rng(1)
    k = 2 * quant.TYPES[qtype].values
    big = 65536 * 2 // (4 * quant_ops.quant_words(qtype, k)) + 5
    for dev, n in ((gpu, 37), (gpu_small, big)):  # gpu_small: 64 KiB bindings, three row chunks
        qw = quant_weight(rng, qtype, n, k)
        g = quant_ops.upload_blocks(dev, qtype, memoryview(qw.to_blocks().tobytes()), (n, k))
        ref = quant_ops.upload(dev, qw)
        assert g.qtype == qtype and g.shape == (n, k) and g.nbytes == ref.nbytes and g.chunk_rows == ref.chunk_rows
        assert g.nbytes == n * 4 * (quant_ops.quant_words(qtype, k) + quant_ops.scale_words(qtype, k))
        assert (len(g.chunks()) > 1) == (dev is gpu_small)
        assert np.array_equal(g.to_quant_weight().to_blocks(), qw.to_blocks())
        x = wt.tensor(rng.standard_normal((2, k)).astype(np.float32), device=dev)
        assert np.array_equal(wt.linear(x, g).numpy(), wt.linear(x, ref).numpy())


# -- linear ---------------------------------------------------------------------------------------
@SETTINGS
@given(qtype=st.sampled_from(TYPES), M=st.sampled_from([1, 3, 8, 9, 64]), N=st.integers(1, 90),
       blocks=st.integers(1, 3), has_bias=st.booleans(), act=st.sampled_from([None, "gelu", "silu"]),
       has_res=st.booleans(), seed=seeds)
def test_linear_matches_reference(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], qtype: str, M: int, N: int,
                                  blocks: int, has_bias: bool, act: str | None, has_res: bool, seed: int) -> None:
    style["ran"].clear()
    qw, x, b, r = quant_linear_case(np.random.default_rng(seed), qtype, M, N, blocks, has_bias, has_res)
    K = qw.shape[1]
    got, want = linear_both(gpu, cpu, qw, x, b, act, r)
    assert_close(got, want, linear_scale(x, qw.dequantize().T, b, r), rtol=TOL, what=(qtype, M, N, K))
    assert [w for w, _, _ in style["ran"]] == [expected_kernel(gpu, M, style["gpu_style"])]


@pytest.mark.parametrize("qtype", TYPES)
def test_stack_rows_are_the_one_row_product(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any],
                                             qtype: str) -> None:
    """x (T, 1, K): one gemv launch over all T rows (GEMV_GROUP a workgroup), each row bit for bit
    that row alone; with bias, GELU and residual."""
    rng = np.random.default_rng(5)
    T, N, K = 19, 45, 2 * quant.TYPES[qtype].values
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((T, 1, K)).astype(np.float32)
    b, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((T, 1, N)).astype(np.float32)
    style["ran"].clear()
    got, want = linear_both(gpu, cpu, qw, x, b, "gelu", r)
    assert style["ran"] == [("gemv", gpu.kernel_policy.gemv_group, 0)]
    assert_close(got, want, linear_scale(x, qw.dequantize().T, b, r), rtol=TOL)
    for i in (0, 7, 8, T - 1):
        alone, _ = linear_both(gpu, cpu, qw, x[i : i + 1], b, "gelu", r[i : i + 1])
        assert np.array_equal(got[i : i + 1], alone), i


@pytest.mark.parametrize("qtype", TYPES)
def test_layer_norm_prologue(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], qtype: str) -> None:
    """`ln` in gemv_quant's prologue (GPU styles), else a layer_norm launch first (CPU adapters, M > 8)."""
    rng = np.random.default_rng(3)
    K = 2 * quant.TYPES[qtype].values
    for M, N in ((1, 37), (5, 64), (8, 9), (12, 20)):
        style["ran"].clear()
        qw = quant_weight(rng, qtype, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32) * 3 + 1
        g, beta = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
        got, want = linear_both(gpu, cpu, qw, x, ln=(g, beta))
        # (the fused norm: one shifted float32 pass)
        assert_close(got, want, linear_scale(layer_norm_scale(x, g, beta, 1e-5), qw.dequantize().T), rtol=2e-5,
                     what=(M, N))
        fused = style["gpu_style"] and M <= gpu.kernel_policy.gemv_max_rows
        assert style["ran"][-1][2] == (1 if fused else 0)


@pytest.mark.parametrize("qtype", TYPES)
def test_rms_norm_prologue(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], qtype: str) -> None:
    """linear(x, W, rms=(g, eps)): the RMS norm in gemv_quant's prologue (GPU styles, M <= 8), else an
    rms_norm launch first; against float64 numpy and the CPU device."""
    rng = np.random.default_rng(4)
    K, eps = 2 * quant.TYPES[qtype].values, 1e-5
    for M, N in ((1, 40), (3, 33), (8, 9), (12, 20)):
        style["ran"].clear()
        qw = quant_weight(rng, qtype, N, K)
        x = rng.standard_normal((M, K)).astype(np.float32) * 2
        g = rng.standard_normal(K).astype(np.float32)
        x64 = x.astype(np.float64)
        normed = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * g
        want = normed @ qw.dequantize().astype(np.float64).T
        for dev in (gpu, cpu):
            got = wt.linear(wt.tensor(x, device=dev), qw, rms=(wt.tensor(g, device=dev), eps)).numpy()
            assert_close(got, want, linear_scale(normed, qw.dequantize().T), rtol=2e-5, what=(dev.describe(), M, N))
        fused = style["gpu_style"] and M <= gpu.kernel_policy.gemv_max_rows
        assert style["ran"][-1][2] == (2 if fused else 0)


@SETTINGS
@given(qtype=st.sampled_from(TYPES), M=st.sampled_from([1, 3, 8, 12]), N=st.integers(1, 70), blocks=st.integers(1, 3),
       stack=st.booleans(), has_res=st.booleans(), has_bias=st.booleans(), seed=seeds)
def test_swiglu_prologue(gpu: wt.Device, cpu: wt.Device, style: dict[str, Any], qtype: str, M: int, N: int,
                         blocks: int, stack: bool, has_res: bool, has_bias: bool, seed: int) -> None:
    """linear(gu, W, glu="swiglu") with gu = [gate | up] (M, 2K): silu(gate) * up in gemv_quant's
    prologue wherever the GEMV runs (every style: no reduction needed), else a swiglu launch first;
    against float64 numpy and the CPU device (swiglu, then the product)."""
    style["ran"].clear()
    rng = np.random.default_rng(seed)
    K = blocks * quant.TYPES[qtype].values
    qw = quant_weight(rng, qtype, N, K)
    gu = rng.standard_normal((M, 1, 2 * K) if stack else (M, 2 * K)).astype(np.float32) * 2
    b = rng.standard_normal(N).astype(np.float32) if has_bias else None
    r = rng.standard_normal((*gu.shape[:-1], N)).astype(np.float32) if has_res else None
    g64, u64 = gu[..., :K].astype(np.float64), gu[..., K:].astype(np.float64)
    want = (g64 / (1.0 + np.exp(-g64)) * u64) @ qw.dequantize().astype(np.float64).T
    want = want + (0.0 if b is None else b) + (0.0 if r is None else r)
    mag = linear_scale(g64 / (1.0 + np.exp(-g64)) * u64, qw.dequantize().T, b, r)
    outs = []
    for dev in (gpu, cpu):
        bt = None if b is None else wt.tensor(b, device=dev)
        rt = None if r is None else wt.tensor(r, device=dev)
        got = wt.linear(wt.tensor(gu, device=dev), qw, bt, residual=rt, glu="swiglu")
        assert got.shape == want.shape and got.dtype is wt.float32
        outs.append(got.numpy())
        assert_close(outs[-1], want, mag, rtol=TOL, what=(dev.describe(), qtype, M, N, K))
    assert_close(outs[0], outs[1], mag, rtol=TOL)
    fused = stack or M <= gpu.kernel_policy.gemv_max_rows
    assert style["ran"] == [("gemv" if fused else expected_kernel(gpu, M, style["gpu_style"]), style["ran"][0][1],
                             3 if fused else 0)]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("M", [1, 4, 20])
def test_row_chunked_weight(gpu_small: wt.Device, cpu: wt.Device, qtype: str, M: int,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight over the 64 KiB binding limit is split by output rows: one dispatch per chunk, each
    writing its block of columns, bias and residual offset to match; both kernel families."""
    rng = np.random.default_rng(M)
    K = 512  # 256 to 512 bytes of quants a row: 128 to 256 rows a chunk
    N = 65536 * 2 // (4 * quant_ops.quant_words(qtype, K)) + 37  # two full chunks and a ragged third
    qw = quant_weight(rng, qtype, N, K)
    assert len(quant_ops.on_device(gpu_small, qw).chunks()) == 3
    x = rng.standard_normal((M, K)).astype(np.float32)
    b, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
    for gpu_style in (False, True):
        set_policy(monkeypatch, gpu_small, gpu_style=gpu_style)
        got, want = linear_both(gpu_small, cpu, qw, x, b, "relu", r)
        assert_close(got, want, linear_scale(x, qw.dequantize().T, b, r), rtol=TOL, what=gpu_style)


@pytest.mark.parametrize("qtype", TYPES)
def test_devices_without_optional_features(cpu: wt.Device, qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """features=(): no subgroups, no shader-f16: every kernel family still runs and agrees."""
    bare = wt.Device.wgpu(features=())
    assert not bare.ctx.has_subgroups and bare.ctx.subgroup_size == 0
    rng = np.random.default_rng(9)
    K = quant.TYPES[qtype].values
    qw = quant_weight(rng, qtype, 50, K)
    ids = np.array([[4, 49], [0, 4]], np.int32)
    for gpu_style in (False, True):
        set_policy(monkeypatch, bare, gpu_style=gpu_style)
        for M in (1, 6, 11):
            x = rng.standard_normal((M, K)).astype(np.float32)
            got, want = linear_both(bare, cpu, qw, x)
            assert_close(got, want, linear_scale(x, qw.dequantize().T), rtol=TOL, what=(gpu_style, M))
        emb = wt.embedding(qw, wt.tensor(ids, device=bare)).numpy()
        assert np.array_equal(emb, qw.dequantize()[ids])


# -- embedding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", TYPES)
def test_embedding_rows_are_the_reference_bit_for_bit(gpu: wt.Device, gpu_small: wt.Device, cpu: wt.Device,
                                                      qtype: str) -> None:
    rng = np.random.default_rng(2)
    C = 2 * quant.TYPES[qtype].values
    for dev, V in ((gpu, 70), (gpu_small, 65536 * 2 // (4 * quant_ops.quant_words(qtype, C)) + 5)):
        table = quant_weight(rng, qtype, V, C)
        ids = rng.integers(0, V, (3, 7)).astype(np.int32)
        ids[0, :2] = [0, V - 1]
        got = wt.embedding(table, wt.tensor(ids, device=dev))
        assert got.dtype is wt.float32 and got.shape == (3, 7, C)
        want = wt.embedding(table, wt.tensor(ids, device=cpu)).numpy()
        assert np.array_equal(got.numpy(), want) and np.array_equal(want, table.dequantize()[ids])
        g = quant_ops.on_device(dev, table)
        assert np.array_equal(wt.embedding(g, wt.tensor(ids, device=dev)).numpy(), want)


# -- errors ---------------------------------------------------------------------------------------
def test_bad_blocks_and_shapes_are_refused(gpu: wt.Device, cpu: wt.Device) -> None:
    raw = quant_weight(np.random.default_rng(0), "Q4_1", 4, 64).to_blocks().tobytes()
    with pytest.raises(wt.CheckpointError, match=r"^a Q4_1 tensor of shape \(4, 64\) needs 160 bytes, got 159$"):
        quant_ops.upload_blocks(gpu, "Q4_1", raw[:-1], (4, 64))
    with pytest.raises(wt.CheckpointError, match=r"^a Q4_K tensor needs rows of a positive multiple of 256 values"):
        quant_ops.upload_blocks(gpu, "Q4_K", raw, (1, 160))
    with pytest.raises(wt.CheckpointError, match=r"^ggml type 'IQ3_S' is not a quantized type webtensor runs"):
        quant_ops.upload_blocks(gpu, "IQ3_S", raw, (10, 32))
    qw = quant_weight(np.random.default_rng(1), "Q6_K", 10, 256)
    x = wt.tensor(np.ones((2, 256), np.float32), device=gpu)
    with pytest.raises(wt.ShapeError, match=r"^linear: x \(2, 128\) @ a Q6_K weight of shape \(10, 256\)"):
        wt.linear(wt.tensor(np.ones((2, 128), np.float32), device=gpu), qw)
    with pytest.raises(wt.ShapeError, match=r"^linear: bias must have shape \(10,\)"):
        wt.linear(x, qw, bias=wt.tensor(np.ones(9, np.float32), device=gpu))
    with pytest.raises(wt.DTypeError, match="must be a Tensor or a quantized weight"):
        wt.linear(x, qw.to_blocks())
    with pytest.raises(wt.DeviceMismatchError, match="the Q6_K weight lives on"):
        wt.linear(wt.tensor(np.ones((2, 256), np.float32), device=cpu), quant_ops.on_device(gpu, qw))
    with pytest.raises(wt.DTypeError, match="with a Q6_K table, give the ids as an int32 Tensor"):
        wt.embedding(qw, [1, 2])
    odd = quant.quantize(np.ones((3, 40), np.float32), "Q4_0")  # K = 40: padded to 64 on the host
    with pytest.raises(wt.ShapeError, match=r"^Q4_0 on WebGPU needs K a positive multiple of 32"):
        wt.linear(wt.tensor(np.ones((1, 40), np.float32), device=gpu), odd)
