"""Workgroup memory: `workgroup_memory.workgroup_bytes` (what a kernel's WGSL declares, counted as drivers count it)
on hand-sized shaders, `WgpuContext.kernel`'s refusal of a variant over the device's limit (wgpu-native does not check
it; a driver given one may hang the GPU, as the H200 did on 2026-12-05 with attention_tiled_cache at D = 64, 288 bytes
over 48 KiB), and the planners of the attention and matrix kernels under the limits devices report (16, 32, 48 and
64 KiB): every variant they choose fits (they are run with launches skipped: the planning is what is checked, on any
adapter)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu.context import WORKGROUP_LIMIT, WgpuContext
from webtensor.backends.wgpu.workgroup_memory import workgroup_bytes
from webtensor.errors import GPUError

SHADER = """
alias TS = {ts};
const KG = {kg}u;
const BK = 4u * KG;
const NEG = -3.4e38;
var<workgroup> tile: array<vec4<TS>, BK * 2u>;
var<workgroup> flag: u32;
var<workgroup> pairs: array<vec2<f32>, select(1u, 3u, KG > 4u)>;
var<workgroup> unused: array<f32, 4096>;
var<workgroup> helper_only: array<u32, 10>;
var<workgroup> counts: array<atomic<u32>, 0x10u>;
fn never_called() -> u32 {{ return unused[0]; }}
fn helper(i: u32) -> u32 {{ return helper_only[i] + flag; }}
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32) {{
  tile[li] = vec4<TS>(); pairs[0] = vec2<f32>(); atomicAdd(&counts[0], helper(li));
}}
"""


@pytest.mark.parametrize(("ts", "kg", "tile"), [("f32", 8, 64 * 16), ("f16", 8, 64 * 8), ("f32", 2, 16 * 16)])
def test_bytes_of_a_hand_sized_shader(ts: str, kg: int, tile: int) -> None:
    """tile (2 BK vec4 of TS), flag (4 B: 16), pairs (3 or 1 vec2<f32>: 24 -> 32 or 8 -> 16), helper_only (reached
    through helper: 40 -> 48), counts (16 atomics: 64); `unused` is named only by a function main never calls."""
    pairs = 32 if kg > 4 else 16
    assert workgroup_bytes(SHADER.format(ts=ts, kg=kg)) == tile + 16 + pairs + 48 + 64


def test_a_runtime_sized_workgroup_array_is_refused() -> None:
    with pytest.raises(ValueError, match="element count"):
        workgroup_bytes("var<workgroup> a: array<f32>;\n@compute @workgroup_size(1)\nfn main() { a[0] = 1.0; }")


@pytest.mark.wgpu
def test_the_cache_variant_adds_what_the_planner_reserves(gpu: wt.Device) -> None:
    """attention_tiled_cache.wgsl's workgroup memory is attention_tiled.wgsl's (`tiled_tile_bytes`) plus
    TILED_CACHE_EXTRA_BYTES, whatever the tile; attention_tiled at D = 64, 64-key tiles is exactly 48 KiB."""
    for d4, kg, f16 in ((16, 16, False), (32, 8, False), (8, 4, True), (64, 4, False)):
        defs = {"TS": "f32", "D4": f"{d4}u", "KG": f"{kg}u", "F16": "true" if f16 else "false", "SG": "true"}
        plain = workgroup_bytes(gpu.ctx.wgsl("attention_tiled", defs).code)
        cache = workgroup_bytes(gpu.ctx.wgsl("attention_tiled_cache", {**defs, "KV": "f32"}).code)
        assert plain == gops.tiled_tile_bytes(4 * kg, 4 * d4, 4)
        assert cache == plain + gops.TILED_CACHE_EXTRA_BYTES
    assert gops.tiled_tile_bytes(64, 64, 4) == 48 << 10


@pytest.mark.wgpu
def test_a_kernel_over_the_limit_is_refused_by_name(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    defs = {"TS": "f32", "D4": "16u", "KG": "16u", "F16": "false", "SG": "false", "KV": "f32", "PROBE": "1u"}
    monkeypatch.setitem(gpu.ctx.api.limits, WORKGROUP_LIMIT, 48 << 10)
    with pytest.raises(GPUError, match=r"attention_tiled_cache-\S* declares 49440 B of workgroup memory; .* allows "
                                       r"49152 B"):
        gpu.ctx.kernel("attention_tiled_cache", defs)


@pytest.fixture
def planned(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The GPU kernels' planners on this adapter with launches skipped: (kernel label, its workgroup bytes) of every
    variant a planner asks for (the kernel cache bypassed, so each is counted)."""
    seen: list[tuple[str, int]] = []
    real = WgpuContext.wgsl

    def counted(self, file, defines=None, signature=None):  # type: ignore[no-untyped-def]
        text = real(self, file, defines, signature)
        seen.append((text.label, workgroup_bytes(text.code)))
        return text

    monkeypatch.setattr(WgpuContext, "wgsl", counted)
    monkeypatch.setattr(WgpuContext, "launch", lambda self, *a, **k: None)
    monkeypatch.setattr(gpu.ctx, "_pipelines", {})
    monkeypatch.setattr(gpu.ctx, "_kernels_seen", {})
    monkeypatch.setattr(gpu.ctx.api, "create_pipeline", lambda *a: ("skipped", None, 0))
    set_policy(monkeypatch, gpu, gpu_style=True)
    return seen


