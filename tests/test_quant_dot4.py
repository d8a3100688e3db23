"""The int8-activation GEMV (gemv_quant_dot4.wgsl) against its numpy reference (`quant.q8.q8_product`: the
activations quantized to int8 in blocks of 32, exact integer sums): every type, odd shapes (N not a multiple of
anything, K a few blocks), M = 1 .. 8 and stacks of one-row products (each row bit for bit that row alone), the
RMS / layer-norm and SwiGLU prologues, activations staged in tiles (a small workgroup memory: bit for bit the
untiled result), row-chunked weights, each reduction (subgroupAdd, subgroupShuffleXor butterflies, the tree in
workgroup memory), non-finite activations, and the device probe. Forced on lavapipe through the kernel policy
(GPU-style kernels with gemv_quant_dot4); skipped where the adapter's WGSL lacks the packed integer dot products.

Bound, elementwise: |got - want| <= bound + 1e-5 max(|want|, rms(want)), with want and bound from q8_product
(bound: what a different rounding of the activations' near-ties could move; zero here where none lies within
`slack` of a tie). The integer sums are exact on both sides, so what remains is float32 rounding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import quant_linear_case, quant_weight, spy_kernels
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops
from webtensor.quant.q8 import q8_product

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TYPES = sorted(quant.TYPES)
# the prologues (norms, the prequantizing launch) quantize the activations the same way whatever the weight's type:
# run them on one type of each way a unit decodes (int8, a min, a K-quant with mins, a signed K-quant, levels);
# every type's units are checked by the tests over TYPES
PROLOGUE_TYPES = ["Q8_0", "Q4_1", "Q4_K", "Q6_K", "IQ4_XS"]
seeds = st.integers(0, 2**32 - 1)
SLACK = 2e-4  # (the fused norms' float32 rounding, relative ~1e-6, times up to 127)


def check(got: np.ndarray, x: np.ndarray, qw: Any, add: np.ndarray | None = None, slack: float = SLACK) -> None:
    """got (..., N) against q8_product of the rows x (..., K), plus `add` (bias and residual), within the module
    docstring's bound."""
    x2 = x.reshape(-1, x.shape[-1])
    want, bound = q8_product(x2, qw, slack)
    if add is not None:
        want = want + np.broadcast_to(add, got.shape).reshape(want.shape)
    g = got.reshape(want.shape).astype(np.float64)
    floor = 1e-5 * np.maximum(np.abs(want), np.sqrt(np.mean(want * want)) if want.size else 0.0)
    bad = np.abs(g - want) > bound + floor
    assert not bad.any(), (np.argwhere(bad)[:5], g[bad][:5], want[bad][:5], bound[bad][:5])


def force_dot4(monkeypatch: pytest.MonkeyPatch, devices: tuple[wt.Device, ...], reduction: str) -> None:
    """The integer GEMV on (GPU-style kernels) with one of its reductions: the tree in workgroup memory (no fixed
    subgroup size: lavapipe's own case), subgroupAdd (a fixed subgroup of 8, LANES >= 8) or butterflies of
    subgroupShuffleXor (LANES = 4 < 8: one output a thread, groups of at most 4 rows)."""
    if not devices[0].ctx.has_dot4:
        pytest.skip("this adapter's WGSL has no packed 4x8-bit integer dot products")
    changes: dict[str, Any] = dict(gpu_style=True, gemv_quant_dot4=True)
    if reduction == "shuffle":
        changes.update(gemv_quant_lanes=4, gemv_dot4_nr=1, gemv_group=4)
    set_policy(monkeypatch, *devices, **changes)
    for dev in devices:
        if reduction == "tree":
            monkeypatch.setattr(dev.ctx, "subgroup_size", 0)
        elif not dev.ctx.has_subgroups:
            pytest.skip("this adapter has no subgroups")
        else:
            monkeypatch.setattr(dev.ctx, "subgroup_size", 8)


