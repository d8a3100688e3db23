"""The Llama family's ops: rms_norm (alone and as linear's prologue, float and q8_0 weights), rope,
swiglu, and grouped-query attention (attention in each of its kernels, cache_write and
cached_attention). Each against a float64 numpy reference written here (fp32 norm-wise relative
error <= 1e-5), on the CPU device and on WebGPU (lavapipe under CI=true, in the CPU-adapter and the
GPU kernel variants), on fresh random inputs of odd shapes and strided views (the heads of a fused
qkv, the halves of a fused gate_up); inside captured graphs replayed with new positions; on a device
without the optional features; and the errors bad arguments get."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import rel_err, set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import append_and_attend, on, rnd

import webtensor as wt
from webtensor.quant import quantize

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TOL = 1e-5
seeds = st.integers(0, 2**32 - 1)
HEAD_DIMS = [32, 64, 80, 96, 128]  # the Llama family's (64: SmolLM2, Llama 3.2 1B, Qwen2.5; 128: Qwen3, Llama 3 8B)


@pytest.fixture(params=[False, True], ids=["cpu-kernels", "gpu-kernels"])
def style(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, gpu: wt.Device) -> bool:
    set_policy(monkeypatch, gpu, gpu_style=request.param)
    return request.param


def devices(gpu: wt.Device) -> list[wt.Device]:
    return [wt.Device.cpu(), gpu]


class Launches:
    """The kernels a device launches (by file name) while installed on its context."""

    def __init__(self, dev: wt.Device, monkeypatch: pytest.MonkeyPatch):
        self.names: list[str] = []
        launch = dev.ctx.launch

        def spy(kernel: Any, *args: Any, **kw: Any) -> None:
            self.names.append(kernel.name.split("-")[0])
            launch(kernel, *args, **kw)
        monkeypatch.setattr(dev.ctx, "launch", spy)


# -- float64 references ---------------------------------------------------------------------------
def ref_rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    v = x.astype(np.float64)
    return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def ref_rope(x: np.ndarray, pos: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    v = x.astype(np.float64)
    half = cos.shape[1]
    c, s = cos[pos][:, None].astype(np.float64), sin[pos][:, None].astype(np.float64)  # (T, 1, R/2)
    ia, ib = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else (slice(0, half), slice(half, 2 * half))
    out = v.copy()
    out[..., ia] = v[..., ia] * c - v[..., ib] * s
    out[..., ib] = v[..., ib] * c + v[..., ia] * s
    return out


def ref_swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    g64 = g.astype(np.float64)
    return g64 / (1.0 + np.exp(-g64)) * u.astype(np.float64)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, scale: float) -> np.ndarray:
    """q (T, H, D), k and v (S, KVH, D): query head h against kv head h // (H // KVH)."""
    T, H, _ = q.shape
    S, KVH, _ = k.shape
    kv = np.arange(H) // (H // KVH)
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k[:, kv].astype(np.float64)) * scale  # (H, T, S)
    if causal:
        s = np.where(np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v[:, kv].astype(np.float64))