@pytest.mark.wgpu
@pytest.mark.parametrize("limit_kib", [16, 32, 48, 64])
def test_every_planned_variant_fits_the_limit(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch,
                                              planned: list[tuple[str, int]], limit_kib: int) -> None:
    """Prompt attention (tiled, prefill, over a paged cache), products of float32 / float16 / quantized weights at 1,
    5 and 40 rows (GEMV, stacks, the matrix engines), with every tile choice the policies offer, under a device limit
    of limit_kib KiB: each variant's workgroup memory fits (the kernel cache is bypassed: a miscount would be
    refused by name here, where on a GPU it may hang it)."""
    limit = limit_kib << 10
    monkeypatch.setitem(gpu.ctx.api.limits, WORKGROUP_LIMIT, limit)
    monkeypatch.setattr(gpu.ctx, "subgroup_size", 32)  # (a GPU's: the subgroup variants' widest)
    rng = np.random.default_rng(0)
    for D in (32, 64, 80, 96, 128, 256):
        for keys in ((64, 32, 16), (32, 16), (16,)):
            set_policy(monkeypatch, gpu, gpu_style=True, tiled_min_queries=1, tiled_keys=keys)
            for dtype in (np.float32, np.float16):
                qkv = wt.tensor(rng.standard_normal((70, 3, 2, D)).astype(dtype), device=gpu)
                wt.attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], causal=True, scale=0.1)
                wt.attention(wt.tensor(rng.standard_normal((300, 2, D)).astype(dtype), device=gpu),
                             qkv[:, 1], qkv[:, 2], causal=False, scale=0.1)
            kc = wt.tensor(rng.standard_normal((4, 16, 1, D)).astype(np.float32), device=gpu)
            table = wt.tensor(np.arange(4, dtype=np.int32).reshape(1, 4), device=gpu)
            for q_dtype in (np.float32, np.float16):
                q = wt.tensor(rng.standard_normal((9, 2, D)).astype(q_dtype), device=gpu)
                pos = wt.tensor(np.arange(9, dtype=np.int32), device=gpu)
                wt.chunk_attention(q, kc, kc, pos, wt.tensor(np.zeros(9, np.int32), device=gpu), 0.1, table=table)
    for rows in (1, 5, 40):
        x = wt.tensor(rng.standard_normal((rows, 512)).astype(np.float32), device=gpu)
        for dtype in (np.float32, np.float16):
            wt.linear(x, wt.tensor(rng.standard_normal((512, 96)).astype(dtype), device=gpu))
        for qtype in ("Q8_0", "Q4_K", "Q6_K", "IQ4_XS"):
            w = quant.random_weight(qtype, (96, 512), rng)
            wt.linear(x, w)
    assert planned, "no kernel was planned"
    over = sorted({(label, b) for label, b in planned if b > limit})
    assert not over, f"variants over {limit} B: {over[:8]}"
