"""The ops the Gemma / Phi-3 / Mistral families add: geglu (alone and as linear's gated prologue, float and q8_0
weights), softcap, and attention with a sliding window and a score soft-cap (`attention`, `cached_attention`, the
decode step's fused append). Each against a float64 numpy reference written here (fp32 norm-wise relative error
<= 1e-5), on the CPU device and on WebGPU (lavapipe under CI=true, in the CPU-adapter and the GPU kernel
variants), on fresh random inputs of odd shapes and strided views; inside captured graphs replayed with new
positions; and the errors bad arguments get."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from op_fixtures import on, rnd
from test_llama_ops import Launches
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor.quant import quantize

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TOL = 1e-5
seeds = st.integers(0, 2**32 - 1)


def devices(gpu: wt.Device) -> list[wt.Device]:
    return [wt.Device.cpu(), gpu]


@pytest.fixture(params=[False, True], ids=["cpu-kernels", "gpu-kernels"])
def style(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, gpu: wt.Device) -> bool:
    set_policy(monkeypatch, gpu, gpu_style=request.param)
    return request.param


# -- float64 references ---------------------------------------------------------------------------
def close(got: np.ndarray, want: np.ndarray, scale: float) -> bool:
    """fp32 norm-wise relative error <= TOL, with an absolute floor of TOL x `scale` (the inputs' magnitude: a
    gate far below zero gives outputs near 0 whose relative error says nothing)."""
    diff = np.linalg.norm(np.asarray(got, np.float64) - want)
    return bool(diff <= TOL * (np.linalg.norm(want) + scale * np.sqrt(want.size)))


def ref_gelu_tanh(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3)))


def ref_geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return ref_gelu_tanh(g) * u.astype(np.float64)


def ref_softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x.astype(np.float64) / cap)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, at: np.ndarray, window: int | None,
                  cap: float | None) -> np.ndarray:
    """q (T, H, D) at positions `at` (T,), k and v (S, KVH, D) at positions 0..S-1: query t sees keys j <= at[t]
    (and j > at[t] - window); scores soft-capped before the mask, as transformers' eager attention."""
    H, KVH = q.shape[1], k.shape[1]
    kv = np.arange(H) // (H // KVH)
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k[:, kv].astype(np.float64)) * scale  # (H, T, S)
    if cap is not None:
        s = cap * np.tanh(s / cap)
    j = np.arange(k.shape[0])[None, :]
    seen = j <= at[:, None]
    if window is not None:
        seen &= j > at[:, None] - window
    s = np.where(seen[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v[:, kv].astype(np.float64))


def attention_magnitude(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, at: np.ndarray,
                        window: int | None, cap: float | None) -> np.ndarray:
    """tolerance.attention_scale for ref_attention's masks: P |V| (1 + M), M the row's largest sum of |q| |k|
    scale (a soft-cap's slope is at most 1, so it only shrinks a score's rounding)."""
    H, KVH = q.shape[1], k.shape[1]
    kv = np.arange(H) // (H // KVH)
    m = np.einsum("thd,shd->ths", np.abs(q.astype(np.float64)), np.abs(k[:, kv].astype(np.float64))) * abs(scale)
    return ref_attention(q, k, np.abs(v), scale, at, window, cap) * (1.0 + m.max(-1)[:, :, None])


# -- geglu and softcap ----------------------------------------------------------------------------
@SETTINGS
@given(seed=seeds, lead=st.lists(st.integers(1, 9), min_size=0, max_size=2), f=st.integers(2, 300),
       fused=st.booleans())
def test_geglu(gpu: wt.Device, seed: int, lead: list[int], f: int, fused: bool) -> None:
    """gelu_tanh(gate) * up of two tensors or of the halves of a fused (..., 2F) gate_up (row stride 2F)."""
    gu = rnd(seed, *lead, 2 * f, scale=4.0)
    gu[..., 0] = -200.0  # gelu_tanh(-200) is -0, not NaN
    want = ref_geglu(gu[..., :f], gu[..., f:])
    outs = []
    for dev in devices(gpu):
        if fused:
            gut = wt.tensor(gu, device=dev)
            g_t, u_t = gut[..., :f], gut[..., f:]
        else:
            g_t, u_t = on(dev, np.ascontiguousarray(gu[..., :f]), np.ascontiguousarray(gu[..., f:]))
        got = wt.geglu(g_t, u_t).numpy()
        assert got.shape == want.shape and np.isfinite(got).all()
        assert close(got, want, scale=float(np.abs(gu).max() ** 2)), dev.describe()
        outs.append(got)
    assert close(outs[1], outs[0], scale=float(np.abs(gu).max() ** 2))


@SETTINGS
@given(seed=seeds, m=st.integers(1, 12), f=st.sampled_from([4, 8, 36, 64, 100]), n=st.integers(1, 40),
       bias=st.booleans(), res=st.booleans(), stack=st.booleans(), quant=st.booleans())
def test_linear_with_geglu_prologue(gpu: wt.Device, style: bool, seed: int, m: int, f: int, n: int, bias: bool,
                                    res: bool, stack: bool, quant: bool) -> None:
    """linear(gu, w, glu="geglu") = geglu(gu[..., :F], gu[..., F:]) @ w (+ bias) (+ residual): the GEMV reads
    its input through the gate (float and q8_0 weights); other products run a geglu launch first."""
    if quant and f % 32:
        f = 64
    gu, w, b, r = rnd(seed, m, 2 * f, scale=2.0), rnd(seed + 1, f, n), rnd(seed + 2, n), rnd(seed + 3, m, n)
    q = quantize(np.ascontiguousarray(w.T), "Q8_0") if quant else None
    w_used = q.dequantize().T.astype(np.float64) if q is not None else w.astype(np.float64)
    want = ref_geglu(gu[:, :f], gu[:, f:]) @ w_used + (b if bias else 0.0) + (r if res else 0.0)
    for dev in devices(gpu):
        gut, wk, bt, rt = on(dev, gu, w.T.copy(), b, r)
        shape = (m, 1) if stack else (m,)
        weight = q if q is not None else wk.T
        got = wt.linear(gut.reshape(*shape, 2 * f), weight, bt if bias else None,
                        residual=rt.reshape(*shape, n) if res else None, glu="geglu")
        assert got.shape == (*shape, n)
        mag = linear_scale(np.abs(gu[:, :f]) * np.abs(gu[:, f:]), w_used, b if bias else None, r if res else None)
        assert_close(got.numpy().reshape(m, n), want, mag, rtol=TOL, what=dev.describe())  # (the gate's scale:
        # its input's, as tolerance's docstring says of an activation)


@SETTINGS
@given(seed=seeds, shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), cap=st.sampled_from([0.5, 30.0, 50.0]),
       transposed=st.booleans())
