"""Parity of the ops a decode step and a prompt chunk are made of (cache_write, cached_attention with and
without the fused append, chunk_attention, advance_tokens, linear with a layer-norm prologue, the two-stage
argmax) against the numpy reference, in the CPU-adapter and the GPU kernel variants; and graphs: captured once,
replayed with state on the device, the same results as running the ops again, their intermediates' buffers
reused within the graph."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from op_fixtures import append_and_attend, on, rnd
from tolerance import assert_close, cached_attention_scale, layer_norm_scale, linear_scale

import webtensor as wt
from webtensor.backends.wgpu.ops import TILED_CACHE_EXTRA_BYTES, tiled_tile_bytes

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
seeds = st.integers(0, 2**32 - 1)


@pytest.fixture(params=[False, True], ids=["cpu-kernels", "gpu-kernels"])
def style(request, monkeypatch, gpu):
    set_policy(monkeypatch, gpu, gpu_style=request.param)
    return request.param


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 4), n_ctx=st.integers(1, 40), h=st.integers(1, 4), d=st.integers(1, 40),
       fused=st.booleans(), data=st.data())
def test_cache_write_and_cached_attention(gpu, style, seed, slots, n_ctx, h, d, fused, data):
    rng = np.random.default_rng(seed)
    rows = data.draw(st.integers(1, slots if fused else 6))  # (fused: one row a slot)
    slot = (rng.permutation(slots)[:rows] if fused else rng.integers(0, slots, rows)).astype(np.int32)
    pos = rng.integers(0, n_ctx + 1, rows).astype(np.int32)  # (n_ctx: past the context, not stored)
    qkv = rnd(seed, rows, 3, h, d)  # the fused projection's rows, viewed per head
    cache = rnd(seed + 1, slots, n_ctx, h, d)
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        kc, vc, qkvt, pt, st_ = on(dev, cache, cache * 0.5, qkv, pos, slot)
        q, k, v = qkvt[:, 0], qkvt[:, 1], qkvt[:, 2]
        a = append_and_attend(q, kc, vc, pt, st_, k, v, 0.3, fused)
        outs.append((a.numpy(), kc.numpy(), vc.numpy()))
    (a0, k0, v0), (a1, k1, v1) = outs
    assert np.array_equal(k0, k1) and np.array_equal(v0, v1)
    mag = cached_attention_scale(qkv[:, 0], k0, v0, pos, slot, 0.3)  # (a one-dim head can cancel to ~0)
    assert_close(a1, a0, mag)
    # the reference itself: row t's output is attention over its slot's first pos + 1 positions
    t = 0
    n = min(pos[t] + 1, n_ctx)
    kk, vv = k0[slot[t], :n], v0[slot[t], :n]  # (n, h, d)
    s = np.einsum("hd,nhd->hn", qkv[t, 0], kk) * np.float32(0.3)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("hn,nhd->hd", p / p.sum(-1, keepdims=True), vv)
    assert_close(a0[t], want, mag[t])


def test_cached_ops_refuse_bad_arguments(device):
    kc = wt.zeros((2, 8, 2, 4), device=device)
    q = wt.zeros((3, 2, 4), device=device)
    pos = wt.tensor(np.zeros(3, np.int32), device=device)
    with pytest.raises(wt.ShapeError, match="pos must be an int32 tensor of shape \\(3,\\)"):
        wt.cached_attention(q, kc, kc, wt.tensor(np.zeros(2, np.int32), device=device), pos)
    with pytest.raises(wt.ShapeError, match="KV cache"):
        wt.cache_write(wt.zeros((2, 8, 2, 5), device=device), q, pos, pos)
    with pytest.raises(wt.ArgumentError, match="both k_new and v_new"):
        wt.cached_attention(q, kc, kc, pos, pos, k_new=q)


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 3), n_ctx=st.integers(1, 9), bad=st.sampled_from([-1, 0, 1, 1000]),
       bad_pos=st.booleans(), fused=st.booleans())
def test_bad_slots_and_positions_touch_nothing(gpu, style, seed, slots, n_ctx, bad, bad_pos, fused):
    """A row whose slot is out of range (or whose position is negative) writes nothing and reads
    nothing on WebGPU (GPU data is never trusted as an index: the kernels run without the shader
    compiler's bounds checks); the good rows are exactly the reference's."""
    rng = np.random.default_rng(seed)
    good = rng.permutation(slots)[:2].astype(np.int32)
    slot = np.concatenate([good, [slots + bad if bad >= 0 else -1]]).astype(np.int32)
    pos = rng.integers(0, n_ctx, len(slot)).astype(np.int32)
    if bad_pos:  # a negative position in a valid slot instead
        slot[-1], pos[-1] = good[0], -1 - abs(bad)
        if fused:
            slot[-1] = slots  # (the fused append needs distinct slots: keep the bad row's out of range)
    k, v = rnd(seed, len(slot), 2, 4), rnd(seed + 1, len(slot), 2, 4)
    cache = rnd(seed + 2, slots, n_ctx, 2, 4)
    kc, vc, kt, vt, pt, st_ = on(gpu, cache, cache * 0.5, k, v, pos, slot)
    a = append_and_attend(kt, kc, vc, pt, st_, kt, vt, 0.5, fused).numpy()
    n = len(good)  # the reference on the good rows alone
    kc0, vc0, kt0, vt0, pt0, st0 = on(wt.Device.cpu(), cache, cache * 0.5, k[:n], v[:n], pos[:n], slot[:n])
    want = append_and_attend(kt0, kc0, vc0, pt0, st0, kt0, vt0, 0.5, fused).numpy()
    assert np.array_equal(kc.numpy(), kc0.numpy()) and np.array_equal(vc.numpy(), vc0.numpy())
    assert_close(a[:n], want, cached_attention_scale(k[:n], kc0.numpy(), vc0.numpy(), pos[:n], slot[:n], 0.5))
    assert np.isnan(a[n]).all()  # attended to nothing


def chunk_reference(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: np.ndarray, s: int,
                    scale: float) -> np.ndarray:
    """float64 attention of rows q (T, H, D) of the sequence in slot s: row t over its positions 0..pos[t] (at most
    the cache's n_ctx), query head h on KV head h // (H // KVH)."""
    T, H, _ = q.shape
    G = H // kc.shape[2]
    out = np.empty(q.shape)
    for t in range(T):
        n = min(int(pos[t]) + 1, kc.shape[1])
        k = np.repeat(kc[s, :n].astype(np.float64), G, axis=1)  # (n, H, D)
        v = np.repeat(vc[s, :n].astype(np.float64), G, axis=1)
        sc = np.einsum("hd,nhd->hn", q[t].astype(np.float64), k) * scale
        e = np.exp(sc - sc.max(-1, keepdims=True))
        out[t] = np.einsum("hn,nhd->hd", e / e.sum(-1, keepdims=True), v)
    return out


@pytest.fixture
def launched(monkeypatch):
    """The kernel files launched from now on, in order (every WebGPU device)."""
    from webtensor.backends.wgpu.context import WgpuContext

    names: list[str] = []
    launch = WgpuContext.launch

    def spy(self, kernel, *args):
        names.append(kernel.name.split("-")[0])
        launch(self, kernel, *args)

    monkeypatch.setattr(WgpuContext, "launch", spy)
    return names


@pytest.mark.parametrize("subgroups", [True, False])
@settings(SETTINGS, max_examples=12)
@given(seed=seeds, T=st.integers(1, 150), p0=st.integers(0, 100), pad=st.integers(0, 9), kvh=st.integers(1, 3),
       G=st.sampled_from([1, 2, 3]), D=st.sampled_from([8, 16, 20, 32, 48, 64, 80, 128]),
       keys=st.sampled_from([16, 32, 64]), f16=st.booleans(), slots=st.integers(1, 3), past=st.booleans())
def test_chunk_attention(gpu, style, monkeypatch, launched, subgroups, seed, T, p0, pad, kvh, G, D, keys, f16, slots,
                         past):
    """chunk_attention against float64 numpy and against the CPU reference: a prompt chunk of T rows (q a strided view:
    the fused qkv's middle third) at positions p0.. of one slot of (slots, n_ctx, KVH, D) caches (grouped-query:
    H = G KVH), its last `pad` rows repeating the last position (a graph's padding rows), with `past` the last
    row past the context (it sees all n_ctx positions); q float32 or float16; the GPU kernel
    (attention_tiled_cache.wgsl, tiles of `keys` keys, row reductions by subgroup shuffles or through workgroup
    memory) where the policy and shapes allow it (head dims that are multiples of 16 on GPU-style plans), else
    the CPU adapters' (attention_flash_cache.wgsl: float32, head dims that are multiples of 4 up to 64), else
    cached_attention's kernel."""
    if f16 and not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    if subgroups and not gpu.ctx.has_subgroups:
        pytest.skip("this adapter has no subgroups")
    set_policy(monkeypatch, gpu, tiled_keys=(keys,))
    monkeypatch.setattr(gpu.ctx, "subgroup_size", 8 if subgroups else 0)
    H, n_ctx = G * kvh, p0 + T + 3
    s = slots - 1
    q = rnd(seed, T + pad, H, D).astype(np.float16 if f16 else np.float32)
    q[T:] = q[T - 1]  # (padding rows: the last row again)
    kc, vc = rnd(seed + 1, slots, n_ctx, kvh, D), rnd(seed + 2, slots, n_ctx, kvh, D)
    pos = np.concatenate([np.arange(p0, p0 + T), np.full(pad, p0 + T - 1)]).astype(np.int32)
    if past:
        pos[-1] = n_ctx + 2
    slot = np.full(T + pad, s, np.int32)
    scale = float(D) ** -0.5
    fused = np.stack([q * 0, q, q * 2], axis=1)  # (rows, 3, H, D): q as the fused qkv's middle third, a view
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        launched.clear()
        qkv, kct, vct, pt, st_ = on(dev, fused, kc, vc, pos, slot)
        outs.append(wt.chunk_attention(qkv[:, 1], kct, vct, pt, st_, scale=scale).numpy())
    tiled = style and D % 16 == 0 and D % keys == 0 and tiled_tile_bytes(keys, D, 4) + TILED_CACHE_EXTRA_BYTES <= \
        gpu.ctx.api.limits["max-compute-workgroup-storage-size"]
    flash = not tiled and T + pad >= 2 and D % 4 == 0 and D <= 64 and not f16
    kernel = "attention_tiled_cache" if tiled else "attention_flash_cache" if flash else "cached_attention"
    # (cached_attention's kernel reads positions and slots from one buffer: copied into one first)
    assert launched == [kernel] or (kernel == "cached_attention" and launched == ["unary", "unary", kernel])
    want = chunk_reference(q, kc, vc, pos, s, scale)
    assert outs[1].dtype == np.float32 and outs[1].shape == (T + pad, H, D)
    mag = cached_attention_scale(q, kc, vc, pos, slot, scale)
    assert_close(outs[0], want, mag, rtol=1e-6)
    assert_close(outs[1], want, mag, rtol=1e-5)
    if pad > past:  # a padding row is its position's row again
        assert np.array_equal(outs[1][T], outs[1][T - 1])


def test_chunk_attention_rows_share_one_slot(device):
    """The rows must be one sequence's: the CPU names two slots that differ (WebGPU reads slot[0])."""
    q = wt.tensor(rnd(0, 3, 2, 16), device=device)
    kc = wt.tensor(rnd(1, 2, 8, 2, 16), device=device)
    pos = wt.tensor(np.array([0, 1, 2], np.int32), device=device)
    if device.kind == "cpu":
        with pytest.raises(wt.ShapeError, match="slots 1 and 0"):
            wt.chunk_attention(q, kc, kc, pos, wt.tensor(np.array([1, 1, 0], np.int32), device=device))
    with pytest.raises(wt.ShapeError, match="slot must be an int32 tensor of shape \\(3,\\)"):
        wt.chunk_attention(q, kc, kc, pos, wt.tensor(np.array([1], np.int32), device=device))
    with pytest.raises(wt.ShapeError, match="do not split evenly"):
        wt.chunk_attention(q, wt.zeros((2, 8, 3, 16), device=device), kc, pos, pos)
    with pytest.raises(wt.ShapeError, match="k and v caches differ"):
        wt.chunk_attention(q, kc, wt.zeros((2, 9, 2, 16), device=device), pos, pos)


@SETTINGS
@given(seed=seeds, slots=st.integers(1, 3), bad=st.sampled_from([-1, 0, 7]), neg=st.booleans())
def test_chunk_attention_bad_slots_and_positions(gpu, style, seed, slots, bad, neg):
    """GPU data is never trusted as an index: a slot out of range makes every row attend to nothing (zeros), a
    negative position its row (zeros); the other rows are the reference's (both kernel families)."""
    n_ctx, T, D = 12, 5, 16
    kc, vc, q = rnd(seed, slots, n_ctx, 1, D), rnd(seed + 1, slots, n_ctx, 1, D), rnd(seed + 2, T, 2, D)
    pos = np.arange(3, 3 + T).astype(np.int32)
    if neg:
        pos[2] = -1 - bad * bad
        slot = np.zeros(T, np.int32)
    else:
        slot = np.full(T, slots + bad if bad >= 0 else -1, np.int32)
    got = wt.chunk_attention(*on(gpu, q, kc, vc, pos, slot)).numpy()
    if neg:
        assert np.array_equal(got[2], np.zeros_like(got[2]))
        keep = [0, 1, 3, 4]
        assert_close(got[keep], chunk_reference(q[keep], kc, vc, pos[keep], 0, D ** -0.5),
                     cached_attention_scale(q[keep], kc, vc, pos[keep], np.zeros(4, np.int32), D ** -0.5))
    else:
        assert np.array_equal(got, np.zeros_like(got))


def test_graph_reuses_its_intermediates(gpu):
    """A capture hands the buffer of an intermediate it has dropped to a later one of the same size (replayed in
    order, the later tenant is written after the earlier one's last reader): a chain of 12 ops holds ~3 buffers,
    not 12, and replays right; constants uploaded in the capture keep their own."""
    x = wt.tensor(rnd(0, 4096), device=gpu)
    ctx = gpu.ctx

    def chain():
        y = x
        for i in range(12):
            y = wt.add(y * 0.5, wt.tensor(np.full(4096, i, np.float32), device=gpu))  # (a constant each step)
        return y

    want = x.numpy()
    for i in range(12):
        want = want * np.float32(0.5) + np.float32(i)
    before = ctx.bytes_in_use
    g = gpu.capture(chain)
    held = ctx.bytes_in_use - before
    assert held <= (12 + 4) * 4096 * 4  # 12 constants, the output and a few intermediates (not 24 + 12)
    for _ in range(2):  # (every output is >= 11 - |x|: nothing cancels, no floor)
        assert_close(g.replay().numpy(), want, rtol=1e-6)
    g.release()


@SETTINGS
@given(seed=seeds, b=st.integers(1, 5), ring=st.integers(1, 4), steps=st.integers(1, 6))
def test_advance_tokens(gpu, seed, b, ring, steps):
    rng = np.random.default_rng(seed)
    news = rng.integers(0, 1000, (steps, b)).astype(np.int32)
    res = []
    for dev in (wt.Device.cpu(), gpu):
        ids, pos = on(dev, np.zeros(b, np.int32), np.arange(b, dtype=np.int32))
        tokens, count = on(dev, np.full(ring * b, -1, np.int32), np.zeros(1, np.int32))
        for s in range(steps):
            wt.advance_tokens(wt.tensor(news[s], device=dev), ids, pos, tokens, count)
        res.append([x.numpy() for x in (ids, pos, tokens, count)])
    for x, y in zip(*res, strict=True):
        assert np.array_equal(x, y)
    ids, pos, tokens, count = res[0]
    assert np.array_equal(ids, news[-1]) and np.array_equal(pos, np.arange(b) + steps) and count[0] == steps
    kept = min(ring, steps)
    assert np.array_equal(tokens.reshape(ring, b)[:kept], news[:kept])


@SETTINGS
@given(seed=seeds, m=st.integers(1, 12), k=st.sampled_from([4, 8, 36, 64, 100]), n=st.integers(1, 40),
       act=st.sampled_from([None, "gelu"]))
@example(seed=8187622, m=1, k=64, n=1, act="gelu")  # (issue #29: one output of -1.3e-27 failed a relative error)
def test_linear_with_layer_norm(gpu, style, seed, m, k, n, act):
    x, w, b, g, beta = rnd(seed, m, k), rnd(seed + 1, k, n), rnd(seed + 2, n), rnd(seed + 3, k), rnd(seed + 4, k)
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        xt, wt_, bt, gt, betat = on(dev, x, w.T.copy(), b, g, beta)  # k-major weight, as models store it
        outs.append(wt.linear(xt, wt_.T, bt, act=act, ln=(gt, betat, 1e-5)).numpy())
    want = wt.linear(*on(wt.Device.cpu(), wt.layer_norm(*on(wt.Device.cpu(), x, g, beta)).numpy(), w, b),
                     act=act).numpy()
    mag = linear_scale(layer_norm_scale(x, g, beta, 1e-5), w, b)  # (GELU's tail: outputs of 1e-27)
    assert_close(outs[0], want, mag, rtol=1e-6)
    assert_close(outs[1], outs[0], mag)


@SETTINGS
@given(seed=seeds, rows=st.integers(1, 3), cols=st.integers(1, 5000), where=st.integers(0, 4999))
def test_argmax_long_rows(gpu, seed, rows, cols, where):
    x = rnd(seed, rows, cols)
    x[:, where % cols] = 50.0  # a clear winner anywhere in the row, ties with it at the end
    x[:, -1] = 50.0 if where % 3 == 0 else x[:, -1]
    got = wt.argmax(wt.tensor(x, device=gpu)).numpy()
    assert np.array_equal(got, np.argmax(x, -1))


def test_graph_replays_with_state_on_the_device(device):
    """A captured step (state in tensors) replayed k times equals running it k times op by op."""
    w = wt.tensor(rnd(0, 8, 8) * 0.3, device=device)
    state = wt.tensor(rnd(1, 1, 8), device=device)

    def step():
        y = wt.gelu(state @ w)
        wt.copy_into(state, y)
        return y

    ref = rnd(1, 1, 8)
    for _ in range(3):
        ref = wt.gelu(wt.tensor(ref) @ wt.tensor(w.numpy())).numpy()
    g = device.capture(step)  # (capturing runs nothing, on either device)
    wt.copy_into(state, wt.tensor(rnd(1, 1, 8), device=device))
    out = g.replay(3)
    assert_close(out, ref)  # (fixed inputs, no cancellation)
    assert_close(state, ref)
    g.release()


def test_capture_refuses_host_traffic(gpu):
    x = wt.tensor(np.ones(4, np.float32), device=gpu)
    with pytest.raises(wt.GraphCaptureError, match="readback"):
        gpu.capture(lambda: (x + 1).numpy())
    with pytest.raises(wt.GraphCaptureError, match="upload into an existing tensor"):
        gpu.capture(lambda: gpu.backend.upload_into(x, np.zeros(4, np.float32).tobytes()))
    g = gpu.capture(lambda: x + wt.tensor(np.ones(4, np.float32), device=gpu))  # a new tensor: a constant
    assert g.replay().numpy().tolist() == [2.0] * 4  # the device goes on working


def test_graph_keeps_its_buffers(gpu):
    """Intermediates dropped after capture stay bound to the graph: the pool does not hand their
    buffers to new tensors until the graph is released."""
    x = wt.tensor(np.arange(64, dtype=np.float32), device=gpu)
    g = gpu.capture(lambda: (x * 2.0) + 1.0)  # (x * 2.0) is dropped right away
    junk = [wt.tensor(np.full(64, 7, np.float32), device=gpu) for _ in range(8)]  # would reuse it
    assert g.replay().numpy().tolist() == (np.arange(64) * 2.0 + 1.0).tolist()
    del junk
    g.release()


@pytest.mark.parametrize("packed", [True, False], ids=["u32-pairs", "vec4-f16"])
@SETTINGS
@given(seed=seeds, m=st.integers(1, 8), k=st.sampled_from([4, 12, 64, 200]), n=st.integers(1, 70),
       ln=st.booleans())
def test_gemv_float16_weights(gpu, style, monkeypatch, packed, seed, m, k, n, ln):
    """Decode rows against k-major float16 weights, read as vec4<f16> or as u32 pairs."""
    if not gpu.has_f16:
        pytest.skip("this adapter has no shader-f16")
    set_policy(monkeypatch, gpu, gemv_packed_f16=packed)
    x, w, b, g, beta = rnd(seed, m, k), rnd(seed + 1, k, n), rnd(seed + 2, n), rnd(seed + 3, k), rnd(seed + 4, k)
    outs = []
    for dev in (wt.Device.cpu(), gpu):
        xt, bt, gt, betat = on(dev, x, b, g, beta)
        wk = wt.tensor(w.T.astype(np.float16), device=dev).T  # (K, N) view of (N, K) float16 storage
        outs.append(wt.linear(xt, wk, bt, act="gelu", ln=(gt, betat, 1e-5) if ln else None).numpy())
    # (the fused norm is one shifted float32 pass against the reference's float64 two: up to ~2e-5
    # on a single output)
    assert outs[1].dtype == np.float32
    mag = linear_scale(layer_norm_scale(x, g, beta, 1e-5) if ln else x, w, b)
    assert_close(outs[1], outs[0], mag, rtol=5e-5 if ln else 1e-5)
