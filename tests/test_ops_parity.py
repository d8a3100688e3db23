"""One parity test per op: the WGSL kernel against the numpy reference on fresh random inputs of
many shapes (odd sizes included), fp32 relative error <= 1e-5, with an absolute floor scaled by the
inputs where a result can cancel to near zero (tolerance.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_fixtures import rnd
from tolerance import assert_close, attention_scale, linear_scale

import webtensor as wt

TOL = 1e-5
SETTINGS = settings(max_examples=20, deadline=None)  # (derandomized under CI=true: the `ci` profile)
dim = st.integers(1, 70)
seeds = st.integers(0, 2**32 - 1)


@st.composite
def shapes(draw: st.DrawFn, min_dims: int, max_dims: int, max_elements: int = 1 << 17) -> list[int]:
    """A shape of min_dims..max_dims dims of 1..70, at most max_elements in all (in any order): odd sizes
    in every dim, without the 24M elements of four 70s (seconds of lavapipe an example, no more coverage)."""
    out: list[int] = []
    for _ in range(draw(st.integers(min_dims, max_dims))):
        out.append(draw(st.integers(1, max(1, min(70, max_elements // math.prod(out))))))
    return list(draw(st.permutations(out)))


def both(gpu, *arrays):
    cpu = wt.Device.cpu()
    return [wt.tensor(a, device=cpu) for a in arrays], [wt.tensor(a, device=gpu) for a in arrays]


def check(gpu, fn, *arrays, tol=TOL, scale=None):
    """fn on the WebGPU device against fn on the CPU reference: same shape and dtype, within `tol`
    (and the floor of `scale`: tolerance.assert_close)."""
    c, g = both(gpu, *arrays)
    want, got = fn(*c).numpy(), fn(*g).numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert_close(got, want, scale, rtol=tol, what=[a.shape for a in arrays])
    return got, want


@SETTINGS
@given(seed=seeds, m=dim, k=st.integers(1, 300), n=dim, batch=st.sampled_from([(), (3,), (2, 2)]))
def test_matmul(gpu, seed, m, k, n, batch):
    a, b = rnd(seed, *batch, m, k), rnd(seed + 1, k, n)
    check(gpu, lambda a, b: a @ b, a, b, scale=linear_scale(a, b))


@SETTINGS
@given(seed=seeds, m=dim, k=dim, n=dim, b=st.integers(1, 4))
def test_matmul_batched_and_transposed(gpu, seed, m, k, n, b):
    x, y = rnd(seed, b, m, k), rnd(seed + 1, b, k, n)
    check(gpu, lambda x, y: x @ y, x, y, scale=linear_scale(x, y))
    x, y = rnd(seed, m, k), rnd(seed + 1, n, k)
    check(gpu, lambda x, y: x @ y.T, x, y, scale=linear_scale(x, y.T))
    x, y = rnd(seed, k), rnd(seed + 1, k, n)
    check(gpu, lambda x, y: wt.matmul(x, y), x, y, scale=linear_scale(x, y))  # one row


@SETTINGS
@given(seed=seeds, shape=shapes(1, 4), op=st.sampled_from(["add", "mul", "sub", "div"]),
       bcast=st.integers(0, 3))
def test_binary_broadcast(gpu, seed, shape, op, bcast):
    a = rnd(seed, *shape)
    bshape = list(shape)
    if bcast == 1:
        bshape = bshape[1:]  # fewer dims
    elif bcast == 2:
        bshape[-1] = 1
    elif bcast == 3:
        bshape[0] = 1
    b = rnd(seed + 1, *bshape) + (3.0 if op == "div" else 0.0)
    check(gpu, getattr(wt, op), a, b)
    check(gpu, getattr(wt, op), b, a) if op in ("add", "mul") else None


@SETTINGS
@given(seed=seeds, shape=shapes(1, 3))
def test_gelu(gpu, seed, shape):
    x = rnd(seed, *shape, scale=3.0)
    check(gpu, wt.gelu, x, scale=x)  # (the tail's relative slope grows like x^2: its floor is |x|)


@SETTINGS
@given(seed=seeds, rows=dim, cols=st.integers(1, 1100))
def test_layer_norm(gpu, seed, rows, cols):
    x, w, b = rnd(seed, rows, cols, scale=2.0) + 1.5, rnd(seed + 1, cols), rnd(seed + 2, cols)
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    check(gpu, lambda x, w, b: wt.layer_norm(x, w, b, eps=1e-5), x, w, b, scale=np.abs(xhat * w) + np.abs(b))


@SETTINGS
@given(seed=seeds, rows=dim, cols=st.integers(1, 1100))
def test_softmax(gpu, seed, rows, cols):
    check(gpu, wt.softmax, rnd(seed, rows, cols, scale=4.0))


@SETTINGS
@given(seed=seeds, t=st.integers(1, 20), extra=st.integers(0, 300), h=st.integers(1, 4),
       d=st.sampled_from([1, 7, 16, 33, 64]), causal=st.booleans())
def test_attention(gpu, seed, t, extra, h, d, causal):
    s = t + extra
    q, k, v = rnd(seed, t, h, d), rnd(seed + 1, s, h, d), rnd(seed + 2, s, h, d)
    # (a head of one dim over hundreds of keys averages values of both signs to near zero)
    check(gpu, lambda q, k, v: wt.attention(q, k, v, causal=causal), q, k, v, scale=attention_scale(q, k, v, causal))


@SETTINGS
@given(seed=seeds, v=st.integers(1, 300), c=st.integers(1, 100), n=st.integers(1, 40))
def test_embedding(gpu, seed, v, c, n):
    ids = np.random.default_rng(seed).integers(0, v, size=n).astype(np.int32)
    got, want = check(gpu, wt.embedding, rnd(seed, v, c), ids, tol=0.0)
    np.testing.assert_array_equal(got, want)


@SETTINGS
@given(seed=seeds, rows=dim, cols=st.integers(1, 3000), ties=st.booleans())
def test_argmax(gpu, seed, rows, cols, ties):
    x = rnd(seed, rows, cols)
    if ties:
        x = np.round(x)  # many equal maxima: the first index must win, as in numpy
    got, want = check(gpu, wt.argmax, x, tol=0.0)
    np.testing.assert_array_equal(got, want)


@SETTINGS
@given(seed=seeds, rows=st.integers(1, 9), cols=st.integers(1, 1100), density=st.sampled_from([0.0, 0.02, 0.5, 1.0]),
       lead=st.sampled_from([(), (2,)]), half=st.booleans(), sliced=st.booleans())
def test_token_mask(gpu, seed, rows, cols, density, lead, half, sliced):
    """A grammar's bit mask on logits rows (ops.token_mask): kept where the column's bit is set, -inf elsewhere,
    bit for bit, against the definition written out here; float16 rows and a strided view of wider rows."""
    rng = np.random.default_rng(seed)
    x = rnd(seed, *lead, rows, cols + 5 if sliced else cols).astype(np.float16 if half else np.float32)
    keep = rng.random((*lead, rows, cols)) < density
    words = (cols + 31) // 32
    bits = np.zeros((*lead, rows, words), np.int64)
    for c in range(cols):
        bits[..., c // 32] |= keep[..., c].astype(np.int64) << (c % 32)
    bits = bits.astype(np.uint32).view(np.int32)
    want = np.where(keep, x[..., :cols], -np.inf).astype(x.dtype)
    for dev in (wt.Device.cpu(), gpu):
        t = wt.tensor(x, device=dev)
        got = wt.ops.token_mask(t[..., :cols] if sliced else t, wt.tensor(bits, device=dev)).numpy()
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, want)


def test_token_mask_checks(cpu):
    x = wt.tensor(np.zeros((2, 40), np.float32), device=cpu)
    for bits in (np.zeros((2, 1), np.int32), np.zeros((2, 2), np.float32), np.zeros((3, 2), np.int32)):
        with pytest.raises((wt.ShapeError, wt.DTypeError)):
            wt.ops.token_mask(x, wt.tensor(bits, device=cpu))


@SETTINGS
@given(seed=seeds, shape=shapes(2, 4))
def test_transpose_slice_copy(gpu, seed, shape):
    x = rnd(seed, *shape)
    check(gpu, lambda t: t.transpose(0, -1).contiguous(), x, tol=0.0)
    check(gpu, lambda t: t[1:, ..., ::2].contiguous(), x, tol=0.0)
    check(gpu, lambda t: t.reshape(-1) + 1.0, x)


def test_copy_into_kv_cache_rows(device):
    rng = np.random.default_rng(0)
    cache = wt.tensor(np.zeros((10, 3, 4), np.float32), device=device)
    rows = rng.standard_normal((2, 3, 4)).astype(np.float32)
    wt.copy_into(cache[5:7], wt.tensor(rows, device=device))
    got = cache.numpy()
    np.testing.assert_array_equal(got[5:7], rows)
    assert not got[:5].any() and not got[7:].any()


def test_float16_cast_and_matmul(gpu):
    if not gpu.has_f16:
        import pytest

        pytest.skip("adapter has no shader-f16")
    a, w = rnd(1, 5, 33), rnd(2, 33, 9)
    c, g = both(gpu, a, w.astype(np.float16))
    got = (g[0] @ g[1]).numpy()
    want = (c[0] @ c[1]).numpy()
    assert_close(got, want, linear_scale(a, w))
    h = wt.tensor(a, device=gpu).to(wt.float16)
    assert h.dtype is wt.float16
    np.testing.assert_array_equal(h.numpy(), a.astype(np.float16))


@SETTINGS
@given(seed=seeds, m=dim, k=st.integers(1, 200), n=dim, bias=st.booleans(), act=st.booleans(), res=st.booleans())
def test_linear_fused(gpu, seed, m, k, n, bias, act, res):
    arrays = [rnd(seed, m, k), rnd(seed + 1, k, n), rnd(seed + 2, n), rnd(seed + 3, m, n)]

    def f(x, w, b, r):
        return wt.linear(x, w, b if bias else None, "gelu" if act else None, r if res else None)

    x, w, b, r = arrays
    check(gpu, f, *arrays, scale=linear_scale(x, w, b if bias else None, r if res else None))


@pytest.mark.parametrize(("dtype", "res_dtype"), [("float16", "float32"), ("float32", "float16")])
@settings(SETTINGS, max_examples=6)
@given(seed=seeds, m=st.integers(1, 40), k=st.integers(1, 100), n=dim)
def test_linear_residual_of_another_dtype(gpu, dtype, res_dtype, seed, m, k, n):
    """A residual whose dtype differs from the output's is converted first (the kernels read it as
    the output's type), in the GEMV and the tiled kernels alike."""
    if not gpu.ctx.has_f16:
        pytest.skip("this adapter has no shader-f16")
    x, w = rnd(seed, m, k).astype(dtype), rnd(seed + 1, k, n).astype(dtype)
    r = rnd(seed + 2, m, n).astype(res_dtype)
    check(gpu, lambda x, w, r: wt.linear(x, w, residual=r), x, w, r, tol=1e-5 if dtype == "float32" else 2e-3,
          scale=linear_scale(x, w, residual=r))