def test_softcap(gpu: wt.Device, seed: int, shape: list[int], cap: float, transposed: bool) -> None:
    x = rnd(seed, *shape, scale=40.0)
    outs = []
    for dev in devices(gpu):
        t = wt.tensor(x, device=dev)
        if transposed and t.ndim > 1:  # a strided view
            t = t.transpose(0, t.ndim - 1)
        got = wt.softcap(t, cap).numpy()
        want = ref_softcap(np.swapaxes(x, 0, -1) if transposed and x.ndim > 1 else x, cap)
        mag = np.abs(np.swapaxes(x, 0, -1) if transposed and x.ndim > 1 else x)  # (tanh's slope is at most 1)
        assert_close(got, want, mag, rtol=TOL)
        assert np.abs(got).max() <= cap
        outs.append(got)
    assert_close(outs[1], outs[0], mag, rtol=TOL)


def test_softcap_and_geglu_refuse_bad_arguments(device: wt.Device) -> None:
    x = wt.tensor(rnd(0, 3, 8), device=device)
    for cap in (0.0, -1.0, float("inf"), True, "30"):
        with pytest.raises(wt.ArgumentError, match="softcap must be a finite number > 0"):
            wt.softcap(x, cap)  # type: ignore[arg-type]
    with pytest.raises(wt.ShapeError, match=r"geglu: gate \(3, 8\) and up \(3, 7\) must have the same shape"):
        wt.geglu(x, wt.tensor(rnd(1, 3, 7), device=device))


# -- attention with a sliding window and a soft-cap -----------------------------------------------
NO_FLASH = 1 << 30
KERNELS = {  # the prefill attention kernels that take a window and a soft-cap (kernel-policy fields to force them)
    "attention": dict(tiled=False, flash_min_queries=NO_FLASH),
    "attention_flash": dict(tiled=False, flash_min_queries=1),
    "attention_tiled": dict(tiled=True, tiled_min_queries=1, gpu_style=True, flash_min_queries=NO_FLASH),
}


@pytest.mark.parametrize("kernel", list(KERNELS))
@SETTINGS
@given(seed=seeds, t=st.integers(1, 20), extra=st.integers(0, 40), kvh=st.integers(1, 3), group=st.integers(1, 3),
       d=st.sampled_from([4, 16, 32, 64]), window=st.one_of(st.none(), st.integers(1, 30)),
       cap=st.one_of(st.none(), st.sampled_from([0.3, 50.0])))
