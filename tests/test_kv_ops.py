"""Parity of the ops a decode step is made of (cache_write, cached_attention with and without the
fused append, advance_tokens, linear with a layer-norm prologue, the two-stage argmax) against the
numpy reference, in the CPU-adapter and the GPU kernel variants; and graphs: captured once,
replayed with state on the device, the same results as running the ops again."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_policy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from op_fixtures import append_and_attend, on, rnd
from tolerance import assert_close, cached_attention_scale, layer_norm_scale, linear_scale

import webtensor as wt

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
