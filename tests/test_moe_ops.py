"""The mixture-of-experts ops: `moe_route` (softmax, top-k, renormalized or not) and `expert_linear` (each row
through its own experts, llama.cpp's MUL_MAT_ID) — the CPU reference against plain formulations (torch's
softmax / topk as transformers' MoE blocks route; each slot's own product), WebGPU against the CPU reference
on random shapes (odd expert counts, k, rows, N; float32 / float16 / every quantized type; X = 1 or k),
stacks over the binding limit (launched a row chunk at a time), batch invariance (a row alone == the row among
others, bit for bit), routing inside a captured graph (replays route the new logits on the device), and the
one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import quant_weight
from tolerance import assert_close

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import quant_ops

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**32 - 1)
CPU = wt.Device.cpu()


def _route_torch(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """transformers' routing (Qwen3-MoE / OLMoE): softmax in float32, topk, optionally renormalized."""
    torch = pytest.importorskip("torch")
    p = torch.softmax(torch.from_numpy(logits), dim=-1, dtype=torch.float32)
    w, ids = torch.topk(p, k, dim=-1)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w.numpy(), ids.numpy()


@given(seeds, st.integers(1, 9), st.integers(1, 70), st.booleans())
@settings(SETTINGS)
def test_cpu_route_is_softmax_then_topk(seed, T, E, normalize):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, E + 1))
    logits = rng.standard_normal((T, E)).astype(np.float32) * 3
    w, ids = wt.moe_route(wt.tensor(logits), k, normalize)
    want_w, want_ids = _route_torch(logits, k, normalize)
    np.testing.assert_array_equal(ids.numpy(), want_ids)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-6, atol=1e-7)
    assert ids.dtype is wt.int32 and w.dtype is wt.float32 and w.shape == (T, k)


def test_mixtral_softmax_over_the_topk_logits_is_the_normalized_route():
    torch = pytest.importorskip("torch")
    logits = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    top, ids = torch.topk(torch.from_numpy(logits), 2, dim=-1)
    w, got_ids = wt.moe_route(wt.tensor(logits), 2, True)
    np.testing.assert_array_equal(got_ids.numpy(), ids.numpy())
    np.testing.assert_allclose(w.numpy(), torch.softmax(top, -1).numpy(), rtol=1e-6)


def test_route_ties_pick_the_lower_id_first():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0]], np.float32)
    _, ids = wt.moe_route(wt.tensor(logits), 4, False)
    np.testing.assert_array_equal(ids.numpy(), [[1, 2, 4, 0]])


def _stack(rng: np.random.Generator, kind: str, rows: int, K: int):
    """An expert stack (rows, K): float32 / float16 values as a CPU tensor, or a quantized weight."""
    if kind in ("float32", "float16"):
        return wt.tensor(rng.standard_normal((rows, K)).astype(kind))
    return quant_weight(rng, kind, rows, K)


def _dense(stack) -> np.ndarray:
    return stack.numpy().astype(np.float32) if isinstance(stack, wt.Tensor) else stack.dequantize()


def _magnitude(stack, ids: np.ndarray, x: np.ndarray, E: int) -> np.ndarray:
    """|W_e| @ |x| of every slot (T, k, N): the magnitude each output sums (tolerance.linear_scale's, per slot)."""
    w = np.abs(_dense(stack).astype(np.float64))
    w = w.reshape(E, w.shape[0] // E, -1)
    xs = np.broadcast_to(np.abs(x.astype(np.float64)), (*ids.shape, x.shape[-1]))
    return np.einsum("tjnk,tjk->tjn", w[ids], xs)


def _case(seed: int, kind: str, T: int, E: int, N: int, per_slot: bool):
    rng = np.random.default_rng(seed)
    K = 256 if kind in quant.TYPES and quant.TYPES[kind].values == 256 else 32 * int(rng.integers(1, 5))
    k = int(rng.integers(1, E + 1))
    stack = _stack(rng, kind, E * N, K)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32).reshape(T, k)
    x = rng.standard_normal((T, k if per_slot else 1, K)).astype(np.float32)
    return stack, ids, x


KINDS = ["float32", "float16", *sorted(quant.TYPES)]


@pytest.mark.parametrize("kind", KINDS)
@given(seed=seeds, T=st.integers(1, 6), E=st.integers(1, 9), N=st.integers(1, 70), per_slot=st.booleans())
@settings(SETTINGS)
def test_cpu_expert_linear_is_each_slots_own_product(kind, seed, T, E, N, per_slot):
    stack, ids, x = _case(seed, kind, T, E, N, per_slot)
    got = wt.expert_linear(wt.tensor(x), stack, wt.tensor(ids), E).numpy()
    w = _dense(stack).reshape(E, N, -1)
    for t in range(T):
        for j, e in enumerate(ids[t]):
            xs = x[t, j if per_slot else 0]
            assert_close(got[t, j], w[e] @ xs, np.abs(w[e]) @ np.abs(xs))


