"""Every op at odd binding limits (lavapipe): operands, results and scratch over one binding are
handled a block of rows at a time (backends/wgpu/rows.py), and the result equals the CPU reference.

The limits are not multiples of anything useful (1,000, 5,000 and 30,000 bytes after WebGPU's
rounding to 4-byte words), the widths are odd, so blocks and chunks never line up with tiles,
vec4 words or each other. Each test also checks that the case it names happened (the operand or
result really was stored in several chunks), and downstream ops read the chunked results that
the model code gets: argmax of chunked logits, rows of them, `.numpy()`, views, casts, graphs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import _wgpu, set_policy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from op_fixtures import quant_weight
from tolerance import assert_close, linear_scale

import webtensor as wt
from webtensor import quant
from webtensor.backends.wgpu import ops as gops
from webtensor.backends.wgpu import quant_ops
from webtensor.backends.wgpu.context import WgpuContext
from webtensor.quant import quantize

LIMITS = [1_003, 5_003, 30_001]
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
CPU = wt.Device.cpu()


@pytest.fixture(scope="module", params=LIMITS, ids=[f"limit{n}" for n in LIMITS])
def dev(request: pytest.FixtureRequest) -> wt.Device:
    return _wgpu(max_binding_bytes=request.param)


def chunks(t: wt.Tensor) -> int:
    return len(t._storage.chunks)


def rows_over(dev: wt.Device, row_bytes: int, times: float = 2.5) -> int:
    """A row count whose rows of `row_bytes` are `times` the device's binding limit."""
    return max(2, math.ceil(times * dev.max_binding_bytes() / row_bytes))


def on(d: wt.Device, *arrays: np.ndarray) -> list[wt.Tensor]:
    return [wt.tensor(a, device=d) for a in arrays]


def close(got: wt.Tensor, want: wt.Tensor, tol: float = 1e-5) -> None:
    """Same shape and dtype, norm-wise relative error <= tol: the results here are rows over a binding
    limit, hundreds of random outputs or more, whose norm does not cancel (no floor needed)."""
    assert got.shape == want.shape and got.dtype is want.dtype
    assert_close(got, want, rtol=tol)


@SETTINGS
@given(seed=st.integers(0, 2**16), C=st.integers(3, 61), extra=st.floats(1.2, 3.5))
@example(seed=0, C=3, extra=3.5)  # (found by the thorough profile: argmax's (T,) result is over the limit too)
def test_elementwise_and_row_ops(dev, seed, C, extra):
    rng = np.random.default_rng(seed)
    T = rows_over(dev, C * 4, extra)
    x, y = rng.standard_normal((T, C), np.float32), rng.standard_normal((T, C), np.float32)
    bias, col = rng.standard_normal(C, np.float32), rng.standard_normal((T, 1), np.float32) + 3
    g, b = rng.standard_normal(C, np.float32), rng.standard_normal(C, np.float32)
    ops = {
        "add": lambda d: on(d, x)[0] + on(d, y)[0],
        "mul-bias": lambda d: on(d, x)[0] * on(d, bias)[0],
        "sub-col": lambda d: on(d, col)[0] - on(d, x)[0],
        "div-scalar": lambda d: on(d, x)[0] / 2.5,
        "gelu": lambda d: wt.gelu(on(d, x)[0]),
        "layer_norm": lambda d: wt.layer_norm(on(d, x)[0], *on(d, g, b)),
        "softmax": lambda d: wt.softmax(on(d, x)[0] * 3.0),
        "copy-of-rows-view": lambda d: on(d, x)[0][1::2].contiguous(),
        "3d-rows": lambda d: wt.gelu(on(d, x)[0].reshape(T, 1, C)),
    }
    assert chunks(on(dev, x)[0]) > 1
    for name, f in ops.items():
        got = f(dev)
        assert chunks(got) > 1 or got.nbytes <= dev.max_binding_bytes(), name
        close(got, f(CPU))
    am = wt.argmax(on(dev, x)[0])  # (T,) int32: over the limit itself where a row of x is under 4 * extra bytes
    assert (chunks(am) > 1) == (am.nbytes > dev.max_binding_bytes()) and np.array_equal(am.numpy(), np.argmax(x, -1))
    if dev.has_f16:
        h = on(dev, x)[0].to("float16")
        assert (chunks(h) > 1) == (h.nbytes > dev.max_binding_bytes())
        assert np.array_equal(h.numpy(), x.astype(np.float16))
        assert np.array_equal(h.to("float32").numpy(), x.astype(np.float16).astype(np.float32))