def test_attention_with_window_and_softcap(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch, kernel: str, seed: int,
                                           t: int, extra: int, kvh: int, group: int, d: int, window: int | None,
                                           cap: float | None) -> None:
    """The prompt path: T queries, the last of S positions, each sees the last `window` keys up to its own (the
    other prefill kernel, attention_prefill, knows neither option: the planner does not ask it)."""
    set_policy(monkeypatch, gpu, **KERNELS[kernel])
    if window is None and cap is None:
        window = 3
    h, s = kvh * group, t + extra
    q, k, v = rnd(seed, t, h, d, scale=3.0), rnd(seed + 1, s, kvh, d), rnd(seed + 2, s, kvh, d)
    want = ref_attention(q, k, v, 0.7, np.arange(t) + (s - t), window, cap)
    mag = attention_magnitude(q, k, v, 0.7, np.arange(t) + (s - t), window, cap)
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        got = wt.attention(*on(dev, q, k, v), causal=True, scale=0.7, window=window, softcap=cap).numpy()
        assert_close(got, want, mag, rtol=TOL, what=dev.describe())
    assert spy.names == [kernel if d % 16 == 0 or kernel != "attention_tiled" else "attention"]  # (tiled: D % 16)


CHUNK_KERNELS = {  # chunk_attention's kernels (kernel-policy fields to force them)
    "attention_tiled_cache": dict(gpu_style=True, tiled=True, flash_min_queries=NO_FLASH),
    "attention_flash_cache": dict(gpu_style=False, flash_min_queries=1),
    "cached_attention": dict(gpu_style=False, flash_min_queries=NO_FLASH),
}


@pytest.mark.parametrize("kernel", list(CHUNK_KERNELS))
@settings(SETTINGS, max_examples=10)
@given(seed=seeds, t=st.integers(1, 80), p0=st.integers(0, 90), pad=st.integers(0, 3), kvh=st.integers(1, 2),
       group=st.integers(1, 3), d=st.sampled_from([4, 16, 32, 64]), window=st.integers(1, 70),
       cap=st.one_of(st.none(), st.sampled_from([0.3, 50.0])), past=st.booleans())
def test_chunk_attention_with_window_and_softcap(gpu: wt.Device, monkeypatch: pytest.MonkeyPatch, kernel: str,
                                                 seed: int, t: int, p0: int, pad: int, kvh: int, group: int, d: int,
                                                 window: int, cap: float | None, past: bool) -> None:
    """A prompt chunk over the KV cache: rows at positions p0 .. p0 + t - 1 of one slot (after a cached prefix,
    `pad` padding rows repeating the last, with `past` the last one past the context) each see the last `window`
    positions up to their own, scores soft-capped; windows that start inside, before and across the query tiles
    and the key tiles (64 rows, 16..64 keys)."""
    set_policy(monkeypatch, gpu, **CHUNK_KERNELS[kernel])
    h, n_ctx = kvh * group, p0 + t + 2
    q = rnd(seed, t + pad, h, d, scale=3.0)
    q[t:] = q[t - 1]
    kc, vc = rnd(seed + 1, 2, n_ctx, kvh, d), rnd(seed + 2, 2, n_ctx, kvh, d)
    pos = np.concatenate([np.arange(p0, p0 + t), np.full(pad, p0 + t - 1)]).astype(np.int32)
    if past and window > 4:  # (its window reaches back into the cache: a row seeing nothing is no one's)
        pos[-1] = n_ctx + 3
    slot = np.ones(t + pad, np.int32)
    want = ref_attention(q, kc[1], vc[1], 0.7, pos, window, cap)
    mag = attention_magnitude(q, kc[1], vc[1], 0.7, pos, window, cap)
    spy = Launches(gpu, monkeypatch)
    for dev in devices(gpu):
        got = wt.chunk_attention(*on(dev, q, kc, vc, pos, slot), scale=0.7, window=window, softcap=cap).numpy()
        assert_close(got, want, mag, rtol=TOL, what=dev.describe())
    attending = [n for n in spy.names if "attention" in n]  # (the others: copies of the positions and slots)
    assert attending == [kernel if kernel != "attention_tiled_cache" or d % 16 == 0 else "cached_attention"]


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 4), n_ctx=st.integers(1, 40), kvh=st.integers(1, 3), group=st.integers(1, 4),
       d=st.sampled_from([1, 3, 8, 33, 64, 128]), fused=st.booleans(), window=st.integers(1, 12),
       cap=st.one_of(st.none(), st.sampled_from([0.3, 50.0])), data=st.data())
