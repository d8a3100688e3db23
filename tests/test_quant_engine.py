"""The matrix engine with quantized weights (matmul_engine_quant.wgsl: the engine's tiles, K loop, split-K
and epilogue, W's tile dequantized in workgroup memory on its way in) for every type (`quant.TYPES`:
Q8_0 ... Q6_K, IQ4_NL, IQ4_XS) against the CPU reference (x @ dequantize(W).T in float32, then linear's epilogue)
and float64 numpy: 2 to 300 rows and a few thousand, odd N and odd block counts, every workgroup tile,
split-K, each epilogue and prologue (the norm or SwiGLU launch before the engine), stacks of one-row
products over the policy's limit, row-chunked weights, and a quantized model's prompt pass against the
CPU device. On lavapipe the GPU kernels are asked for through the kernel policy (gpu_style); each test
checks that the engine really ran. Bound: norm-wise relative error <= 1e-5 (the dequantized weights are
exact, only the summation order differs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import quant_weight
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu import quant_ops
from webtensor.backends.wgpu.context import WgpuContext

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TYPES = sorted(quant.TYPES)
TILES = [(1, 1), (1, 2), (2, 1), (2, 2)]
TOL = 1e-5
ENGINE, SPLIT_SUM = "matmul_engine_quant", "matmul_splitk_sum"


@pytest.fixture
def ran(gpu: wt.Device, gpu_small: wt.Device, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPU kernels (every product of 2 rows or more on the engine: gemv_max_rows 1), and the kernel
    files launched from now on, in order."""
    set_policy(monkeypatch, gpu, gpu_small, gpu_style=True, gemv_max_rows=1)
    names: list[str] = []
    launch = WgpuContext.launch

    def spy(self: WgpuContext, kernel: Any, *args: Any) -> None:
        names.append(kernel.name.split("-")[0])
        launch(self, kernel, *args)

    monkeypatch.setattr(WgpuContext, "launch", spy)
    return names


def blocks_of(qtype: str) -> st.SearchStrategy[int]:
    """Odd block counts a row: K = 32, 96, 160 values for the 32-value types, 256 and 768 for the K-quants."""
    return st.sampled_from([1, 3] if quant.TYPES[qtype].values == 256 else [1, 3, 5])


def reference(x: np.ndarray, qw: Any, bias: np.ndarray | None, res: np.ndarray | None) -> np.ndarray:
    """float64 x @ dequantize(W).T + bias + residual (no activation)."""
    y = x.astype(np.float64) @ qw.dequantize().astype(np.float64).T
    return y + (0.0 if bias is None else bias) + (0.0 if res is None else res)


def magnitude(x: np.ndarray, qw: Any, bias: np.ndarray | None = None, res: np.ndarray | None = None) -> np.ndarray:
    """The terms' magnitude of each output (tolerance.linear_scale of the dequantized weight); an activation
    keeps its input's scale (tolerance's docstring)."""
    return linear_scale(x, qw.dequantize().T, bias, res)


def linear(dev: wt.Device, x: np.ndarray, qw: Any, bias: np.ndarray | None = None, act: str | None = None,
           res: np.ndarray | None = None, **kw: Any) -> np.ndarray:
    def t(a: np.ndarray | None) -> wt.Tensor | None:
        return None if a is None else wt.tensor(a, device=dev)

    y = wt.linear(wt.tensor(x, device=dev), qw, t(bias), act, t(res), **kw)
    assert y.dtype is wt.float32
    return y.numpy()


@pytest.mark.parametrize("qtype", TYPES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), M=st.integers(2, 300), N=st.integers(0, 74).map(lambda v: 2 * v + 1),
       data=st.data(), tile=st.sampled_from(TILES), split=st.booleans(), bk=st.sampled_from([8, 16]),
       has_bias=st.booleans(), act=st.sampled_from([None, "gelu", "silu", "relu"]), has_res=st.booleans())