def rope_tables(P: int, half: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / base ** (np.arange(half) / half)
    ang = np.arange(P)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# -- rms_norm -------------------------------------------------------------------------------------
@SETTINGS
@given(seed=seeds, t=st.integers(1, 9), h=st.integers(1, 5), kvh=st.integers(1, 3),
       d=st.sampled_from([1, 3, 7, 33, *HEAD_DIMS, 300, 1100]), layout=st.sampled_from(["rows", "cols", "heads"]),
       eps=st.sampled_from([0.0, 1e-6, 1e-5, 0.1]))
def test_rms_norm(gpu: wt.Device, seed: int, t: int, h: int, kvh: int, d: int, layout: str, eps: float) -> None:
    """rms_norm of contiguous rows, of a column slice of wider rows, and of the q heads of a fused
    qkv (T, H + 2 KVH, D) with weight (D,) (QK-norm): that view is read in place, one launch."""
    big = rnd(seed, t, h + 2 * kvh, d, scale=2.0) + 0.5
    c = d if layout != "cols" else max(1, d // 2 + 1)
    w = rnd(seed + 1, c)

    def pick(a: Any) -> Any:  # the same view of a numpy array or a tensor
        return a[:, :h] if layout == "heads" else a.reshape(-1, d) if layout == "rows" else a.reshape(t, -1)[:, :c]
    want = ref_rms_norm(pick(big), w, eps)
    for dev in devices(gpu):
        bt, wt_ = on(dev, big, w)
        xt = pick(bt)
        before = dev.stats()["dispatches"]
        got = wt.rms_norm(xt, wt_, eps)
        if dev.backend.name == "wgpu":
            assert dev.stats()["dispatches"] - before == 1  # no copy of the strided view
        got = got.numpy()
        assert got.shape == want.shape and got.dtype == np.float32
        assert rel_err(got, want) <= TOL, (dev.describe(), rel_err(got, want))


def test_rms_norm_float16_and_extreme_rows(gpu: wt.Device) -> None:
    """float16 in, float16 out (f32 arithmetic); rows of 1e20 (whose squares overflow float32) and of
    1e-3 are normalised all the same."""
    x = rnd(0, 6, 200)
    x[1] *= 1e20
    x[2] *= 1e-3
    w = rnd(1, 200)
    for dev in devices(gpu):
        got = wt.rms_norm(*on(dev, x, w), eps=1e-6).numpy()
        assert np.isfinite(got).all() and rel_err(got, ref_rms_norm(x, w, 1e-6)) <= TOL
    if gpu.has_f16:
        x16, w16 = x[2:].astype(np.float16), w.astype(np.float16)
        outs = [wt.rms_norm(*on(dev, x16, w16), eps=1e-6).numpy() for dev in devices(gpu)]
        assert outs[0].dtype == outs[1].dtype == np.float16
        assert rel_err(outs[1], ref_rms_norm(x16, w16, 1e-6)) <= 1e-3
        assert rel_err(outs[1], outs[0]) <= 1e-3


def test_rms_norm_and_swiglu_nan_and_inf(gpu: wt.Device) -> None:
    """docs/numerics.md's rows for rms_norm and swiglu, the same on both devices."""
    x = np.ones((4, 6), np.float32)
    x[0, 2], x[1, 3], x[2], x[3, 1] = np.nan, np.inf, 0.0, -np.inf
    g = np.array([-np.inf, np.inf, np.nan, -1e30, -100.0, 2.0], np.float32)
    for dev in devices(gpu):
        y = wt.rms_norm(*on(dev, x, np.ones(6, np.float32)), eps=1e-6).numpy()
        assert np.isnan(y[0]).all() and np.array_equal(y[2], np.zeros(6, np.float32))
        for r, c in ((1, 3), (3, 1)):
            assert np.isnan(y[r, c]) and np.array_equal(np.delete(y[r], c), np.zeros(5, np.float32))
        assert np.isnan(wt.rms_norm(*on(dev, x[2:3], np.ones(6, np.float32)), eps=0.0).numpy()).all()
        s = wt.swiglu(*on(dev, g, np.ones(6, np.float32))).numpy()
        assert np.isnan(s[[0, 2]]).all() and s[1] == np.inf and s[3] == 0 and np.signbit(s[3])
        assert abs(s[4]) < 1e-40 and abs(s[5] - 2.0 / (1.0 + np.exp(-2.0))) < 1e-6


def test_rms_norm_refuses_bad_arguments(device: wt.Device) -> None:
    x, w = on(device, rnd(0, 3, 8), rnd(1, 8))
    with pytest.raises(wt.ShapeError, match=r"rms_norm: x \(3, 8\) needs weight of shape \(8,\), got \(7,\)"):
        wt.rms_norm(x, w[:7])
    for bad in (-1e-5, float("nan"), True, "1e-5"):
        with pytest.raises(wt.ArgumentError, match="rms_norm: eps must be a number >= 0"):
            wt.rms_norm(x, w, bad)
    with pytest.raises(wt.DTypeError, match="rms_norm needs float32 or float16"):
        wt.rms_norm(wt.tensor(np.ones((2, 8), np.int32), device=device), w)


# -- linear with an RMS-norm prologue -------------------------------------------------------------
@SETTINGS
@given(seed=seeds, m=st.integers(1, 12), k=st.sampled_from([4, 8, 36, 64, 100]), n=st.integers(1, 40),
       act=st.sampled_from([None, "silu"]), bias=st.booleans(), stack=st.booleans())
def test_linear_with_rms_norm(gpu: wt.Device, style: bool, monkeypatch: pytest.MonkeyPatch, seed: int, m: int,
                              k: int, n: int, act: str | None, bias: bool, stack: bool) -> None:
    """linear(x, w, rms=(g, eps)) = rms_norm(x, g, eps) @ w; on GPUs the GEMV (decode rows) takes
    the norm in its prologue: one launch."""
    x, w, b, g = rnd(seed, m, k), rnd(seed + 1, k, n), rnd(seed + 2, n), rnd(seed + 3, k)
    y = ref_rms_norm(x, g, 1e-5) @ w.astype(np.float64) + (b if bias else 0.0)
    want = y / (1.0 + np.exp(-y)) if act == "silu" else y
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        xt, wk, bt, gt = on(dev, x, w.T.copy(), b, g)  # k-major weight, as models store it
        xt = xt.reshape(m, 1, k) if stack else xt
        got = wt.linear(xt, wk.T, bt if bias else None, act=act, rms=(gt, 1e-5)).numpy().reshape(m, n)
        assert rel_err(got, want) <= TOL, (dev.describe(), rel_err(got, want))
    if style and (m <= gpu.kernel_policy.gemv_max_rows or stack):
        assert spy.names == ["gemv"]  # fused
    elif not style:
        assert spy.names[0] == "rms_norm"  # CPU adapters: one lane an output, the norm its own launch


@pytest.mark.parametrize("m", [1, 3, 12])
def test_linear_with_rms_norm_and_q8_weights(gpu: wt.Device, style: bool, monkeypatch: pytest.MonkeyPatch,
                                             m: int) -> None:
    """A q8_0 weight (N, K) with the RMS prologue: fused into gemv_quant on GPUs for decode rows."""
    k, n = 96, 40
    x, g, r = rnd(0, m, k), rnd(1, k), rnd(2, m, n)
    w = quantize(rnd(3, n, k), "Q8_0")
    want = ref_rms_norm(x, g, 1e-6) @ w.dequantize().T.astype(np.float64) + r
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        xt, gt, rt = on(dev, x, g, r)
        got = wt.linear(xt, w, residual=rt, rms=(gt, 1e-6)).numpy()
        assert rel_err(got, want) <= TOL, (dev.describe(), rel_err(got, want))
    assert ("rms_norm" not in spy.names) == (style and m <= gpu.kernel_policy.gemv_max_rows)


@SETTINGS
@given(seed=seeds, m=st.integers(1, 12), f=st.sampled_from([4, 8, 36, 64, 100]), n=st.integers(1, 40),
       wtype=st.sampled_from(["float32", "float16"]), bias=st.booleans(), res=st.booleans(), stack=st.booleans())
def test_linear_with_swiglu_prologue(gpu: wt.Device, style: bool, monkeypatch: pytest.MonkeyPatch, seed: int, m: int,
                                     f: int, n: int, wtype: str, bias: bool, res: bool, stack: bool) -> None:
    """linear(gu, w, glu="swiglu") = swiglu(gu[..., :F], gu[..., F:]) @ w (+ bias) (+ residual), gu the
    (rows, 2F) output of a fused gate_up product; the GEMV (decode rows, both kernel styles) reads its
    input through the gate: one launch; other products run a swiglu launch first."""
    if wtype == "float16" and not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    gu, w, b = rnd(seed, m, 2 * f, scale=2.0), rnd(seed + 1, f, n).astype(wtype), rnd(seed + 2, n)
    r = rnd(seed + 3, m, n)
    want = ref_swiglu(gu[:, :f], gu[:, f:]) @ w.astype(np.float64) + (b if bias else 0.0) + (r if res else 0.0)
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        gut, wk, bt, rt = on(dev, gu, w.T.copy(), b, r)  # k-major weight, as models store it
        shape = (m, 1) if stack else (m,)
        got = wt.linear(gut.reshape(*shape, 2 * f), wk.T, bt if bias else None,
                        residual=rt.reshape(*shape, n) if res else None, glu="swiglu")
        assert got.shape == (*shape, n) and got.dtype is wt.float32
        assert rel_err(got.numpy().reshape(m, n), want) <= TOL, (dev.describe(), rel_err(got.numpy(), want))
    gemv = stack or m <= gpu.kernel_policy.gemv_max_rows
    assert (spy.names == ["gemv"]) if gemv else (spy.names[0] == "elementwise")


def test_linear_refuses_bad_glu(device: wt.Device) -> None:
    x, w, g = on(device, rnd(0, 2, 8), rnd(1, 4, 3), rnd(2, 8))
    with pytest.raises(wt.ArgumentError, match="linear: glu must be None or 'swiglu', got 'geglu'"):
        wt.linear(x, w, glu="geglu")
    with pytest.raises(wt.ArgumentError, match="does not combine with a norm prologue"):
        wt.linear(x, w, rms=(g, 1e-5), glu="swiglu")
    with pytest.raises(wt.ShapeError, match=r"needs weight \(K, N\) with 2K = x.shape\[-1\]"):
        wt.linear(x, wt.tensor(rnd(3, 8, 3), device=device), glu="swiglu")
    q = quantize(rnd(4, 3, 32), "Q8_0")
    with pytest.raises(wt.ShapeError, match="needs 2K = x.shape"):
        wt.linear(wt.tensor(rnd(5, 2, 32), device=device), q, glu="swiglu")


def test_linear_refuses_bad_norms(device: wt.Device) -> None:
    x, w, g, b = on(device, rnd(0, 2, 8), rnd(1, 8, 4), rnd(2, 8), rnd(3, 8))
    with pytest.raises(wt.ArgumentError, match="ln .* or rms .*, not both"):
        wt.linear(x, w, ln=(g, b, 1e-5), rms=(g, 1e-5))
    with pytest.raises(wt.ArgumentError, match=r"rms must be \(weight, eps\)"):
        wt.linear(x, w, rms=(g, b, 1e-5))
    with pytest.raises(wt.ShapeError, match=r"rms weight must have shape \(8,\), got \(4,\)"):
        wt.linear(x, w, rms=(g[:4], 1e-5))
    with pytest.raises(wt.ArgumentError, match="linear: eps must be a number >= 0"):
        wt.linear(x, w, rms=(g, -1.0))


# -- rope -----------------------------------------------------------------------------------------
@SETTINGS
@given(seed=seeds, t=st.integers(1, 9), kvh=st.integers(1, 3), group=st.integers(1, 3),
       d=st.sampled_from([2, 7, 10, *HEAD_DIMS]), part=st.sampled_from([1.0, 0.5, 0.25, 0.0]),
       interleaved=st.booleans(), which=st.sampled_from(["x", "q", "k", "qk"]), p_extra=st.integers(0, 50))
def test_rope(gpu: wt.Device, seed: int, t: int, kvh: int, group: int, d: int, part: float, interleaved: bool,
              which: str, p_extra: int) -> None:
    """rope of a contiguous x and of the q, k or q and k heads of a fused qkv (T, H + 2 KVH, D) view,
    R = D or partial (the rest passes through), both pairings; a new contiguous (T, H, D)."""
    h = kvh * group
    half = max(1, int(d // 2 * part))
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, t + p_extra, t).astype(np.int32)
    cos, sin = rope_tables(t + p_extra, half)
    qkv = rnd(seed, t, h + 2 * kvh, d)
    heads = {"x": slice(0, h + 2 * kvh), "q": slice(0, h), "k": slice(h, h + kvh), "qk": slice(0, h + kvh)}[which]
    src = qkv if which == "x" else qkv[:, heads]
    want = ref_rope(src, pos, cos, sin, interleaved)
    for dev in devices(gpu):
        qt, pt, ct, st_ = on(dev, np.ascontiguousarray(src) if which == "x" else qkv, pos, cos, sin)
        got = wt.rope(qt if which == "x" else qt[:, heads], pt, ct, st_, interleaved=interleaved).numpy()
        assert got.shape == src.shape and got.dtype == np.float32
        assert rel_err(got, want) <= TOL, (dev.describe(), rel_err(got, want))
        assert np.array_equal(got[..., 2 * half:], src[..., 2 * half:])  # dims R.. pass through


def test_rope_float16(gpu: wt.Device) -> None:
    if not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    x = rnd(0, 5, 4, 64).astype(np.float16)
    pos = np.array([0, 3, 9, 1, 7], np.int32)
    cos, sin = rope_tables(10, 32)
    outs = [wt.rope(*on(dev, x, pos, cos, sin)).numpy() for dev in devices(gpu)]
    assert outs[0].dtype == outs[1].dtype == np.float16
    assert rel_err(outs[1], ref_rope(x, pos, cos, sin, False)) <= 1e-3 and rel_err(outs[1], outs[0]) <= 1e-3


@pytest.mark.hf
@pytest.mark.parametrize("scaling", ["default", "llama3"])
def test_rope_matches_transformers(gpu: wt.Device, scaling: str) -> None:
    """Against transformers' apply_rotary_pos_emb with LlamaRotaryEmbedding's cos / sin (the table
    rows are their first D/2 columns: HF duplicates them over the two halves)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    H, KVH, D, P, T = 6, 2, 64, 300, 7
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": 100000.0}
    if scaling == "llama3":
        rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=KVH, head_dim=D,
                      max_position_embeddings=P, rope_parameters=rope_parameters)
    q, k = rnd(0, T, H, D), rnd(1, T, KVH, D)
    pos = np.array([0, 1, 2, 50, 100, 250, 299], np.int32)
    with torch.no_grad():
        cos_hf, sin_hf = LlamaRotaryEmbedding(cfg)(torch.from_numpy(q), torch.arange(P)[None])  # (1, P, D)
        qe, ke = apply_rotary_pos_emb(torch.from_numpy(q.transpose(1, 0, 2))[None],
                                      torch.from_numpy(k.transpose(1, 0, 2))[None],
                                      cos_hf[:, pos], sin_hf[:, pos])  # (1, H, T, D)
    cos, sin = cos_hf[0, :, : D // 2].numpy(), sin_hf[0, :, : D // 2].numpy()
    assert np.array_equal(cos_hf[0, :, D // 2:].numpy(), cos)  # (what makes the (P, D/2) table the same)
    for dev in devices(gpu):
        qt, kt, pt, ct, st_ = on(dev, q, k, pos, cos, sin)
        for x, want in ((qt, qe[0].numpy().transpose(1, 0, 2)), (kt, ke[0].numpy().transpose(1, 0, 2))):
            assert rel_err(wt.rope(x, pt, ct, st_).numpy(), want) <= TOL


def test_rope_and_cached_attention_replay_with_new_positions(device: wt.Device) -> None:
    """A captured decode step (rope of q and k heads of a fused qkv by positions on the device, then
    cached attention appending k, v) replayed with new positions and rows: the eager ops' results."""
    T, KVH, G, D, slots, n_ctx = 3, 2, 3, 64, 4, 16
    H = KVH * G
    cos, sin = rope_tables(n_ctx, D // 2)
    qkv, pos, slot = on(device, rnd(0, T, H + 2 * KVH, D), np.zeros(T, np.int32), np.arange(T, dtype=np.int32))
    kc, vc = on(device, rnd(1, slots, n_ctx, KVH, D), rnd(2, slots, n_ctx, KVH, D))
    ct, st_ = on(device, cos, sin)

    def step() -> wt.Tensor:
        q = wt.rope(qkv[:, :H], pos, ct, st_)
        k = wt.rope(qkv[:, H:H + KVH], pos, ct, st_)
        return wt.cached_attention(q, kc, vc, pos, slot, k_new=k, v_new=qkv[:, H + KVH:])

    g = device.capture(step)
    ekc, evc = on(wt.Device.cpu(), kc.numpy(), vc.numpy())
    rng = np.random.default_rng(3)
    for i in range(4):
        p = rng.integers(0, n_ctx, T).astype(np.int32)
        s = rng.permutation(slots)[:T].astype(np.int32)
        x = rnd(10 + i, T, H + 2 * KVH, D)
        for t, a in ((qkv, x), (pos, p), (slot, s)):
            wt.copy_into(t, wt.tensor(a, device=device))
        got = g.replay().numpy()
        want_q = ref_rope(x[:, :H], p, cos, sin, False)
        want_k = ref_rope(x[:, H:H + KVH], p, cos, sin, False)
        cpu = wt.Device.cpu()
        want = wt.cached_attention(*on(cpu, want_q.astype(np.float32)), ekc, evc, *on(cpu, p, s),
                                   k_new=wt.tensor(want_k.astype(np.float32), device=cpu),
                                   v_new=wt.tensor(x[:, H + KVH:], device=cpu)).numpy()
        assert rel_err(got, want) <= TOL
        assert rel_err(kc.numpy(), ekc.numpy()) <= TOL and np.array_equal(vc.numpy(), evc.numpy())
        assert rel_err(kc.numpy()[s, p], want_k) <= TOL  # the rotated keys went where the positions say
    g.release()


def test_rope_positions_outside_the_table(device: wt.Device) -> None:
    """Host positions past the table are refused; on the CPU a tensor's too (every call); on WebGPU
    a device tensor's are clamped into the table (rope.wgsl), never read out of bounds."""
    x = rnd(0, 3, 2, 8)
    cos, sin = rope_tables(5, 4)
    xt, ct, st_ = on(device, x, cos, sin)
    with pytest.raises(wt.ShapeError, match="rope: position 5 is outside the cos / sin tables of 5 rows"):
        wt.rope(xt, [0, 5, 1], ct, st_)
    with pytest.raises(wt.ShapeError, match="position -1 is outside"):
        wt.rope(xt, np.array([0, -1, 1]), ct, st_)
    assert rel_err(wt.rope(xt, [4, 0, 2], ct, st_).numpy(), ref_rope(x, np.array([4, 0, 2]), cos, sin, False)) <= TOL
    bad = wt.tensor(np.array([7, -3, 2], np.int32), device=device)
    if device.backend.name == "cpu":
        with pytest.raises(wt.ShapeError, match="position 7 is outside"):
            wt.rope(xt, bad, ct, st_)
    else:
        got = wt.rope(xt, bad, ct, st_).numpy()
        assert rel_err(got, ref_rope(x, np.array([4, 0, 2]), cos, sin, False)) <= TOL


def test_rope_refuses_bad_arguments(device: wt.Device) -> None:
    x, pos = on(device, rnd(0, 3, 2, 8), np.zeros(3, np.int32))
    cos, sin = on(device, *rope_tables(5, 4))
    with pytest.raises(wt.ShapeError, match=r"rope: x must be \(T, H, D\)"):
        wt.rope(x[:, 0], pos, cos, sin)
    with pytest.raises(wt.ShapeError, match="rotate R = 10 dims, more than the head dim 8"):
        wt.rope(x, pos, *on(device, *rope_tables(5, 5)))
    with pytest.raises(wt.ShapeError, match=r"cos and sin must be tables of one shape \(P, R/2\)"):
        wt.rope(x, pos, cos, sin[:, :3])
    with pytest.raises(wt.DTypeError, match="cos and sin must be float32"):
        wt.rope(x, pos, cos, wt.tensor(np.ones((5, 4), np.int32), device=device))
    with pytest.raises(wt.ShapeError, match=r"pos must be an int32 tensor of shape \(3,\)"):
        wt.rope(x, pos[:2], cos, sin)
    with pytest.raises(wt.ShapeError, match=r"pos must be an int32 tensor of shape \(3,\), got float32"):
        wt.rope(x, wt.tensor(np.zeros(3, np.float32), device=device), cos, sin)
    with pytest.raises(wt.ArgumentError, match="interleaved must be True or False"):
        wt.rope(x, pos, cos, sin, interleaved=1)


# -- swiglu ---------------------------------------------------------------------------------------
@SETTINGS
@given(seed=seeds, lead=st.lists(st.integers(1, 9), min_size=0, max_size=2), f=st.integers(2, 300),
       fused=st.booleans(), dtypes=st.sampled_from(["f32", "f16", "mixed"]))
def test_swiglu(gpu: wt.Device, seed: int, lead: list[int], f: int, fused: bool, dtypes: str) -> None:
    """silu(gate) * up of two tensors or of the halves of a fused (..., 2F) gate_up (row stride 2F)."""
    if dtypes != "f32" and not gpu.has_f16:
        return
    gu = rnd(seed, *lead, 2 * f, scale=4.0)
    gu[..., 0] = -200.0  # exp(200) overflows float32: silu(-200) is -0, not NaN
    gdt, udt = {"f32": (np.float32, np.float32), "f16": (np.float16, np.float16),
                "mixed": (np.float16, np.float32)}[dtypes]
    gate, up = gu[..., :f].astype(gdt), gu[..., f:].astype(udt)
    want = ref_swiglu(gate, up)
    outs = []
    for dev in devices(gpu):
        if fused and dtypes != "mixed":
            gut = wt.tensor(gu.astype(gdt), device=dev)
            g_t, u_t = gut[..., :f], gut[..., f:]
        else:
            g_t, u_t = on(dev, gate, up)
        got = wt.swiglu(g_t, u_t).numpy()
        assert got.dtype == (np.float16 if dtypes == "f16" else np.float32) and got.shape == gate.shape
        assert np.isfinite(got).all()
        assert rel_err(got, want) <= (TOL if dtypes != "f16" else 1e-3), (dev.describe(), rel_err(got, want))
        outs.append(got)
    assert rel_err(outs[1], outs[0]) <= (TOL if dtypes != "f16" else 1e-3)


def test_swiglu_refuses_bad_arguments(device: wt.Device) -> None:
    g, u = on(device, rnd(0, 3, 8), rnd(1, 3, 7))
    with pytest.raises(wt.ShapeError, match=r"swiglu: gate \(3, 8\) and up \(3, 7\) must have the same shape"):
        wt.swiglu(g, u)
    with pytest.raises(wt.DTypeError, match="swiglu needs float32 or float16"):
        wt.swiglu(g, wt.tensor(np.ones((3, 8), np.int32), device=device))


# -- grouped-query attention ----------------------------------------------------------------------
KERNELS = {  # the kernel to force: (kernel-policy fields, head dims it takes)
    "attention": (dict(flash_min_queries=1 << 30, prefill=False, tiled=False), [1, 7, 33, *HEAD_DIMS]),
    "attention_flash": (dict(flash_min_queries=1, prefill=False, tiled=False), [4, 20, 32, 64]),
    "attention_prefill": (dict(prefill_min_queries=1, gpu_style=True, tiled=False), [16, 48, *HEAD_DIMS]),
}


@pytest.mark.parametrize("kernel", list(KERNELS))
@SETTINGS
@given(seed=seeds, t=st.integers(1, 20), extra=st.integers(0, 90), kvh=st.integers(1, 3), group=st.integers(1, 4),
       causal=st.booleans(), fused=st.booleans(), data=st.data())
def test_gqa_attention(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch, kernel: str, seed: int, t: int, extra: int,
                       kvh: int, group: int, causal: bool, fused: bool, data: st.DataObject) -> None:
    """attention with KVH key / value heads for H = group * KVH query heads, in each kernel: q, k, v
    the heads of a fused qkv (S = T) or k, v the first S rows of a cache-like (S, KVH, D)."""
    flags, dims = KERNELS[kernel]
    set_policy(monkeypatch, gpu, **flags)
    d = data.draw(st.sampled_from(dims))
    h = kvh * group
    s = t if fused else t + extra
    qkv = rnd(seed, t, h + 2 * kvh, d)
    kv = rnd(seed + 1, 2, s + 5, kvh, d)  # (a cache of s + 5 rows: the first s are attended)
    q, k, v = (qkv[:, :h], qkv[:, h:h + kvh], qkv[:, h + kvh:]) if fused else (qkv[:, :h], kv[0, :s], kv[1, :s])
    want = ref_attention(q, k, v, causal, 0.3)
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        qkvt, kvt = on(dev, qkv, kv)
        if fused:
            args = qkvt[:, :h], qkvt[:, h:h + kvh], qkvt[:, h + kvh:]
        else:
            args = qkvt[:, :h], kvt[0, :s], kvt[1, :s]
        got = wt.attention(*args, causal=causal, scale=0.3).numpy()
        assert rel_err(got, want) <= TOL, (dev.describe(), rel_err(got, want))
    assert spy.names == [kernel]


def test_gqa_prefill_float16(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    if not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    set_policy(monkeypatch, gpu, gpu_style=True, prefill_min_queries=1)
    q, k, v = (rnd(i, n, h, 128).astype(np.float16) for i, (n, h) in enumerate([(40, 8), (70, 2), (70, 2)]))
    outs = [wt.attention(*on(dev, q, k, v)).numpy() for dev in devices(gpu)]
    assert rel_err(outs[1], ref_attention(q, k, v, True, 128 ** -0.5)) <= 2e-3 and rel_err(outs[1], outs[0]) <= 2e-3


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 4), n_ctx=st.integers(1, 40), kvh=st.integers(1, 3), group=st.integers(1, 4),
       d=st.sampled_from([1, 3, 8, 33, *HEAD_DIMS]), fused=st.booleans(), data=st.data())
def test_gqa_cache_write_and_cached_attention(gpu: wt.Device, seed: int, slots: int, n_ctx: int, kvh: int,
                                              group: int, d: int, fused: bool, data: st.DataObject) -> None:
    """cache_write of KVH heads and cached_attention of H = group * KVH query heads against them, the
    rows the heads of a fused qkv; with the append fused (one row a slot) or written first."""
    h = kvh * group
    rng = np.random.default_rng(seed)
    rows = data.draw(st.integers(1, slots if fused else 6))
    slot = (rng.permutation(slots)[:rows] if fused else rng.integers(0, slots, rows)).astype(np.int32)
    pos = rng.integers(0, n_ctx + 1, rows).astype(np.int32)  # (n_ctx: past the context, not stored)
    qkv = rnd(seed, rows, h + 2 * kvh, d)
    cache = rnd(seed + 1, slots, n_ctx, kvh, d)
    outs = []
    for dev in devices(gpu):
        kc, vc, qkvt, pt, st_ = on(dev, cache, cache * 0.5, qkv, pos, slot)
        q, k, v = qkvt[:, :h], qkvt[:, h:h + kvh], qkvt[:, h + kvh:]
        a = append_and_attend(q, kc, vc, pt, st_, k, v, 0.3, fused)
        outs.append((a.numpy(), kc.numpy(), vc.numpy()))
    (a0, k0, v0), (a1, k1, v1) = outs
    assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    assert rel_err(a1, a0) <= TOL
    for t in range(rows):  # each row: attention over its slot's first pos + 1 positions
        n = min(pos[t] + 1, n_ctx)
        want = ref_attention(qkv[t:t + 1, :h], k0[slot[t], :n], v0[slot[t], :n], False, 0.3)
        assert rel_err(a0[t:t + 1], want) <= TOL and rel_err(a1[t:t + 1], want) <= TOL
        if pos[t] < n_ctx and (fused or list(slot).count(slot[t]) == 1):
            assert np.array_equal(k0[slot[t], pos[t]], qkv[t, h:h + kvh])


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 4), kvh=st.integers(1, 3), group=st.integers(1, 3),
       d=st.sampled_from([2, 6, 8, *HEAD_DIMS]), part=st.sampled_from([1.0, 0.5]), interleaved=st.booleans(),
       fused=st.booleans(), one_table=st.booleans(), data=st.data())
def test_cached_attention_with_rope(gpu: wt.Device, seed: int, slots: int, kvh: int, group: int, d: int, part: float,
                                    interleaved: bool, fused: bool, one_table: bool, data: st.DataObject) -> None:
    """cached_attention(..., rope=(cos, sin, interleaved)) = rope q and k_new at the rows' positions,
    then cached_attention (the rotated key stored); with the keys written first by cache_write(...,
    rope=...) (rows sharing slots). One launch a call where the tables are views of one tensor, rope
    launches first where they are not; against float64 numpy and the CPU device."""
    h, n_ctx = kvh * group, 12
    half = max(1, int(d // 2 * part))
    rng = np.random.default_rng(seed)
    rows = data.draw(st.integers(1, slots if fused else 5))
    slot = (rng.permutation(slots)[:rows] if fused else rng.integers(0, slots, rows)).astype(np.int32)
    pos = rng.permutation(n_ctx)[:rows].astype(np.int32)  # (distinct: no two rows store one place)
    cos, sin = rope_tables(n_ctx + 3, half)
    qkv = rnd(seed, rows, h + 2 * kvh, d)
    cache = rnd(seed + 1, slots, n_ctx, kvh, d)
    qr, kr = (ref_rope(x, pos, cos, sin, interleaved) for x in (qkv[:, :h], qkv[:, h:h + kvh]))
    kref = cache.astype(np.float64)
    for t in range(rows):
        kref[slot[t], pos[t]] = kr[t]
    outs = []
    for dev in devices(gpu):
        kc, vc, qkvt, ps, tab = on(dev, cache, cache * 0.5, qkv, np.stack([pos, slot]), np.stack([cos, sin]))
        pt, st_ = ps[0], ps[1]  # (one buffer, as the runner's: the kernels bind positions and slots once)
        cs = (tab[0], tab[1]) if one_table else tuple(on(dev, cos, sin))
        rope = (*cs, interleaved)
        q, k, v = qkvt[:, :h], qkvt[:, h:h + kvh], qkvt[:, h + kvh:]
        before = dev.stats()["dispatches"]
        if fused:
            a = wt.cached_attention(q, kc, vc, pt, st_, scale=0.3, k_new=k, v_new=v, rope=rope)
        else:
            wt.cache_write(kc, k, pt, st_, rope=rope)
            wt.cache_write(vc, v, pt, st_)
            a = wt.cached_attention(q, kc, vc, pt, st_, scale=0.3, rope=rope)
        if dev.backend.name == "wgpu" and one_table:
            assert dev.stats()["dispatches"] - before == (1 if fused else 3)
        outs.append((a.numpy(), kc.numpy()))
    (a0, k0), (a1, k1) = outs
    for got in (k0, k1):  # the stored keys: rotated; the rest of the cache untouched
        assert rel_err(got, kref) <= TOL
    assert rel_err(a1, a0) <= TOL
    for t in range(rows):
        n = pos[t] + 1
        vals = (cache * 0.5).astype(np.float64)
        for r in range(rows):
            vals[slot[r], pos[r]] = qkv[r, h + kvh:]
        want = ref_attention(qr[t:t + 1], kref[slot[t], :n], vals[slot[t], :n], False, 0.3)
        assert rel_err(a0[t:t + 1], want) <= TOL and rel_err(a1[t:t + 1], want) <= TOL


def test_rope_fusion_refuses_bad_tables(device: wt.Device) -> None:
    q, kc = on(device, rnd(0, 2, 2, 8), rnd(1, 1, 4, 2, 8))
    pos = wt.tensor(np.zeros(2, np.int32), device=device)
    cos, sin = on(device, *rope_tables(4, 4))
    with pytest.raises(wt.ArgumentError, match=r"cached_attention: rope must be \(cos, sin, interleaved\)"):
        wt.cached_attention(q, kc, kc, pos, pos, rope=(cos, sin))
    with pytest.raises(wt.ShapeError, match="rotate R = 10 dims, more than the head dim 8"):
        wt.cache_write(kc, q, pos, pos, rope=(*on(device, *rope_tables(4, 5)), False))


def test_cache_views_with_an_offset(gpu: wt.Device) -> None:
    """Caches that are views into a larger tensor (one layer of (layers, n_slots, n_ctx, KVH, D))."""
    big = rnd(0, 3, 2, 6, 2, 16)
    q, kv = rnd(1, 2, 4, 16), rnd(2, 2, 2, 16)
    pos, slot = np.array([5, 2], np.int32), np.array([1, 0], np.int32)
    outs = []
    for dev in devices(gpu):
        bt, vt, qt, kvt, pt, st_ = on(dev, big, big * 0.5, q, kv, pos, slot)
        a = wt.cached_attention(qt, bt[1], vt[2], pt, st_, k_new=kvt, v_new=kvt)
        wt.cache_write(bt[2], kvt, pt, st_)
        outs.append((a.numpy(), bt.numpy(), vt.numpy()))
    assert rel_err(outs[1][0], outs[0][0]) <= TOL
    assert np.array_equal(outs[1][1], outs[0][1]) and np.array_equal(outs[1][2], outs[0][2])
    assert np.array_equal(outs[0][1][0], big[0]) and np.array_equal(outs[0][1][1][1, 5], kv[0])


def test_out_of_range_slots(device: wt.Device) -> None:
    """A slot outside the cache: the CPU refuses it; a WebGPU kernel skips the row (nothing is
    written anywhere, the row's attention is NaN), never indexing outside the cache."""
    kc = wt.tensor(rnd(0, 2, 4, 1, 8), device=device)
    src = wt.tensor(rnd(1, 2, 1, 8), device=device)
    pos = wt.tensor(np.array([1, 1], np.int32), device=device)
    for bad in (2, -1):
        slot = wt.tensor(np.array([0, bad], np.int32), device=device)
        if device.backend.name == "cpu":
            with pytest.raises(wt.ShapeError, match=f"slot {bad} is out of range for a cache of 2 slots"):
                wt.cache_write(kc, src, pos, slot)
            with pytest.raises(wt.ShapeError, match="out of range"):
                wt.cached_attention(wt.tensor(rnd(2, 2, 2, 8), device=device), kc, kc, pos, slot).numpy()
        else:
            before = kc.numpy()
            wt.cache_write(kc, src, pos, slot)
            after = kc.numpy()
            assert np.array_equal(after[0, 1], src.numpy()[0]) and np.array_equal(after[1], before[1])
            vc = wt.tensor(rnd(3, 2, 4, 1, 8), device=device)
            a = wt.cached_attention(wt.tensor(rnd(2, 2, 2, 8), device=device), kc, vc, pos, slot,
                                    k_new=src, v_new=src).numpy()
            assert np.isfinite(a[0]).all() and np.isnan(a[1]).all()
            assert np.array_equal(kc.numpy()[1], after[1])


def test_gqa_refuses_bad_shapes(device: wt.Device) -> None:
    q, k = on(device, rnd(0, 3, 6, 8), rnd(1, 5, 4, 8))
    with pytest.raises(wt.ShapeError, match="6 query heads do not split evenly over 4 key/value heads"):
        wt.attention(q, k, k)
    with pytest.raises(wt.ShapeError, match="disagree on the head dim"):
        wt.attention(q, *on(device, rnd(1, 5, 3, 4), rnd(1, 5, 3, 4)))
    with pytest.raises(wt.ShapeError, match="disagree on the head dim, or k and v differ"):
        wt.attention(q, k[:, :3], k[:, :2])
    kc = wt.zeros((2, 8, 4, 8), device=device)
    pos = wt.tensor(np.zeros(3, np.int32), device=device)
    with pytest.raises(wt.ShapeError, match="cached_attention: 6 query heads do not split evenly over 4"):
        wt.cached_attention(q, kc, kc, pos, pos)
    kc3 = wt.zeros((2, 8, 3, 8), device=device)
    with pytest.raises(wt.ShapeError, match=r"k_new and v_new must be \(T, KVH, D\) = \(3, 3, 8\)"):
        wt.cached_attention(q, kc3, kc3, pos, pos, k_new=q, v_new=q)
    with pytest.raises(wt.ShapeError, match="KV cache"):
        wt.cache_write(kc3, q, pos, pos)


# -- the CPU device's graphs: replays are the eager ops bit for bit --------------------------------
def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@SETTINGS
@given(seed=seeds, t=st.integers(1, 5), kvh=st.integers(1, 3), group=st.integers(1, 3), d=st.sampled_from([2, 8, 64]),
       interleaved=st.booleans(), f16=st.booleans())
def test_cpu_replay_is_eager_bit_for_bit(seed: int, t: int, kvh: int, group: int, d: int, interleaved: bool,
                                         f16: bool) -> None:
    """A Llama-style block captured on the CPU (its in-place forms: rms_norm, linear with the RMS
    prologue, rope of strided heads, swiglu of fused halves, grouped-query cached attention), replayed
    with fresh inputs and positions: the numbers of the eager ops, bit for bit."""
    cpu = wt.Device.cpu()
    h, slots, n_ctx = kvh * group, 6, 12
    c, f = h * d, 3 * d
    dtype = np.float16 if f16 else np.float32
    rng = np.random.default_rng(seed)
    cos, sin = rope_tables(n_ctx, d // 2)

    def fresh() -> list[np.ndarray]:
        return [rnd(int(rng.integers(1 << 30)), t, c).astype(dtype), rng.permutation(n_ctx)[:t].astype(np.int32),
                rng.permutation(slots)[:t].astype(np.int32)]

    weights = [rnd(seed + i, *shape) for i, shape in
               enumerate([(c,), (c, (h + 2 * kvh) * d), (d,), (c, 2 * f), (f, c)])]
    caches = [rnd(seed + 9, slots, n_ctx, kvh, d) for _ in range(2)]

    def block(x: wt.Tensor, pos: wt.Tensor, slot: wt.Tensor, kc: wt.Tensor, vc: wt.Tensor) -> list[wt.Tensor]:
        g1, wqkv, qn, wgu, wdown = (wt.tensor(w, device=cpu) for w in weights)
        qkv = wt.linear(x, wqkv, rms=(g1, 1e-5)).reshape(t, h + 2 * kvh, d)
        q = wt.rope(wt.rms_norm(qkv[:, :h], qn, 1e-6), pos, *on(cpu, cos, sin), interleaved=interleaved)
        k = wt.rope(qkv[:, h:h + kvh], pos, *on(cpu, cos, sin), interleaved=interleaved)
        a = wt.cached_attention(q, kc, vc, pos, slot, k_new=k, v_new=qkv[:, h + kvh:])
        gu = wt.linear(wt.rms_norm(a.reshape(t, c), g1, 1e-5), wgu)
        return [q, k, a, wt.linear(wt.swiglu(gu[:, :f], gu[:, f:]), wdown, residual=x)]

    inputs = on(cpu, *fresh(), *caches)
    g = cpu.capture(lambda: block(*inputs))
    eager_caches = on(cpu, *caches)
    for _ in range(3):
        new = fresh()
        for tt, a in zip(inputs, new, strict=False):
            wt.copy_into(tt, wt.tensor(a, device=cpu))
        got = [o.numpy() for o in g.replay()]
        want = [o.numpy() for o in block(*on(cpu, *new), *eager_caches)]
        assert all(same(x, y) for x, y in zip(got, want, strict=True))
        assert all(same(x.numpy(), y.numpy()) for x, y in zip(inputs[3:], eager_caches, strict=True))
    g.release()


# -- a device without the optional features -------------------------------------------------------
@pytest.mark.parametrize("gpu_style", [False, True], ids=["cpu-kernels", "gpu-kernels"])
def test_llama_ops_without_optional_features(gpu_style: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new kernel and variant builds and runs with `subgroup` and `shader-f16` withheld."""
    bare = wt.Device.wgpu(software=True, features=())
    set_policy(monkeypatch, bare, gpu_style=gpu_style, prefill_min_queries=1)
    assert not bare.has_subgroups and not bare.has_f16
    H, KVH, D, T = 6, 2, 64, 5
    cos, sin = rope_tables(16, D // 2)
    qkv, g, w = rnd(0, T, H + 2 * KVH, D), rnd(1, D), rnd(2, D, 3 * D)
    pos, slot = np.arange(T, dtype=np.int32) + 3, np.arange(T, dtype=np.int32)
    cache = rnd(3, T, 16, KVH, D)

    def run(dev: wt.Device) -> list[np.ndarray]:
        qkvt, gt, wk, pt, st_, ct, snt, kc, vc = on(dev, qkv, g, w.T.copy(), pos, slot, cos, sin, cache, cache)
        q = wt.rope(wt.rms_norm(qkvt[:, :H], gt, 1e-6), pt, ct, snt)
        k = wt.rope(qkvt[:, H:H + KVH], pt, ct, snt, interleaved=True)
        att = wt.attention(q, k, qkvt[:, H + KVH:])
        dec = wt.cached_attention(q, kc, vc, pt, st_, k_new=k, v_new=qkvt[:, H + KVH:])
        x = att.reshape(T, H * D)[:, :D]
        h = wt.linear(x, wk.T, rms=(gt, 1e-6))
        return [t.numpy() for t in (q, k, att, dec, h, wt.swiglu(h[:, :D], h[:, D:2 * D]))]

    for got, want in zip(run(bare), run(wt.Device.cpu()), strict=True):
        assert rel_err(got, want) <= TOL


def test_no_kernel_calls_subgroup_operations_unless_asked() -> None:
    """Without the SG define no kernel's source has a subgroup call (indented `// #if` directives
    included), so a device without the feature compiles every kernel."""
    import re

    from webtensor.backends.wgpu.context import KERNEL_DIR, kernel_source
    from webtensor.backends.wgpu.signatures import SIGNATURES

    for stem in SIGNATURES:
        code = re.sub(r"//[^\n]*", "", kernel_source(stem, {}))
        assert not re.search(r"\bsubgroup\w*\s*\(", code), stem
    assert "subgroupShuffleXor" in kernel_source("attention_prefill", {"SG": "true"})
    assert (KERNEL_DIR / "attention_prefill.wgsl").read_text().count("    // #if SG") == 1  # (an indented one)