def test_cached_attention_with_window_and_softcap(gpu: wt.Device, seed: int, slots: int, n_ctx: int, kvh: int,
                                                  group: int, d: int, fused: bool, window: int, cap: float | None,
                                                  data: st.DataObject) -> None:
    """Decode rows: each sees positions pos - window + 1 .. pos of its slot, the append fused or written first."""
    h = kvh * group
    rng = np.random.default_rng(seed)
    rows = data.draw(st.integers(1, slots if fused else 6))
    slot = (rng.permutation(slots)[:rows] if fused else rng.integers(0, slots, rows)).astype(np.int32)
    pos = rng.integers(0, n_ctx, rows).astype(np.int32)
    qkv = rnd(seed, rows, h + 2 * kvh, d, scale=2.0)
    cache = rnd(seed + 1, slots, n_ctx, kvh, d)
    outs = []
    for dev in devices(gpu):
        kc, vc, qkvt, pt, st_ = on(dev, cache, cache * 0.5, qkv, pos, slot)
        q, k, v = qkvt[:, :h], qkvt[:, h:h + kvh], qkvt[:, h + kvh:]
        if fused:
            a = wt.cached_attention(q, kc, vc, pt, st_, scale=0.3, k_new=k, v_new=v, window=window, softcap=cap)
        else:
            wt.cache_write(kc, k, pt, st_)
            wt.cache_write(vc, v, pt, st_)
            a = wt.cached_attention(q, kc, vc, pt, st_, scale=0.3, window=window, softcap=cap)
        outs.append((a.numpy(), kc.numpy(), vc.numpy()))
    (a0, k0, v0), (a1, _, _) = outs
    for i in range(rows):
        p, n = int(pos[i]), int(pos[i]) + 1
        args = (qkv[i:i + 1, :h], k0[slot[i], :n], v0[slot[i], :n], 0.3, np.array([p]), window, cap)
        want, mag = ref_attention(*args), attention_magnitude(*args)
        assert_close(a0[i:i + 1], want, mag, rtol=TOL)
        assert_close(a1[i:i + 1], want, mag, rtol=TOL)


def test_windowed_attention_replays_with_new_positions(device: wt.Device) -> None:
    """A captured decode step with a window, replayed as positions move past it: each replay equals the eager op."""
    kvh, h, d, window = 2, 4, 16, 5
    cache = rnd(0, 1, 24, kvh, d)
    q, k, v = rnd(1, 1, h, d), rnd(2, 1, kvh, d), rnd(3, 1, kvh, d)
    kc, vc, qt, kt, vt = on(device, cache, cache * 0.5, q, k, v)
    pos, slot = on(device, np.array([0], np.int32), np.array([0], np.int32))
    graph = device.capture(lambda: wt.cached_attention(qt, kc, vc, pos, slot, k_new=kt, v_new=vt, window=window,
                                                       softcap=2.0))
    for p in (3, 9, 17):
        device.backend.upload_into(pos, np.array([p], np.int32).tobytes())
        got = graph.replay().numpy()
        eager = wt.cached_attention(qt, kc, vc, pos, slot, window=window, softcap=2.0).numpy()
        full = wt.cached_attention(qt, kc, vc, pos, slot, softcap=2.0).numpy()
        assert np.array_equal(got, eager) and (p < window or not np.array_equal(got, full))


def test_window_and_softcap_refused(device: wt.Device) -> None:
    q = wt.tensor(rnd(0, 3, 2, 4), device=device)
    kc = wt.tensor(rnd(1, 1, 8, 2, 4), device=device)
    pos, slot = on(device, np.zeros(3, np.int32), np.zeros(3, np.int32))
    for window in (0, -2, 1.5, True):
        with pytest.raises(wt.ArgumentError, match="window must be an integer >= 1 or None"):
            wt.attention(q, q, q, window=window)  # type: ignore[arg-type]
        with pytest.raises(wt.ArgumentError, match="window must be an integer >= 1 or None"):
            wt.cached_attention(q, kc, kc, pos, slot, window=window)  # type: ignore[arg-type]
    with pytest.raises(wt.ArgumentError, match="a sliding window needs causal attention"):
        wt.attention(q, q, q, causal=False, window=2)
    with pytest.raises(wt.ArgumentError, match="softcap must be a finite number > 0"):
        wt.cached_attention(q, kc, kc, pos, slot, softcap=0.0)