def test_engine_matches_reference(gpu, cpu, ran, monkeypatch, qtype, seed, M, N, data, tile, split, bk, has_bias,
                                  act, has_res):
    """One engine launch (and, split, the slices' sum) per product, every tile, K steps of 8 or 16; against
    the CPU device and, without an activation, float64 numpy."""
    monkeypatch.setattr(gops, "engine_tile", lambda m, n, p: tile)
    # split: K cut into slices of 32 or more wherever it is 64 or longer (a GPU of very many SMs); else split-K off
    # (the rule splits a deep M of one tile even on one compute unit)
    set_policy(monkeypatch, gpu, compute_units=1 << 20 if split else 1, engine_split_k=split, engine_split_min_k=32,
               engine_bk=bk)
    K = data.draw(blocks_of(qtype)) * quant.TYPES[qtype].values
    rng = np.random.default_rng(seed)
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32) if has_bias else None
    res = rng.standard_normal((M, N)).astype(np.float32) if has_res else None
    ran.clear()
    got = linear(gpu, x, qw, bias, act, res)
    S, _ = gops.engine_split(M, N, K, tile, gpu.kernel_policy)
    assert ran == [ENGINE] + ([SPLIT_SUM] if S > 1 else []) and (S > 1) == (split and K >= 64)
    assert gops.engine_bk(gpu.ctx, tile) == bk  # (lavapipe's 32 KiB hold every tile at 16)
    assert got.shape == (M, N)
    mag = magnitude(x, qw, bias, res)
    assert_close(got, linear(cpu, x, qw, bias, act, res), mag, rtol=TOL, what=(M, N, K, tile, S))
    if act is None:
        assert_close(got, reference(x, qw, bias, res), mag, rtol=TOL)


@pytest.mark.parametrize("qtype", TYPES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), M=st.integers(9, 300), N=st.integers(0, 40).map(lambda v: 2 * v + 1),
       data=st.data(), prologue=st.sampled_from(["ln", "rms", "glu"]), has_res=st.booleans())
def test_engine_after_a_prologue(gpu, cpu, ran, qtype, seed, M, N, data, prologue, has_res):
    """A norm or SwiGLU prologue with the engine: its own launch first (layer_norm, rms_norm, or the swiglu of
    the input's halves), then the engine on its output; against the CPU device and float64 numpy."""
    K = data.draw(blocks_of(qtype)) * quant.TYPES[qtype].values
    rng = np.random.default_rng(seed)
    qw = quant_weight(rng, qtype, N, K)
    res = rng.standard_normal((M, N)).astype(np.float32) if has_res else None
    g, beta = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    x = rng.standard_normal((M, 2 * K if prologue == "glu" else K)).astype(np.float32) * 2 + 0.5
    x64 = x.astype(np.float64)
    if prologue == "ln":
        mu = x64.mean(-1, keepdims=True)
        h = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + beta
    elif prologue == "rms":
        h = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * g
    else:
        h = x64[:, :K] / (1.0 + np.exp(-x64[:, :K])) * x64[:, K:]
    want = reference(h, qw, None, res)
    mag = magnitude(np.abs(h), qw, None, res)  # (the prologue's output: the norm's rows times g, or the GLU's)
    outs = []
    for dev in (gpu, cpu):
        kw: dict[str, Any] = {"glu": "swiglu"} if prologue == "glu" else {
            "ln": (wt.tensor(g, device=dev), wt.tensor(beta, device=dev), 1e-5)} if prologue == "ln" else {
            "rms": (wt.tensor(g, device=dev), 1e-5)}
        ran.clear()
        outs.append(linear(dev, x, qw, res=res, **kw))
        assert_close(outs[-1], want, mag, rtol=2e-5, what=(dev.describe(), M, N, K))  # (the norm: one f32 pass)
        if dev is gpu:
            first = {"ln": "layer_norm", "rms": "rms_norm", "glu": "elementwise"}[prologue]
            assert ran[0] == first and ran[1] == ENGINE, ran
    assert_close(outs[0], outs[1], mag, rtol=2e-5)


@pytest.mark.parametrize("qtype", TYPES)
@settings(SETTINGS, max_examples=4)
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 40), N=st.integers(0, 30).map(lambda v: 2 * v + 1),
       bias=st.booleans(), res=st.booleans())