def test_linear_fused_on_chunked_weight(gpu_small):
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((3, 300)).astype(np.float32), rng.standard_normal((300, 90)).astype(np.float32)
    b, r = rng.standard_normal(90).astype(np.float32), rng.standard_normal((3, 90)).astype(np.float32)
    c, g = both(gpu_small, x, w, b, r)
    assert len(g[1]._storage.chunks) > 1
    want = wt.linear(*c[:3], "gelu", c[3]).numpy()
    assert_close(wt.linear(*g[:3], "gelu", g[3]).numpy(), want, linear_scale(x, w, b, r))
    wt_t = wt.tensor(np.ascontiguousarray(w.T), device=gpu_small)  # (90, 300) chunked along N rows
    assert_close(wt.linear(g[0], wt_t.T, g[2], "gelu", g[3]).numpy(), want, linear_scale(x, w, b, r))


def test_views_beyond_four_dims(gpu):
    a = np.random.default_rng(9).standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    t = wt.tensor(a, device=gpu).permute(4, 3, 2, 1, 0)  # no two dims merge: copied dim by dim
    np.testing.assert_array_equal(t.numpy(), a.transpose(4, 3, 2, 1, 0))
    np.testing.assert_array_equal((t + 1.0).numpy(), a.transpose(4, 3, 2, 1, 0) + np.float32(1.0))  # (one rounding)