@SETTINGS
@given(seed=st.integers(0, 2**16), H=st.integers(1, 3), half=st.integers(1, 6), interleaved=st.booleans())
def test_llama_row_ops(dev, seed, H, half, interleaved):
    """rms_norm, rope (rows with their positions), swiglu (of a fused gate_up's halves) and the rms
    prologue of linear, on rows over the limit."""
    rng = np.random.default_rng(seed)
    D = 2 * half + 1  # an odd head dim: the last one passes through
    T = rows_over(dev, H * D * 4)
    x = rng.standard_normal((T, H, D), np.float32)
    w = rng.standard_normal(D, np.float32)
    pos = rng.integers(0, 40, T).astype(np.int32)
    ang = np.outer(np.arange(40), 1.0 / 10_000 ** (np.arange(half) / half)).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    F = 2 * H * D
    gu = rng.standard_normal((T, 2 * F), np.float32)
    wl, g = rng.standard_normal((H * D, 7), np.float32), rng.standard_normal(H * D, np.float32)
    wg = rng.standard_normal((F, 5), np.float32)
    cases = {
        "rms_norm": lambda d: wt.rms_norm(*on(d, x, w), 1e-5),
        "rope": lambda d: wt.rope(*on(d, x, pos, cos, sin), interleaved=interleaved),
        "swiglu": lambda d: (lambda t: wt.swiglu(t[:, :F], t[:, F:]))(on(d, gu)[0]),
        "linear-rms": lambda d: wt.linear(on(d, x.reshape(T, H * D))[0], on(d, wl)[0],
                                          rms=(on(d, g)[0], 1e-5)),
        "linear-swiglu": lambda d: wt.linear(*on(d, gu, wg), glu="swiglu"),  # (the GEMV's SwiGLU prologue)
    }
    for name, f in cases.items():
        got = f(dev)
        assert chunks(got) > 1 or got.nbytes <= dev.max_binding_bytes(), name
        close(got, f(CPU))


def test_grouped_query_attention_rows_in_blocks(dev):
    rng = np.random.default_rng(4)
    H, KVH, D = 4, 2, 4
    T = rows_over(dev, H * D * 4, 1.5)
    q = rng.standard_normal((T, H, D), np.float32)
    k, v = (rng.standard_normal((3, KVH, D), np.float32) for _ in range(2))
    got = wt.attention(*on(dev, q, k, v), causal=False)
    assert chunks(got) > 1
    close(got, wt.attention(*on(CPU, q, k, v), causal=False))