@pytest.fixture
def dot4(gpu: wt.Device, gpu_small: wt.Device, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The integer GEMV forced on with the tree reduction; the kernels that ran (which, MR, prologue)."""
    force_dot4(monkeypatch, (gpu, gpu_small), "tree")
    return {"ran": spy_kernels(monkeypatch)}


def linear(dev: wt.Device, x: np.ndarray, qw: Any, b: np.ndarray | None = None, act: str | None = None,
           r: np.ndarray | None = None, **norm: Any) -> np.ndarray:
    def t(a: np.ndarray | None) -> wt.Tensor | None:
        return None if a is None else wt.tensor(a, device=dev)

    y = wt.linear(t(x), qw, t(b), act, t(r), **norm)
    assert y.dtype is wt.float32
    return y.numpy()


@SETTINGS
@given(qtype=st.sampled_from(TYPES), M=st.sampled_from([1, 2, 3, 5, 8]), N=st.integers(1, 90),
       blocks=st.integers(1, 3), has_bias=st.booleans(), has_res=st.booleans(), seed=seeds)
def test_linear_matches_q8_reference(gpu: wt.Device, dot4: dict[str, Any], qtype: str, M: int, N: int, blocks: int,
                                     has_bias: bool, has_res: bool, seed: int) -> None:
    """x @ W.T (+ bias, + residual) for M rows: the integer kernel, within the bound of q8_product."""
    qw, x, b, r = quant_linear_case(np.random.default_rng(seed), qtype, M, N, blocks, has_bias, has_res)
    dot4["ran"].clear()
    got = linear(gpu, x, qw, b, None, r)
    assert [w for w, _, _ in dot4["ran"]] == ["dot4"]
    check(got, x, qw, (0 if b is None else b) + (0 if r is None else r))


@pytest.mark.parametrize("qtype", TYPES)
def test_stack_rows_are_the_one_row_product(gpu: wt.Device, dot4: dict[str, Any], qtype: str) -> None:
    """x (T, 1, K): one launch over all T rows (gemv_group a workgroup), each row bit for bit that row alone;
    with bias, GELU and residual."""
    rng = np.random.default_rng(5)
    T, N, K = 13, 45, 2 * quant.TYPES[qtype].values  # (T <= gemv_stack_quant_max_rows: larger stacks take the engine)
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((T, 1, K)).astype(np.float32)
    b, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((T, 1, N)).astype(np.float32)
    dot4["ran"].clear()
    got = linear(gpu, x, qw, b, "gelu", r)
    assert dot4["ran"] == [("dot4", gpu.kernel_policy.gemv_group, 0)]
    plain = linear(gpu, x, qw)
    check(plain, x, qw)
    for i in (0, 3, 4, 7, 8, T - 1):
        assert np.array_equal(got[i : i + 1], linear(gpu, x[i : i + 1], qw, b, "gelu", r[i : i + 1])), i
        assert np.array_equal(plain[i : i + 1], linear(gpu, x[i : i + 1], qw)), i


@pytest.mark.parametrize("reduction", ["subgroup", "shuffle"])
@pytest.mark.parametrize("qtype", ["Q5_1", "Q6_K"])
def test_reductions(gpu: wt.Device, gpu_small: wt.Device, monkeypatch: pytest.MonkeyPatch, reduction: str,
                    qtype: str) -> None:
    """subgroupAdd and the subgroupShuffleXor butterflies: one row, a few rows, a stack (each row bit for bit that
    row alone) and the RMS-norm prologue, each against the reference."""
    force_dot4(monkeypatch, (gpu, gpu_small), reduction)
    ran = spy_kernels(monkeypatch)
    rng = np.random.default_rng(3)
    K, N = 3 * quant.TYPES[qtype].values, 53
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((6, 1, K)).astype(np.float32)
    g = rng.standard_normal(K).astype(np.float32)
    for rows in (x[0], x[1:4, 0], x):
        check(linear(gpu, rows, qw), rows, qw)
    stack = linear(gpu, x, qw)
    for i in range(6):
        assert np.array_equal(stack[i : i + 1], linear(gpu, x[i : i + 1], qw)), i
    x64 = x[:, 0].astype(np.float64)
    normed = (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * g).astype(np.float32)
    check(linear(gpu, x[:3, 0], qw, rms=(wt.tensor(g, device=gpu), 1e-5)), normed[:3], qw)
    assert {w for w, _, _ in ran} == {"dot4"}


@pytest.mark.parametrize("qtype", PROLOGUE_TYPES)
@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_norm_prologues(gpu: wt.Device, dot4: dict[str, Any], qtype: str, kind: str) -> None:
    """linear(x, W, rms=(g, eps)) / ln=(g, beta, eps): the norm in the integer kernel's prologue, then int8; the
    reference normalises in float64 (the fused norm's float32 rounding is within SLACK of the ties)."""
    rng = np.random.default_rng(4)
    K, eps = 2 * quant.TYPES[qtype].values, 1e-5
    for M, N in ((1, 40), (3, 33), (8, 9)):
        qw = quant_weight(rng, qtype, N, K)
        x = (rng.standard_normal((M, K)) * 2 + (1 if kind == "ln" else 0)).astype(np.float32)
        g, beta = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
        x64 = x.astype(np.float64)
        if kind == "rms":
            normed = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * g
            norm: dict[str, Any] = dict(rms=(wt.tensor(g, device=gpu), eps))
        else:
            c = x64 - x64.mean(-1, keepdims=True)
            normed = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * g + beta
            norm = dict(ln=(wt.tensor(g, device=gpu), wt.tensor(beta, device=gpu), eps))
        dot4["ran"].clear()
        got = linear(gpu, x, qw, **norm)
        assert dot4["ran"] == [("dot4", dot4["ran"][0][1], 2 if kind == "rms" else 1)]
        check(got, normed.astype(np.float32), qw)


@SETTINGS
@given(qtype=st.sampled_from(TYPES), M=st.sampled_from([1, 3, 8]), N=st.integers(1, 70), blocks=st.integers(1, 3),
       stack=st.booleans(), seed=seeds)
def test_swiglu_prologue(gpu: wt.Device, dot4: dict[str, Any], qtype: str, M: int, N: int, blocks: int,
                         stack: bool, seed: int) -> None:
    """linear(gu, W, glu="swiglu"), gu = [gate | up]: silu(gate) * up in the prologue, then int8."""
    rng = np.random.default_rng(seed)
    K = blocks * quant.TYPES[qtype].values
    qw = quant_weight(rng, qtype, N, K)
    gu = (rng.standard_normal((M, 1, 2 * K) if stack else (M, 2 * K)) * 2).astype(np.float32)
    g64, u64 = gu[..., :K].astype(np.float64), gu[..., K:].astype(np.float64)
    act = g64 / (1.0 + np.exp(-g64)) * u64
    dot4["ran"].clear()
    got = linear(gpu, gu, qw, glu="swiglu")
    assert [(w, p) for w, _, p in dot4["ran"]] == [("dot4", 3)]
    check(got, act.astype(np.float32), qw)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("M", [1, 3])
def test_tiles_equal_the_whole_row(gpu: wt.Device, dot4: dict[str, Any], qtype: str, M: int,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where MR rows of K activations do not fit the workgroup memory (the policy's gemv_dot4_stage_bytes, lowered
    until they do not) they are staged in tiles of 32 LANES values: bit for bit the one-tile result (a lane's units
    and their order do not change), with the norm."""
    rng = np.random.default_rng(M)
    K, N = 2048, 77
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    g = rng.standard_normal(K).astype(np.float32)
    calls: list[tuple[int, int, int, int]] = []  # (K, MR, LANES, NR) of each choice
    tiles: list[int] = []
    pick = quant_ops.dot4_tile

    def spy(ctx: Any, K: int, mr: int, lanes: int, nr: int) -> int:
        calls.append((K, mr, lanes, nr))
        tiles.append(pick(ctx, K, mr, lanes, nr))
        return tiles[-1]

    monkeypatch.setattr(quant_ops, "dot4_tile", spy)
    whole = [linear(gpu, x, qw), linear(gpu, x, qw, rms=(wt.tensor(g, device=gpu), 1e-5))]
    assert all(t == K for t in tiles)
    for stage in range(1 << 16, 1024, -128):  # the most workgroup memory that no longer holds all of K
        set_policy(monkeypatch, gpu, gemv_dot4_stage_bytes=stage)
        if 0 < pick(gpu.ctx, *calls[0]) < K:
            break
    tiles.clear()
    tiled = [linear(gpu, x, qw), linear(gpu, x, qw, rms=(wt.tensor(g, device=gpu), 1e-5))]
    assert tiles and all(0 < t < K for t in tiles), tiles
    for a, b in zip(whole, tiled, strict=True):
        assert np.array_equal(a, b)
    check(tiled[0], x, qw)


# (the prequantizing launch does not depend on the weight's type: the subgroup reductions on one)
@pytest.mark.parametrize("qtype, reduction", [(t, "tree") for t in PROLOGUE_TYPES] + [("Q4_K", "subgroup")])
def test_prequantized_equals_the_prologue(gpu: wt.Device, gpu_small: wt.Device, qtype: str, reduction: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """gemv_dot4_prequant: the activations quantized by a quantize_q8 launch first (through the norm or the
    SwiGLU), then read from memory: bit for bit the kernel that quantizes in its prologue, for one row, a few
    rows, a stack, the RMS norm, the SwiGLU and a row-chunked weight; with the reductions in workgroup memory
    (lavapipe's own case) and with subgroups of a fixed size (a GPU's)."""
    force_dot4(monkeypatch, (gpu, gpu_small), reduction)
    dot4 = {"ran": spy_kernels(monkeypatch)}
    rng = np.random.default_rng(13)
    K, N = 2 * quant.TYPES[qtype].values, 61
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((5, 1, 2 * K)).astype(np.float32)
    g = wt.tensor(rng.standard_normal(K).astype(np.float32), device=gpu)
    big = quant_weight(rng, qtype, 65536 * 2 // (4 * quant_ops.quant_words(qtype, K)) + 37, K)
    cases = [(gpu, x[0, :, :K], qw, {}), (gpu, x[:3, 0, :K], qw, {}), (gpu, x[:, :, :K], qw, {}),
             (gpu, x[:3, 0, :K], qw, dict(rms=(g, 1e-5))), (gpu, x[:, :, :], qw, dict(glu="swiglu")),
             (gpu_small, x[:2, 0, :K], big, {})]

    def run() -> list[np.ndarray]:
        return [linear(d, v, w, **kw) for d, v, w, kw in cases]

    fused = run()
    assert {w for w, _, _ in dot4["ran"]} == {"dot4"}
    dot4["ran"].clear()
    set_policy(monkeypatch, gpu, gpu_small, gemv_dot4_prequant=True)
    pre = run()
    assert {w for w, _, _ in dot4["ran"]} == {"dot4q"}
    for i, (a, b) in enumerate(zip(fused, pre, strict=True)):
        assert np.array_equal(a, b), i
    check(pre[0], x[0, :, :K], qw)


@pytest.mark.parametrize("qtype", TYPES)
def test_row_chunked_weight(gpu_small: wt.Device, dot4: dict[str, Any], qtype: str) -> None:
    """A weight over the 64 KiB binding limit: one launch per row chunk, each writing its columns."""
    rng = np.random.default_rng(7)
    K = 512
    N = 65536 * 2 // (4 * quant_ops.quant_words(qtype, K)) + 37  # two full chunks and a ragged third
    qw = quant_weight(rng, qtype, N, K)
    assert len(quant_ops.on_device(gpu_small, qw).chunks()) == 3
    x = rng.standard_normal((2, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    dot4["ran"].clear()
    got = linear(gpu_small, x, qw, b)
    assert {w for w, _, _ in dot4["ran"]} == {"dot4"}
    check(got, x, qw, b)


def test_non_finite_activations(gpu: wt.Device, dot4: dict[str, Any]) -> None:
    """A NaN or an infinity in a block of 32 activations makes that row's outputs NaN (as a float product
    would: d = NaN for the block); the other rows are unaffected."""
    rng = np.random.default_rng(11)
    qw = quant_weight(rng, "Q4_K", 13, 512)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, 40], x[2, 300] = np.nan, np.inf
    got = linear(gpu, x, qw)
    assert np.isnan(got[0]).all() and np.isnan(got[2]).all()
    check(got[1:2], x[1:2], qw)


def test_devices_without_the_dot_products_run_f32(gpu: wt.Device, dot4: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe decides: where the WGSL has no packed dot products the f32 GEMV runs (the browser fallback),
    and a kernel using them is refused with the extension's name."""
    assert gpu.ctx.has_dot4
    monkeypatch.setitem(gpu.ctx.__dict__, "_has_dot4", False)
    rng = np.random.default_rng(2)
    qw = quant_weight(rng, "Q8_0", 9, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    dot4["ran"].clear()
    got = linear(gpu, x, qw)
    assert [w for w, _, _ in dot4["ran"]] == ["gemv"]
    w = qw.dequantize().T
    assert_close(got, x.astype(np.float64) @ w, linear_scale(x, w))  # (the f32 GEMV: the suite's float rule)
    defs = {"Q8_0": "true", "LANES": "8u", "MR": "1u", "NR": "1u", "NORM": "0u", "SG": "0u", "GLU": "0u",
            "KT": "64u", "UNSEEN": "1u"}  # (a define no other test uses: a variant not compiled before)
    with pytest.raises(wt.GPUError, match="packed_4x8_integer_dot_product"):
        gpu.ctx.kernel("gemv_quant_dot4", defs)