def test_stack_over_the_limit_is_the_engine_product(gpu, cpu, monkeypatch, qtype, seed, B, N, bias, res):
    """GPU kernels: a stack of one-row products (B, 1, K) of up to gemv_stack_quant_max_rows rows is the
    GEMV's (each row bit for bit alone), more rows are the engine's plain (B, K) product, bit for bit;
    both within 1e-5 of the CPU reference."""
    set_policy(monkeypatch, gpu, gpu_style=True)
    lim = gpu.kernel_policy.gemv_stack_quant_max_rows
    assert lim is not None
    ran: list[str] = []
    launch = WgpuContext.launch
    monkeypatch.setattr(WgpuContext, "launch", lambda self, k, *a: (ran.append(k.name.split("-")[0]),
                                                                     launch(self, k, *a))[1])
    rng = np.random.default_rng(seed)
    K = 3 * quant.TYPES[qtype].values if quant.TYPES[qtype].values == 32 else 256
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((B, 1, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    r = rng.standard_normal((B, 1, N)).astype(np.float32) if res else None
    stacked = linear(gpu, x, qw, b, "gelu", r)
    if B <= lim:
        assert set(ran) == {"gemv_quant"}, ran
        assert np.array_equal(stacked[:1], linear(gpu, x[:1], qw, b, "gelu", None if r is None else r[:1]))
    else:
        assert ran[0] == ENGINE and "gemv_quant" not in ran, ran
        plain = linear(gpu, x.reshape(B, K), qw, b, "gelu", None if r is None else r.reshape(B, N))
        assert np.array_equal(stacked.reshape(B, N), plain)
    assert_close(stacked, linear(cpu, x, qw, b, "gelu", r), magnitude(x, qw, b, r), rtol=TOL)
    set_policy(monkeypatch, gpu, gemv_stack_quant_max_rows=None)  # None: stacks always on the GEMV
    ran.clear()
    linear(gpu, x, qw)
    assert set(ran) == {"gemv_quant"}
    set_policy(monkeypatch, gpu, gemv_stack_quant_max_rows=lim)  # (the next example's)


@pytest.mark.parametrize(("qtype", "M", "N"), [("Q4_K", 4096, 9), ("Q8_0", 1500, 70), ("Q5_1", 1031, 131),
                                               ("Q6_K", 700, 65)])
def test_engine_thousands_of_rows(gpu, cpu, ran, monkeypatch, qtype, M, N):
    """The tile and split rule of a GPU of 132 SMs (128-row tiles from 256 rows) on products of
    thousands of rows."""
    set_policy(monkeypatch, gpu, compute_units=132)
    rng = np.random.default_rng(M)
    K = 2 * quant.TYPES[qtype].values if quant.TYPES[qtype].values == 256 else 5 * 32
    qw = quant_weight(rng, qtype, N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    ran.clear()
    got = linear(gpu, x, qw, b)
    assert ran[0] == ENGINE and gops.engine_tile(M, N, gpu.kernel_policy)[0] == 2
    mag = magnitude(x, qw, b)
    assert_close(got, reference(x, qw, b, None), mag, rtol=TOL)
    assert_close(got, linear(cpu, x, qw, b), mag, rtol=TOL)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("M", [9, 77, 300])
def test_row_chunked_weight_on_the_engine(gpu_small, cpu, ran, qtype, M):
    """A weight over the 64 KiB binding limit in three row chunks: one engine launch per chunk, each writing
    its block of output columns (bias and residual offset to match); where the result is over the limit
    too, it runs a block of rows at a time (three launches a block)."""
    rng = np.random.default_rng(M)
    K = 512
    N = 65536 * 2 // (4 * quant_ops.quant_words(qtype, K)) + 37
    qw = quant_weight(rng, qtype, N, K)
    assert len(quant_ops.on_device(gpu_small, qw).chunks()) == 3
    x = rng.standard_normal((M, K)).astype(np.float32)
    b, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
    ran.clear()
    got = linear(gpu_small, x, qw, b, "relu", r)
    blocks = ran.count(ENGINE) // 3  # (a block of one row, if any, is a GEMV's)
    assert ran.count(ENGINE) % 3 == 0 and set(ran) <= {ENGINE, "gemv_quant"} and (blocks > 1) == (M * N * 4 > 65536)
    assert_close(got, linear(cpu, x, qw, b, "relu", r), magnitude(x, qw, b, r), rtol=TOL)


@pytest.mark.parametrize("qtype", TYPES)
def test_engine_refused_by_the_policy_runs_the_plain_tiles(gpu, cpu, ran, monkeypatch, qtype):
    """policy.engine False: the quantized product runs matmul_quant.wgsl's 64 x 64 tiles instead, for every type
    (K of two 256-value blocks: eight of the 32-value types')."""
    set_policy(monkeypatch, gpu, engine=False)
    rng = np.random.default_rng(1)
    qw = quant_weight(rng, qtype, 45, 512)
    x = rng.standard_normal((30, 512)).astype(np.float32)
    ran.clear()
    got = linear(gpu, x, qw)
    assert ran == ["matmul_quant"]
    assert_close(got, linear(cpu, x, qw), magnitude(x, qw), rtol=TOL)


# -- a model ----------------------------------------------------------------------------------------
def quant_model_blocks(rng: np.random.Generator, qtype: str, shape: tuple[int, ...]) -> bytes:
    """ggml blocks of a weight (N, K) of a model's scale: quantized from N(0, 0.05) for the types webtensor
    quantizes, else random blocks whose float16 scales are ~2^-11 (weights of ~0.1)."""
    n, k = shape
    if qtype in quant.QUANTIZABLE:
        return bytes(quant.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), qtype).to_blocks())
    t = quant.TYPES[qtype]
    raw = rng.integers(0, 256, (n, k // t.values, t.nbytes), dtype=np.uint8)
    for off in quant.HALVES[qtype]:
        raw[:, :, off + 1] = 0x10 | (raw[:, :, off + 1] & 0x83)  # exponent 4: 2^-11, either sign
    return raw.tobytes()


def quant_model(qtype: str, device: wt.Device) -> Any:
    """A 2-layer SmolLM2-shaped model (256 wide, 512 MLP, 4 heads of 64, 2 KV heads, 320 ids, tied embedding)
    whose matrices and embedding are random `qtype` blocks (seed 0: the same weights on every device), its KV cache
    float32 on every device."""
    from webtensor.models import loader, registry

    found = registry.preset("smollm2-135m")
    assert found is not None
    family, _, raw = found
    cfg = family.config_from_hf(dict(raw, num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                                     max_position_embeddings=128, bos_token_id=0, eos_token_id=0), "test")
    arrays = loader.random_arrays(family, cfg, seed=0)
    specs = family.tensors(cfg)
    rng = np.random.default_rng(0)
    types = {n: qtype if specs[n].kind in ("linear", "embedding") else "F32" for n in arrays}
    data = {n: memoryview(quant_model_blocks(rng, qtype, a.shape) if types[n] != "F32" else a.tobytes())
            for n, a in arrays.items()}
    ck = loader.Checkpoint(family, cfg, None, None, cfg.spec.eos_ids, "test", f"random-{qtype}", set(arrays),
                           lambda n: arrays[n].shape, lambda n: types[n], lambda n: data[n], gguf=False)
    return loader.build(ck, device, None, n_ctx=64, kv_dtype="float32")  # (the products are compared, not the KV type)


@pytest.mark.parametrize("qtype", TYPES)
def test_quantized_model_prompt_on_the_engine_equals_the_cpu(gpu, cpu, ran, monkeypatch, qtype):
    """A quantized model's prompt pass (40 tokens: every product, the tied LM head's too, on the engine,
    K cut into slices where the grid is small) gives the CPU device's logits."""
    set_policy(monkeypatch, gpu, compute_units=64, gemv_max_rows=8)
    ids = [(37 * i + 11) % 320 for i in range(40)]
    on_gpu, on_cpu = quant_model(qtype, gpu), quant_model(qtype, cpu)
    ran.clear()
    got = on_gpu.logits(ids)
    assert ran.count(ENGINE) >= 2 * 4 and SPLIT_SUM in ran, ran
    want = on_cpu.logits(ids)
    assert got.shape == want.shape == (40, 320) and np.isfinite(want).all() and np.abs(want).max() > 0.1
    assert_close(got, want, rtol=1e-4)  # (logits of 40 x 320: no floor)