@pytest.mark.parametrize("dev_name", ["gpu", "gpu_small"])
def test_linear_against_k_major_weights(request, dev_name):
    """Weights stored k-major (N, K) and used through their (K, N) view, as the GPT-2 model keeps
    them: the GEMV (few rows), the tiled matmul or, on CPU-backed adapters, the barrier-free
    register-blocked one (many rows); also with the weight row-chunked under a 64 KiB cap."""
    dev = request.getfixturevalue(dev_name)
    rng = np.random.default_rng(12)
    for m in (3, 37):
        x, w = rng.standard_normal((m, 256)).astype(np.float32), rng.standard_normal((90, 256)).astype(np.float32)
        b, r = rng.standard_normal(90).astype(np.float32), rng.standard_normal((m, 90)).astype(np.float32)
        wk = wt.tensor(w, device=dev).T  # (256, 90) view of (90, 256) storage
        got = wt.linear(wt.tensor(x, device=dev), wk, wt.tensor(b, device=dev), "gelu", wt.tensor(r, device=dev))
        c = wt.Device.cpu()
        want = wt.linear(wt.tensor(x, device=c), wt.tensor(w.T.copy(), device=c), wt.tensor(b, device=c), "gelu",
                         wt.tensor(r, device=c))
        assert_close(got, want, linear_scale(x, w.T, b, r), what=(dev_name, m))