def _kernels_run(monkeypatch: pytest.MonkeyPatch, dev: wt.Device) -> list[str]:
    """The kernel files `dev` compiles or fetches from now on, in order."""
    ran: list[str] = []
    real = dev.ctx.kernel

    def spy(file: str, *a, **kw):
        ran.append(file)
        return real(file, *a, **kw)
    monkeypatch.setattr(dev.ctx, "kernel", spy)
    return ran


def _to(dev: wt.Device, stack):
    return wt.tensor(stack.numpy(), device=dev) if isinstance(stack, wt.Tensor) else stack


@pytest.fixture(params=["cpu-adapter", "gpu-style"])
def style(request: pytest.FixtureRequest, gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernel family under test: one thread an output (CPU adapters), or lanes and a reduction (GPUs)."""
    set_policy(monkeypatch, gpu, gpu_style=request.param == "gpu-style")
    return str(request.param)


@pytest.mark.wgpu
@pytest.mark.parametrize("kind", KINDS)
@given(seed=seeds, T=st.integers(1, 6), E=st.integers(1, 9), N=st.integers(1, 150), per_slot=st.booleans())
@settings(SETTINGS)
def test_wgpu_expert_linear_equals_the_cpu_reference(gpu, style, kind, seed, T, E, N, per_slot):
    stack, ids, x = _case(seed, kind, T, E, N, per_slot)
    want = wt.expert_linear(wt.tensor(x), stack, wt.tensor(ids), E).numpy()
    got = wt.expert_linear(wt.tensor(x, device=gpu), _to(gpu, stack), wt.tensor(ids, device=gpu), E).numpy()
    assert got.shape == want.shape
    assert_close(got, want, _magnitude(stack, ids, x, E))


@pytest.mark.wgpu
@pytest.mark.parametrize("kind", KINDS)
@given(seed=seeds, T=st.integers(1, 40), E=st.integers(1, 9), N=st.integers(1, 90), per_slot=st.booleans())
@settings(SETTINGS)
def test_grouped_expert_products_equal_the_cpu_reference(gpu, monkeypatch, kind, seed, T, E, N, per_slot):
    """invariant=False on a GPU-style device: the slots grouped by expert (moe_align.wgsl, blocks of 8 so that
    an expert's slots span several blocks and padding) through expert_gemm(_quant).wgsl."""
    set_policy(monkeypatch, gpu, gpu_style=True, moe_grouped_min_slots=0, moe_block=8)
    ran = _kernels_run(monkeypatch, gpu)
    stack, ids, x = _case(seed, kind, T, E, N, per_slot)
    want = wt.expert_linear(wt.tensor(x), stack, wt.tensor(ids), E).numpy()
    got = wt.expert_linear(wt.tensor(x, device=gpu), _to(gpu, stack), wt.tensor(ids, device=gpu), E,
                           invariant=False).numpy()
    assert_close(got, want, _magnitude(stack, ids, x, E))
    assert "moe_align" in ran and any(k.startswith("expert_gemm") for k in ran)


@pytest.mark.wgpu
@pytest.mark.parametrize("kind", ["float32", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("path", ["gemv-cpu-adapter", "gemv-gpu-style", "grouped"])
def test_a_stack_over_the_binding_limit_runs_a_row_chunk_at_a_time(gpu_small, kind, path, monkeypatch):
    """A 64 KiB binding limit: the stack is several row chunks, an expert's rows split across two of them."""
    set_policy(monkeypatch, gpu_small, gpu_style=path != "gemv-cpu-adapter", moe_grouped_min_slots=0, moe_block=8)
    E, N, K, T = 7, 37, 1024, 5
    rng = np.random.default_rng(11)
    stack = _stack(rng, kind, E * N, K)
    dev_stack = _to(gpu_small, stack)
    chunks = (dev_stack._storage.chunks if isinstance(dev_stack, wt.Tensor)
              else quant_ops.on_device(gpu_small, stack).chunks())
    assert len(chunks) > 1
    ids = np.array([[0, 6, 3], [5, 1, 2], [4, 4 - 1, 6], [6, 0, 1], [2, 5, 4]], np.int32)
    x = rng.standard_normal((T, 3, K)).astype(np.float32)
    want = wt.expert_linear(wt.tensor(x), stack, wt.tensor(ids), E).numpy()
    got = wt.expert_linear(wt.tensor(x, device=gpu_small), dev_stack, wt.tensor(ids, device=gpu_small), E,
                           invariant=path != "grouped")
    assert_close(got.numpy(), want, _magnitude(stack, ids, x, E))


@pytest.mark.wgpu
@given(seeds, st.integers(1, 70), st.integers(1, 200), st.booleans(), st.sampled_from(["float32", "float16"]))
@settings(SETTINGS)
def test_wgpu_route_equals_the_cpu_reference(gpu, seed, T, E, normalize, dtype):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, min(E, 8) + 1))
    logits = rng.standard_normal((T, E)).astype(dtype) * 4
    w, ids = wt.moe_route(wt.tensor(logits), k, normalize)
    gw, gids = wt.moe_route(wt.tensor(logits, device=gpu), k, normalize)
    np.testing.assert_array_equal(gids.numpy(), ids.numpy())
    np.testing.assert_allclose(gw.numpy(), w.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dev", ["cpu", "wgpu", "wgpu-gpu-style"])
def test_a_row_alone_equals_the_row_among_others(dev, request, monkeypatch):
    device = CPU if dev == "cpu" else request.getfixturevalue("gpu")
    set_policy(monkeypatch, device, gpu_style=dev == "wgpu-gpu-style")
    rng = np.random.default_rng(5)
    E, N, K, T = 6, 40, 64, 7
    stack = quant_weight(rng, "Q4_0", E * N, K)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    x = rng.standard_normal((T, 1, K)).astype(np.float32)

    def run(rows: slice) -> np.ndarray:
        w, ids = wt.moe_route(wt.tensor(logits[rows], device=device), 3, True)
        return wt.expert_linear(wt.tensor(x[rows], device=device), stack, ids, E).numpy()
    every = run(slice(0, T))
    for t in range(T):
        assert np.array_equal(run(slice(t, t + 1))[0], every[t])


@pytest.mark.parametrize("dev", ["cpu", "wgpu"])
def test_a_captured_step_routes_new_logits_on_the_device(dev, request):
    """The router's ids feed the expert products inside one graph: each replay routes the logits written
    since, with no readback, and equals the eager ops."""
    device = CPU if dev == "cpu" else request.getfixturevalue("gpu")
    rng = np.random.default_rng(9)
    E, N, K, T, k = 5, 24, 64, 3, 2
    stack = wt.tensor(rng.standard_normal((E * N, K)).astype(np.float32), device=device)
    logits = wt.tensor(np.zeros((T, E), np.float32), device=device)
    x = wt.tensor(rng.standard_normal((T, 1, K)).astype(np.float32), device=device)

    def step():
        w, ids = wt.moe_route(logits, k, False)
        return w, ids, wt.expert_linear(x, stack, ids, E)
    g = device.capture(step)
    for _ in range(3):
        new = rng.standard_normal((T, E)).astype(np.float32)
        wt.copy_into(logits, wt.tensor(new, device=device))
        w, ids, y = (t.numpy() for t in g.replay())
        ew, eids, ey = (t.numpy() for t in step())
        np.testing.assert_array_equal(ids, eids)
        np.testing.assert_array_equal(ids, np.argsort(-new, axis=-1, kind="stable")[:, :k])
        np.testing.assert_array_equal(w, ew)
        np.testing.assert_array_equal(y, ey)
    g.release()


def test_bad_arguments_are_refused_in_one_line():
    logits = wt.tensor(np.zeros((2, 4), np.float32))
    for k in (0, 5, 1.5, True):
        with pytest.raises(wt.ArgumentError, match="moe_route: k must be an int in 1 .. E = 4"):
            wt.moe_route(logits, k, True)
    with pytest.raises(wt.ShapeError, match=r"moe_route: logits must be \(T, E\)"):
        wt.moe_route(wt.tensor(np.zeros(4, np.float32)), 1, True)
    stack = wt.tensor(np.zeros((12, 32), np.float32))
    x = wt.tensor(np.zeros((2, 1, 32), np.float32))
    ids = wt.tensor(np.zeros((2, 2), np.int32))
    with pytest.raises(wt.ArgumentError, match="n_experts must be a positive int dividing the 12 stacked rows"):
        wt.expert_linear(x, stack, ids, 5)
    with pytest.raises(wt.ShapeError, match=r"x must be \(T, 1 or k, K\)"):
        wt.expert_linear(wt.tensor(np.zeros((2, 3, 32), np.float32)), stack, ids, 3)
    with pytest.raises(wt.ShapeError, match="ids must be int32"):
        wt.expert_linear(x, stack, wt.tensor(np.zeros((2, 2), np.float32)), 3)
    with pytest.raises(wt.ShapeError, match="expert id 3 is out of range for 3 experts"):
        wt.expert_linear(x, stack, wt.tensor(np.array([[0, 3], [1, 2]], np.int32)), 3)
