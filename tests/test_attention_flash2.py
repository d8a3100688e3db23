"""Parity of attention_flash2.wgsl (the register-blocked flash-attention-2 prefill kernel) against
the numpy reference (the CPU backend on float32 copies of the inputs): float32 and float16 inputs,
head dims 16 / 64 / 128, causal or not, odd T and S >= T (a cache of S - T keys before the queries),
several heads, q / k / v as strided views (column slices of a fused qkv, rows of a longer cache),
q read from global memory or staged in workgroup memory (QS, where it fits).
On CPU adapters (lavapipe) the test asks for the GPU kernels; it checks the kernel really ran
wherever its workgroup memory fits the adapter (float32 at D = 128 needs 48 KiB: elsewhere the
older kernels answer, and the parity check still holds). The subgroup variant needs a fixed
subgroup size of 16 or more (lavapipe's varies): where there is none it is skipped.
Bounds (norm-wise relative error): 1e-5 for float32, 1e-3 for float16 (f16 inputs and output)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import rel_err
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import webtensor as wt
from webtensor.backends.wgpu import ops as gops

SETTINGS = settings(max_examples=10, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """GPU kernel variants on any adapter; counts attention_flash2 launches."""
    from webtensor.backends.wgpu.context import WgpuContext

    monkeypatch.setattr(gops, "GPU_STYLE_ON_SOFTWARE", True)
    seen = {"flash2": 0}
    launch = WgpuContext.launch

    def counted(self: WgpuContext, kernel: Any, *args: Any) -> None:
        if kernel.name.split("-")[0] == "attention_flash2":
            seen["flash2"] += 1
        launch(self, kernel, *args)

    monkeypatch.setattr(WgpuContext, "launch", counted)
    return seen


@pytest.mark.parametrize("stage_q", [False, True])
@pytest.mark.parametrize("subgroups", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@settings(SETTINGS)
@given(seed=st.integers(0, 2**31), T=st.integers(1, 200), extra=st.integers(0, 80), H=st.integers(1, 3),
       D=st.sampled_from([16, 64, 128]), causal=st.booleans(), fused_kv=st.booleans())
def test_flash2_parity(gpu, launches, monkeypatch, stage_q, subgroups, dtype, seed, T, extra, H, D, causal, fused_kv):
    if dtype == "float16" and not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    monkeypatch.setattr(gops, "FLASH2_SUBGROUPS", subgroups)
    monkeypatch.setattr(gops, "FLASH2_STAGE_Q", stage_q)
    if subgroups and not gops.flash2_subgroups(gpu.ctx):
        pytest.skip("no fixed subgroup size of 16 or more on this adapter")
    monkeypatch.setattr(gops, "PREFILL_FLASH2", True)  # off by default (slower on the H200), tested here
    monkeypatch.setattr(gops, "FLASH2_MIN_QUERIES", 1)  # the kernel at every T here
    S = T if fused_kv else T + extra
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((T, 3, H, D)).astype(dtype)  # the fused projection's layout
    kc = rng.standard_normal((S + 5, H, D)).astype(dtype)  # a cache longer than the S rows used
    vc = rng.standard_normal((S + 5, H, D)).astype(dtype)
    qkv_g = wt.tensor(qkv, device=gpu)
    q = qkv_g[:, 0]
    k, v = (qkv_g[:, 1], qkv_g[:, 2]) if fused_kv else (wt.tensor(kc, device=gpu)[:S], wt.tensor(vc, device=gpu)[:S])
    kn, vn = (qkv[:, 1], qkv[:, 2]) if fused_kv else (kc[:S], vc[:S])
    before = launches["flash2"]
    got = wt.attention(q, k, v, causal=causal).numpy()
    limit = gpu.ctx.api.limits["max-compute-workgroup-storage-size"]
    assert launches["flash2"] == before + (1 if gops.flash2_workgroup_bytes(D, q.dtype, False) <= limit else 0)
    assert gops.flash2_stage_q(gpu.ctx, D, q.dtype) == (stage_q and gops.flash2_workgroup_bytes(D, q.dtype, True)
                                                         <= limit)
    cpu = wt.Device.cpu()
    want = wt.attention(*(wt.tensor(x.astype(np.float32), device=cpu) for x in (qkv[:, 0], kn, vn)),
                        causal=causal).numpy()
    assert got.dtype == np.dtype(dtype) and got.shape == (T, H, D)
    assert rel_err(got, want) <= (1e-5 if dtype == "float32" else 1e-3)


def test_flash2_threshold(gpu, launches, monkeypatch):
    """Switched on, below FLASH2_MIN_QUERIES queries the other kernels answer; from it, attention_flash2."""
    monkeypatch.setattr(gops, "PREFILL_FLASH2", True)
    rng = np.random.default_rng(0)
    n = gops.FLASH2_MIN_QUERIES
    for T, want in ((n - 1, 0), (n, 1)):
        x = wt.tensor(rng.standard_normal((T, 2, 64)).astype(np.float32), device=gpu)
        before = launches["flash2"]
        wt.attention(x, x, x, causal=True).numpy()
        assert launches["flash2"] == before + want