def test_argmax_scratch_over_the_limit(dev):
    """(T, 1) float32 fits one binding; argmax's scratch (8 bytes a row) does not: rows in blocks."""
    T = dev.max_binding_bytes() // 4 - 3
    x = np.random.default_rng(0).standard_normal((T, 1), np.float32)
    t = wt.tensor(x, device=dev)
    assert chunks(t) == 1 and T * gops.argmax_scratch_bytes(dev.ctx, 1) > dev.max_binding_bytes()
    assert np.array_equal(wt.argmax(t).numpy(), np.zeros(T, np.int32))
    y = np.random.default_rng(1).standard_normal((T // 3, 3), np.float32)
    assert np.array_equal(wt.argmax(wt.tensor(y, device=dev)).numpy(), np.argmax(y, -1))


@SETTINGS
@given(seed=st.integers(0, 2**16), K=st.integers(1, 45), N=st.integers(5, 70), act=st.sampled_from([None, "gelu"]))
def test_matmul_and_linear(dev, seed, K, N, act):
    rng = np.random.default_rng(seed)
    M = rows_over(dev, N * 4)
    a, w = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
    bias, res = rng.standard_normal(N, np.float32), rng.standard_normal((M, N), np.float32)
    g, beta = rng.standard_normal(K, np.float32), rng.standard_normal(K, np.float32)
    m = max(1, min(M // 3, dev.max_binding_bytes() // (4 * max(K, N))))  # (a row of axis 0 must fit a binding)
    B = math.ceil(M / m)
    a3 = rng.standard_normal((B, m, K), np.float32)
    b3 = rng.standard_normal((B, K, N), np.float32)
    cases = {
        "matmul": lambda d: wt.matmul(*on(d, a, w)),
        "matmul-weight-transposed": lambda d: on(d, a)[0] @ on(d, np.ascontiguousarray(w.T))[0].T,
        "matmul-3d": lambda d: on(d, a3)[0] @ on(d, w)[0],
        "linear": lambda d: wt.linear(*on(d, a, w, bias), act=act, residual=on(d, res)[0]),
        "linear-ln": lambda d: wt.linear(*on(d, a, w), ln=(*on(d, g, beta), 1e-5)),
        "linear-stack": lambda d: wt.linear(on(d, a.reshape(M, 1, K))[0], on(d, w)[0], act=act),
    }
    if K * N * 4 <= dev.max_binding_bytes():  # (a (K, N) matrix of b is a row of its first axis)
        cases["matmul-batched"] = lambda d: wt.matmul(*on(d, a3, b3))
    for name, f in cases.items():
        got = f(dev)
        assert chunks(got) > 1 or got.nbytes <= dev.max_binding_bytes(), name
        close(got, f(CPU))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_quantized_linear_and_embedding(dev, qtype):
    rng = np.random.default_rng(3)
    K, N = 64, 23
    M = rows_over(dev, N * 4)
    w = quantize(rng.standard_normal((N, K)).astype(np.float32), qtype)
    x, res = rng.standard_normal((M, K), np.float32), rng.standard_normal((M, N), np.float32)
    got = wt.linear(wt.tensor(x, device=dev), w, residual=wt.tensor(res, device=dev))
    assert chunks(got) > 1
    close(got, wt.linear(wt.tensor(x), w, residual=wt.tensor(res)))
    gu = rng.standard_normal((M, 2 * K), np.float32)  # the SwiGLU prologue: (gate | up) halves of 2K
    got = wt.linear(wt.tensor(gu, device=dev), w, glu="swiglu")
    assert chunks(got) > 1
    close(got, wt.linear(wt.tensor(gu), w, glu="swiglu"))
    table = quantize(rng.standard_normal((40, K)).astype(np.float32), qtype)
    ids = rng.integers(0, 40, rows_over(dev, K * 4)).astype(np.int32)
    emb = wt.embedding(table, wt.tensor(ids, device=dev))
    assert chunks(emb) > 1 and np.array_equal(emb.numpy(), table.dequantize()[ids])


@pytest.mark.parametrize("qtype", sorted(quant.TYPES))
def test_quantized_linear_on_the_engine(dev, qtype, monkeypatch):
    """The GPU kernels (the matrix engine from 2 rows, K cut into slices as on a GPU of 64 SMs): rows of x and
    the result over the limit in blocks, the weight in row chunks where it is over it too (else split-K, its
    scratch a block of rows at a time); the CPU reference's numbers."""
    set_policy(monkeypatch, dev, gpu_style=True, compute_units=64, engine_split_min_k=32, gemv_max_rows=1)
    rng = np.random.default_rng(5)
    K, N = 96 if quant.TYPES[qtype].values == 32 else quant.TYPES[qtype].values, 29
    M = rows_over(dev, N * 4)
    w = quant_weight(rng, qtype, N, K)
    if K * 4 > dev.max_binding_bytes():  # (a row of x over the limit: refused, naming it)
        with pytest.raises(wt.BufferLimitError, match="over the binding limit"):
            wt.linear(*on(dev, np.ones((M, K), np.float32)), w)
        return
    x, res = rng.standard_normal((M, K), np.float32), rng.standard_normal((M, N), np.float32)
    b = rng.standard_normal(N, np.float32)
    ran: list[str] = []
    launch = WgpuContext.launch
    monkeypatch.setattr(WgpuContext, "launch", lambda self, k, *a: (ran.append(k.name.split("-")[0]),
                                                                     launch(self, k, *a))[1])
    got = wt.linear(*on(dev, x), w, *on(dev, b), act="gelu", residual=on(dev, res)[0])
    one_piece = len(quant_ops.on_device(dev, w).chunks()) == 1  # (split-K: for a weight in one piece)
    assert chunks(got) > 1 and "matmul_engine_quant" in ran and ("matmul_splitk_sum" in ran) == one_piece
    close(got, wt.linear(*on(CPU, x), w, *on(CPU, b), act="gelu", residual=on(CPU, res)[0]))


@SETTINGS
@given(seed=st.integers(0, 2**16), C=st.integers(1, 37), V=st.integers(2, 400))
def test_embedding(dev, seed, C, V):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((V, C), np.float32)
    n = rows_over(dev, C * 4)
    ids = rng.integers(0, V, n).astype(np.int32)
    for shape in ((n,), (n // 2, 2)):
        i = ids[: math.prod(shape)].reshape(shape)
        got = wt.embedding(*on(dev, table, i))
        assert chunks(got) > 1 or got.nbytes <= dev.max_binding_bytes()
        assert np.array_equal(got.numpy(), table[i])


@SETTINGS
@given(seed=st.integers(0, 2**16), H=st.integers(1, 3), D=st.sampled_from([4, 7, 8, 16]), causal=st.booleans(),
       past=st.integers(0, 9))
def test_attention(dev, seed, H, D, causal, past):
    rng = np.random.default_rng(seed)
    T = rows_over(dev, H * D * 4, 1.5)
    S = T + past
    q, k, v = (rng.standard_normal(s, np.float32) for s in ((T, H, D), (S, H, D), (S, H, D)))
    if k.nbytes > dev.max_binding_bytes():  # keys are read whole: their rows are not the result's
        with pytest.raises(wt.BufferLimitError, match="attention|spans .* row chunks"):
            wt.attention(*on(dev, q, k, v), causal=causal).numpy()
        k, v = k[:2], v[:2]
        if causal:
            return
    got = wt.attention(*on(dev, q, k, v), causal=causal)
    assert chunks(got) > 1
    close(got, wt.attention(*on(CPU, q, k, v), causal=causal))


def test_cached_attention_rows_in_blocks(dev):
    rng = np.random.default_rng(5)
    H, D, n_slots = 1, 4, 2
    n_ctx = max(2, min(64, dev.max_binding_bytes() // (n_slots * H * D * 4)))  # the cache fits one binding
    T = rows_over(dev, H * D * 4)
    cache = rng.standard_normal((n_slots, n_ctx, H, D), np.float32)
    q, kn, vn = (rng.standard_normal((T, H, D), np.float32) for _ in range(3))
    pos = rng.integers(0, n_ctx, T).astype(np.int32)
    slot = rng.integers(0, n_slots, T).astype(np.int32)
    for d in (dev, CPU):
        kc, vc = on(d, cache, cache[::-1].copy())
        out = wt.cached_attention(*on(d, q), kc, vc, *on(d, pos, slot))
        if d is dev:
            assert chunks(out) > 1
            got = out
    close(got, out)
    # with the rows' own keys written first (distinct slots, as the op asks): two rows
    s2 = np.array([0, 1], np.int32)
    res = [wt.cached_attention(*on(d, q[:2]), *on(d, cache, cache), *on(d, pos[:2], s2), k_new=on(d, kn[:2])[0],
                               v_new=on(d, vn[:2])[0]) for d in (dev, CPU)]
    close(*res)
    # rotated at the rows' positions inside the launch (one (2, n_ctx, D/2) table: cos, sin), rows in blocks
    ang = np.outer(np.arange(n_ctx), 1.0 / 10_000 ** (np.arange(D // 2) / (D // 2))).astype(np.float32)
    table = np.stack([np.cos(ang), np.sin(ang)])
    for interleaved in (False, True):
        res = []
        for d in (dev, CPU):
            tab = on(d, table)[0]
            res.append(wt.cached_attention(*on(d, q), *on(d, cache, cache[::-1].copy()), *on(d, pos, slot),
                                           rope=(tab[0], tab[1], interleaved)))
        assert chunks(res[0]) > 1
        close(*res)


@pytest.mark.parametrize("kv", ["float16", "q8_0"])
def test_paged_cached_attention_rows_in_blocks(dev, kv):
    """Rows over the binding limit against a paged pool (blocks of 3 positions through a block table, in float16 and
    q8_0): attended a block of rows at a time, the same as the CPU; the rows' own keys stored in the same launch
    (distinct sequences), and a prompt's positions gathered from the pool (as many as one binding holds: a gather's
    result is one buffer, as attention's keys must be)."""
    from webtensor.quant.kv import q8_store

    rng = np.random.default_rng(9)
    H, D, block, n_blocks = 1, 32, 3, 4
    T = rows_over(dev, H * D * 4)
    table = np.array([[2, 0, 3, 1]], np.int32)  # one sequence of up to 12 positions, its blocks out of order
    fill = rng.standard_normal((n_blocks + 1, block, H, D), np.float32)
    pool = q8_store(fill) if kv == "q8_0" else fill.astype(np.float16)
    q = rng.standard_normal((T, H, D), np.float32)
    pos = rng.integers(0, 4 * block, T).astype(np.int32)
    slot = np.zeros(T, np.int32)
    res = []
    for d in (dev, CPU):
        kc, vc, tb = on(d, pool, pool.copy(), table)
        out = wt.cached_attention(*on(d, q), kc, vc, *on(d, pos, slot), table=tb)
        res.append(out)
        res.append(wt.cache_gather(kc, 0, min(4 * block, dev.max_binding_bytes() // (H * D * 4)), table=tb))
    assert chunks(res[0]) > 1
    close(res[0], res[2])
    close(res[1], res[3], 0)
    # with the rows' own keys and values stored by the launch: one row each of two sequences
    table2 = np.array([[2, 0], [3, 1]], np.int32)
    kn, vn = (rng.standard_normal((2, H, D), np.float32) for _ in range(2))
    p2, s2 = np.array([4, 5], np.int32), np.array([0, 1], np.int32)
    res = []
    for d in (dev, CPU):
        kc, vc, tb = on(d, pool, pool.copy(), table2)
        res.append(wt.cached_attention(*on(d, q[:2]), kc, vc, *on(d, p2, s2), k_new=on(d, kn)[0], v_new=on(d, vn)[0],
                                       table=tb))
        res.append(kc)
    close(res[0], res[2])
    assert np.array_equal(res[1].numpy(), res[3].numpy())


@pytest.mark.parametrize("kv", ["float16", "q8_0"])
def test_paged_chunk_attention_rows_in_blocks(dev, kv):
    """A prompt chunk's rows over the binding limit against a paged pool (blocks of 3 positions, out of order, in
    float16 and q8_0): `chunk_attention` a block of rows at a time, the same as the CPU."""
    from webtensor.quant.kv import q8_store

    rng = np.random.default_rng(10)
    H, D, block = 2, 32, 3
    T = rows_over(dev, H * D * 4)
    table = np.array([[4, 1, 3, 0]], np.int32)
    fill = rng.standard_normal((5, block, 1, D), np.float32)
    pool = q8_store(fill) if kv == "q8_0" else fill.astype(np.float16)
    q = rng.standard_normal((T, H, D), np.float32)
    pos = (np.arange(T) % (4 * block)).astype(np.int32)
    res = []
    for d in (dev, CPU):
        kc, vc, tb = on(d, pool, pool.copy(), table)
        res.append(wt.chunk_attention(*on(d, q), kc, vc, *on(d, pos, np.zeros(T, np.int32)), table=tb))
    assert chunks(res[0]) > 1
    close(*res)


def test_chunked_logits_downstream(dev):
    """The tied LM head of a long prompt: logits (T, V) over the limit, and what reads them."""
    rng = np.random.default_rng(7)
    C, V = 24, 53
    T = rows_over(dev, V * 4, 3.2)
    wte, x = rng.standard_normal((V, C), np.float32), rng.standard_normal((T, C), np.float32)
    logits = wt.linear(wt.tensor(x, device=dev), wt.tensor(wte, device=dev).T)
    want = x @ wte.T
    assert chunks(logits) > 1
    assert_close(logits, want, linear_scale(x, wte.T))
    assert logits.tobytes() == logits.numpy().tobytes()
    assert np.array_equal(wt.argmax(logits).numpy(), np.argmax(want, -1))
    last = logits[-1]
    assert chunks(last) == 1 and np.array_equal(last.numpy(), logits.numpy()[-1])
    assert np.array_equal(wt.argmax(last).numpy(), np.argmax(logits.numpy()[-1]))
    mid = logits[T // 3: T // 3 + 5]
    np.testing.assert_array_equal(mid.numpy(), logits.numpy()[T // 3: T // 3 + 5])
    np.testing.assert_array_equal(logits[:, 3:9].numpy(), logits.numpy()[:, 3:9])
    np.testing.assert_array_equal(logits.T.numpy(), logits.numpy().T)
    np.testing.assert_array_equal(logits.reshape(T, 1, V)[:, 0].numpy(), logits.numpy())
    np.testing.assert_array_equal(logits.to("cpu").numpy(), logits.numpy())
    sm = wt.softmax(logits[1:])
    assert_close(sm, wt.softmax(wt.tensor(logits.numpy()[1:])))
    np.testing.assert_array_equal(wt.argmax(logits[:, 3:9]).numpy(), np.argmax(logits.numpy()[:, 3:9], -1))
    np.testing.assert_array_equal(logits.T.contiguous().numpy(), logits.numpy().T)  # (blocks along V)
    if dev.has_f16:
        np.testing.assert_array_equal(logits.T.to("float16").numpy(), logits.numpy().T.astype(np.float16))
    with pytest.raises(wt.BufferLimitError, match="rows cross from one chunk into the next"):
        wt.softmax(logits.T)
    with pytest.raises(wt.BufferLimitError, match="view of part of a tensor stored in row chunks"):
        wt.matmul(wt.tensor(rng.standard_normal((2, V - 1), np.float32), device=dev), logits[:, 1:].T)


def test_chunked_results_in_a_graph(dev):
    rng = np.random.default_rng(8)
    K, N = 16, 31
    M = rows_over(dev, N * 4)
    x = wt.tensor(rng.standard_normal((M, K), np.float32), device=dev)
    w = wt.tensor(rng.standard_normal((K, N), np.float32), device=dev)
    g = dev.capture(lambda: wt.argmax(wt.gelu(x @ w)))
    out = g.replay()
    assert np.array_equal(out.numpy(), np.argmax(wt.gelu(wt.tensor(x.numpy()) @ wt.tensor(w.numpy())).numpy(), -1))
    g.release()


def test_split_k_scratch_in_row_blocks(monkeypatch):
    """On GPUs a small product with a long K sums K slices through a float32 scratch (S, M, N); at a
    limit below the scratch's size it goes a block of rows at a time (here on lavapipe with the GPU
    kernels)."""
    dev = _wgpu(max_binding_bytes=1_000_001)
    set_policy(monkeypatch, dev, gpu_style=True, compute_units=64)  # (a GPU's: K is cut here)
    M, K, N = 200, 1024, 200
    policy = dev.ctx.policy
    S, _ = gops.engine_split(M, N, K, gops.engine_tile(M, N, policy), policy)
    assert S >= 2 and S * M * N * 4 > dev.max_binding_bytes() >= max(M * K, K * N) * 4  # (a, w in one piece)
    rng = np.random.default_rng(9)
    a, w, bias, r = (rng.standard_normal(s, np.float32) for s in ((M, K), (K, N), (N,), (M, N)))
    ta, tw, tb, tr = on(dev, a, w, bias, r)
    g = dev.capture(lambda: wt.linear(ta, tw, tb, act="gelu", residual=tr))
    assert g.names.count(next(n for n in g.names if n.startswith("matmul_splitk_sum"))) > 1
    close(g.replay(), wt.linear(*on(CPU, a, w, bias), act="gelu", residual=on(CPU, r)[0]))


def test_a_row_over_the_limit_is_refused_by_name(dev):
    L = dev.max_binding_bytes()
    wide = L // 4 + 1  # one result row of float32 is over the limit
    a = wt.tensor(np.ones((2, 1), np.float32), device=dev)
    table = wt.tensor(np.ones((wide, 1), np.float32), device=dev)  # stored in row chunks
    with pytest.raises(wt.BufferLimitError, match=rf"matmul: one row of its result \({wide * 4:,} bytes"):
        a @ table.T
