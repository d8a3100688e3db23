"""Stacks of one-row products on WebGPU: x (B, 1, K) @ W, the forward's batch-invariant layout of
a step's decode rows. On the device that is one gemv launch over all B rows (MR rows a
workgroup), and every row of it is bit for bit the product of that row alone (B = 1): float
weights (float32 and float16) with and without the fused layer norm, bias, GELU and residual;
q8_0 weights; the tied LM head against a row-chunked table, and its argmax. Each also matches the
numpy reference. Both kernel families run: the CPU adapter's (one thread an output) and the GPU
variants (lanes and reductions), forced on lavapipe. On GPUs a float16-weight stack of more than
GEMV_STACK_F16_MAX_ROWS rows goes to the tiled engine instead (last test)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import rel_err, set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu.policy import KernelPolicy

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**32 - 1)
rows = st.one_of(st.just(40), st.integers(1, 40))


@pytest.fixture(params=[False, True], ids=["cpu-kernels", "gpu-kernels"])
def style(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, gpu: wt.Device,
          gpu_small: wt.Device) -> bool:
    # every stack to the GEMV (the test after: the limit; quantized: test_quant_engine.py)
    set_policy(monkeypatch, gpu, gpu_small, gpu_style=request.param, gemv_stack_f16_max_rows=None,
               gemv_stack_quant_max_rows=None)
    return request.param


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, int, int]]]:
    """(kernel name, grid) of every launch on any WebGPU context while the test runs."""
    from webtensor.backends.wgpu.context import WgpuContext

    seen: list[tuple[str, tuple[int, int, int]]] = []
    launch = WgpuContext.launch

    def spy(self: Any, kernel: Any, params: dict, buffers: dict, groups: tuple[int, int, int]) -> None:
        seen.append((kernel.name, tuple(groups)))
        launch(self, kernel, params, buffers, groups)

    monkeypatch.setattr(WgpuContext, "launch", spy)
    return seen


def _check_rows(run: Any, arrays: list[np.ndarray], B: int, launches: list, want: np.ndarray,
                tol: float, kernel: str) -> None:
    """run(*row-slices of arrays) on the device: all B rows at once as one `kernel` launch (per
    weight chunk), each row equal to the row alone, and the whole within `tol` of `want`."""
    launches.clear()
    together = run(*arrays)
    names = [n for n, _ in launches]
    assert names and all(n.startswith(kernel) for n in names if n.startswith(("gemv", "matmul"))), names
    group = KernelPolicy().gemv_group  # (no test here overrides it)
    assert any(g[2] == -(-B // group) for n, g in launches if n.startswith(kernel)), launches
    for i in range(B):
        alone = run(*(a[i:i + 1] for a in arrays))
        assert np.array_equal(together[i:i + 1], alone, equal_nan=True), (i, B)
    assert rel_err(together, want) <= tol


@SETTINGS
@given(seed=seeds, B=rows, k4=st.sampled_from([1, 3, 5, 33, 40]), n=st.integers(1, 41).map(lambda v: 2 * v - 1),
       ln=st.booleans(), bias=st.booleans(), act=st.sampled_from([None, "gelu"]), res=st.booleans(),
       half=st.booleans())
def test_float_stack_rows_are_the_one_row_product(gpu, style, launches, seed, B, k4, n, ln, bias, act, res, half):
    """gemv.wgsl over B rows; K = 4 k4 (odd k4: the loop's tail), N odd."""
    if half and not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    K = 4 * k4
    rng = np.random.default_rng(seed)
    dtype = np.float16 if half else np.float32
    x, w = rng.standard_normal((B, 1, K)).astype(dtype), rng.standard_normal((K, n)).astype(dtype)
    b, r = rng.standard_normal(n).astype(np.float32), rng.standard_normal((B, 1, n)).astype(dtype)
    g, beta = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    wt_w = wt.tensor(np.ascontiguousarray(w.T), device=gpu).T  # (K, N) view of k-major (N, K) storage
    wt_b, wt_g, wt_beta = (wt.tensor(v, device=gpu) for v in (b, g, beta))

    def run(xs: np.ndarray, rs: np.ndarray) -> np.ndarray:
        y = wt.linear(wt.tensor(xs, device=gpu), wt_w, wt_b if bias else None, act,
                      wt.tensor(rs, device=gpu) if res else None, ln=(wt_g, wt_beta, 1e-5) if ln else None)
        return y.numpy()

    cpu = wt.Device.cpu()
    want = wt.linear(wt.tensor(x, device=cpu), wt.tensor(w, device=cpu), wt.tensor(b, device=cpu) if bias else None,
                     act, wt.tensor(r, device=cpu) if res else None,
                     ln=(wt.tensor(g, device=cpu), wt.tensor(beta, device=cpu), 1e-5) if ln else None).numpy()
    _check_rows(run, [x, r], B, launches, want, 2e-3 if half else 5e-5, "gemv")


@SETTINGS
@given(seed=seeds, B=st.integers(1, 40), k4=st.sampled_from([8, 40]), n=st.integers(1, 41).map(lambda v: 2 * v - 1),
       ln=st.booleans(), bias=st.booleans(), res=st.booleans())
def test_float16_stack_over_the_limit_is_the_tiled_product(gpu, launches, monkeypatch, seed, B, k4, n, ln, bias, res):
    """GPU kernels, float16 weights, float32 rows (GPT-2 in float16): a stack of up to
    GEMV_STACK_F16_MAX_ROWS rows is the GEMV's, more rows are the tiled engine's plain (B, K)
    product, bit for bit, each within float16's tolerance of the numpy reference."""
    if not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    set_policy(monkeypatch, gpu, gpu_style=True)
    lim = gpu.kernel_policy.gemv_stack_f16_max_rows
    assert lim is not None
    K = 4 * k4
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((B, 1, K)).astype(np.float32), rng.standard_normal((K, n)).astype(np.float16)
    b, r = rng.standard_normal(n).astype(np.float32), rng.standard_normal((B, 1, n)).astype(np.float32)
    g, beta = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    wt_w = wt.tensor(np.ascontiguousarray(w.T), device=gpu).T  # (K, N) view of k-major (N, K) storage
    wt_b, wt_g, wt_beta = (wt.tensor(v, device=gpu) for v in (b, g, beta))

    def run(xs: np.ndarray) -> np.ndarray:
        return wt.linear(wt.tensor(xs, device=gpu), wt_w, wt_b if bias else None, None,
                         wt.tensor(r.reshape(*xs.shape[:-1], n), device=gpu) if res else None,
                         ln=(wt_g, wt_beta, 1e-5) if ln else None).numpy()

    launches.clear()
    stacked = run(x)  # (B, 1, N)
    kinds = {name.split("-")[0] for name, _ in launches if name.startswith(("gemv", "matmul"))}
    if B <= lim:
        assert kinds == {"gemv"}, launches
    else:
        assert kinds and "gemv" not in kinds, launches
        assert np.array_equal(stacked.reshape(B, n), run(x.reshape(B, K)).reshape(B, n))  # the plain product
    cpu = wt.Device.cpu()
    want = wt.linear(wt.tensor(x, device=cpu), wt.tensor(w, device=cpu), wt.tensor(b, device=cpu) if bias else None,
                     None, wt.tensor(r, device=cpu) if res else None,
                     ln=(wt.tensor(g, device=cpu), wt.tensor(beta, device=cpu), 1e-5) if ln else None).numpy()
    assert rel_err(stacked, want) <= 2e-3


@SETTINGS
@given(seed=seeds, B=rows, blocks=st.sampled_from([1, 3, 5]), n=st.integers(1, 41).map(lambda v: 2 * v - 1),
       ln=st.booleans(), bias=st.booleans(), act=st.sampled_from([None, "gelu"]), res=st.booleans())
def test_q8_stack_rows_are_the_one_row_product(gpu, style, launches, seed, B, blocks, n, ln, bias, act, res):
    """gemv_quant.wgsl (Q8_0) over B rows (K = 32 blocks, N odd)."""
    K = 32 * blocks
    rng = np.random.default_rng(seed)
    qw = quant.quantize(rng.standard_normal((n, K)).astype(np.float32), "Q8_0")
    x, r = rng.standard_normal((B, 1, K)).astype(np.float32), rng.standard_normal((B, 1, n)).astype(np.float32)
    b, g, beta = (rng.standard_normal(s).astype(np.float32) for s in (n, K, K))

    def on(dev: wt.Device) -> Any:
        return lambda xs, rs: wt.linear(
            wt.tensor(xs, device=dev), qw, wt.tensor(b, device=dev) if bias else None, act,
            wt.tensor(rs, device=dev) if res else None,
            ln=(wt.tensor(g, device=dev), wt.tensor(beta, device=dev), 1e-5) if ln else None).numpy()

    _check_rows(on(gpu), [x, r], B, launches, on(wt.Device.cpu())(x, r), 5e-5, "gemv_quant")


@SETTINGS
@given(seed=seeds, B=rows)
def test_tied_lm_head_stack_over_a_row_chunked_table(gpu_small, style, launches, seed, B):
    """x (B, 1, C) @ wte.T with ln_f, wte (V, C) over the 64 KiB binding limit (row chunks: one
    gemv launch per chunk, each all B rows), then the two-stage argmax: rows as alone."""
    V, C = 301, 64  # 77 KB of float32: two chunks
    rng = np.random.default_rng(seed)
    table, x = rng.standard_normal((V, C)).astype(np.float32), rng.standard_normal((B, 1, C)).astype(np.float32)
    g, beta = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    wte = wt.tensor(table, device=gpu_small)
    assert len(wte._storage.chunks) == 2
    ln = (wt.tensor(g, device=gpu_small), wt.tensor(beta, device=gpu_small), 1e-5)

    def run(xs: np.ndarray) -> np.ndarray:
        logits = wt.linear(wt.tensor(xs, device=gpu_small), wte.T, ln=ln)  # (b, 1, V)
        best = wt.argmax(logits.reshape(xs.shape[0], V))
        return np.concatenate([logits.numpy().reshape(-1, V), best.numpy().reshape(-1, 1).astype(np.float32)], 1)

    cpu = wt.Device.cpu()
    want = wt.linear(wt.tensor(x, device=cpu), wt.tensor(table, device=cpu).T,
                     ln=(wt.tensor(g, device=cpu), wt.tensor(beta, device=cpu), 1e-5)).numpy().reshape(B, V)
    want = np.concatenate([want, want.argmax(1)[:, None].astype(np.float32)], 1)
    _check_rows(run, [x], B, launches, want, 5e-5, "gemv")
