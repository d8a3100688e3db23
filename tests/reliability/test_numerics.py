"""Property-based op parity with extreme values, and the NaN / inf behaviour documented in
docs/numerics.md, on the CPU reference and on WebGPU.

The references are computed in float64 from the float32 inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import webtensor as wt

pytestmark = pytest.mark.filterwarnings("ignore:(overflow|invalid value|divide by zero):RuntimeWarning")

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
inf, nan = np.inf, np.nan


def _t(a, d):
    return wt.tensor(np.asarray(a, np.float32), device=d)


def _softmax64(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm64(x, w, b, eps):
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w.astype(np.float64) + b.astype(np.float64)


# -- large magnitudes ------------------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 3), st.integers(1, 300))


@settings(max_examples=30, **SETTINGS)
@given(shape=shapes, exponent=st.floats(4, 30), shift=st.floats(-1, 1), seed=st.integers(0, 2**16))
def test_softmax_large_magnitudes(device, shape, exponent, shift, seed):
    """Rows of N(shift, 1) * 10**exponent: softmax is stable (max-subtracted) at any finite scale."""
    rng = np.random.default_rng(seed)
    x = ((rng.standard_normal(shape) + shift) * 10.0**exponent).astype(np.float32)
    got = wt.softmax(_t(x, device)).numpy()
    np.testing.assert_allclose(got, _softmax64(x), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


BIG = float(np.float32(1e30))
magnitudes = st.floats(-BIG, BIG, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=30, **SETTINGS)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 40)), elements=magnitudes))
def test_softmax_extreme_elements(device, x):
    """Any mix of finite float32 values in [-1e30, 1e30], ties and zeros included."""
    got = wt.softmax(_t(x, device)).numpy()
    np.testing.assert_allclose(got, _softmax64(x), rtol=1e-4, atol=1e-6)


@settings(max_examples=30, **SETTINGS)
@given(shape=shapes, exponent=st.floats(4, 18), seed=st.integers(0, 2**16), eps=st.sampled_from([1e-5, 1e-2]))
def test_layer_norm_large_magnitudes(device, shape, exponent, seed, eps):
    """Rows of N(0, 1) * 10**exponent (up to 1e18): normalised as accurately as at scale 1."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 10.0**exponent).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    got = wt.layer_norm(_t(x, device), _t(w, device), _t(b, device), eps).numpy()
    want = _layer_norm64(x, w, b, eps)
    if shape[-1] == 1:  # one column: x - mean is 0, so the output is exactly the bias
        np.testing.assert_array_equal(got, np.broadcast_to(b, shape))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize("exponent", [20, 25, 30])
def test_layer_norm_beyond_1e19(device, exponent):
    rng = np.random.default_rng(exponent)
    x = (rng.standard_normal((2, 64)) * 10.0**exponent).astype(np.float32)
    w, b = np.ones(64, np.float32), np.zeros(64, np.float32)
    got = wt.layer_norm(_t(x, device), _t(w, device), _t(b, device)).numpy()
    np.testing.assert_allclose(got, _layer_norm64(x, w, b, 1e-5), atol=1e-4)


@settings(max_examples=25, **SETTINGS)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 300)),
                    elements=st.floats(width=32, allow_nan=False)))
def test_argmax_with_infinities_matches_numpy(device, x):
    """Without NaN, argmax is exact on both devices (first among ties, +inf / -inf included)."""
    np.testing.assert_array_equal(wt.argmax(_t(x, device)).numpy(), np.argmax(x, axis=-1))


@settings(max_examples=20, **SETTINGS)
@given(m=st.integers(1, 5), k=st.integers(1, 70), n=st.integers(1, 70), exponent=st.floats(-20, 18),
       seed=st.integers(0, 2**16))
def test_matmul_and_add_scale_invariant(device, m, k, n, exponent, seed):
    """matmul / add at magnitudes 1e-20 .. 1e18 (products stay in float32 range): relative error as at 1."""
    rng = np.random.default_rng(seed)
    s = 10.0**exponent
    a = (rng.standard_normal((m, k)) * s).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = (_t(a, device) @ _t(b, device)).numpy()
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)  # error bound ~ k * eps * |a||b|
    assert np.all(np.abs(got - want) <= 4 * k * 2**-24 * scale + 1e-45)
    c = (rng.standard_normal((m, n)) * s).astype(np.float32)
    # (one correctly rounded add on every device: equal bits; an allclose's default atol of 1e-8 would pass
    # anything at magnitudes of 1e-20)
    np.testing.assert_array_equal((_t(want.astype(np.float32), device) + _t(c, device)).numpy(),
                                  want.astype(np.float32) + c)


# -- NaN and inf: the documented behaviour --------------------------------------------------------

ROWS = {
    "nan": [1.0, nan, 2.0, 3.0],
    "pinf": [1.0, inf, 2.0, 3.0],
    "two-pinf": [inf, 1.0, inf, 0.0],
    "ninf": [1.0, -inf, 2.0, 3.0],
    "all-ninf": [-inf] * 4,
    "mixed-inf": [inf, -inf, 0.0, 1.0],
    "constant": [5.0] * 4,
    "huge-finite": [3e38, -3e38, 0.0, 1.0],
}
ALL_NAN = [nan] * 4
_ninf_sm = list(_softmax64(np.array([1.0, -np.inf, 2.0, 3.0])))

SOFTMAX = {  # same on both devices
    "nan": ALL_NAN, "pinf": ALL_NAN, "two-pinf": ALL_NAN, "ninf": _ninf_sm, "all-ninf": ALL_NAN,
    "mixed-inf": ALL_NAN, "constant": [0.25] * 4, "huge-finite": [1.0, 0.0, 0.0, 0.0],
}
LAYER_NORM = {  # weight 2, bias 0.5; same on both devices
    "nan": ALL_NAN, "pinf": ALL_NAN, "two-pinf": ALL_NAN, "ninf": ALL_NAN, "all-ninf": ALL_NAN,
    "mixed-inf": ALL_NAN, "constant": [0.5] * 4, "huge-finite": "float64",  # (pre-scaled: no overflow)
}
ARGMAX = {  # NaN rows: CPU only (see the xfail below for WebGPU)
    "nan": 1, "pinf": 1, "two-pinf": 0, "ninf": 3, "all-ninf": 0, "mixed-inf": 0, "constant": 0,
    "huge-finite": 0,
}


@pytest.mark.parametrize("row", list(ROWS))
def test_softmax_nan_inf(device, row):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = wt.softmax(_t([ROWS[row]], device)).numpy()[0]
    np.testing.assert_allclose(got, SOFTMAX[row], rtol=1e-6, atol=0)  # NaN == NaN here, -inf gives exactly 0


@pytest.mark.parametrize("row", list(ROWS))
def test_layer_norm_nan_inf(device, row):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = wt.layer_norm(_t([ROWS[row]], device), _t([2.0] * 4, device), _t([0.5] * 4, device)).numpy()[0]
    want = LAYER_NORM[row]
    if want == "float64":
        x = np.array([ROWS[row]], np.float32)
        want = _layer_norm64(x, np.full(4, 2.0, np.float32), np.full(4, 0.5, np.float32), 1e-5)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        return
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("row", [r for r in ROWS if r != "nan"])
def test_argmax_inf(device, row):
    assert wt.argmax(_t([ROWS[row]], device)).numpy().tolist() == [ARGMAX[row]]


def test_argmax_nan_cpu(cpu):
    x = _t([[1.0, nan, 2.0, nan], [inf, 3.0, nan, 1.0], [nan] * 4], cpu)
    assert wt.argmax(x).numpy().tolist() == [1, 2, 0]  # the first NaN wins, as in numpy


def test_argmax_nan_wgpu(gpu):
    x = _t([[1.0, nan, 2.0, 3.0], [inf, nan, 1.0, 2.0]], gpu)
    assert wt.argmax(x).numpy().tolist() == [1, 1]


def test_elementwise_ieee(device):
    a = _t([inf, -inf, nan, inf, 0.0, 1.0, -1.0, 0.0], device)
    b = _t([1.0, 1.0, 1.0, -inf, inf, 0.0, 0.0, 0.0], device)
    np.testing.assert_array_equal((a + b).numpy(), [inf, -inf, nan, nan, inf, 1.0, -1.0, 0.0])
    np.testing.assert_array_equal((a * b).numpy(), [inf, -inf, nan, -inf, nan, 0.0, -0.0, 0.0])
    np.testing.assert_array_equal((a / b).numpy(), [inf, -inf, nan, nan, 0.0, inf, -inf, nan])
    m = _t([[inf, 1.0], [1.0, 1.0], [nan, 0.0]], device) @ _t([[0.0, 1.0], [1.0, 1.0]], device)
    np.testing.assert_array_equal(m.numpy(), [[nan, inf], [1.0, 2.0], [nan, nan]])


def test_gelu_nan_inf(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = wt.gelu(_t([inf, nan, -inf, 1e30, 0.0], device)).numpy()
    np.testing.assert_array_equal(got, [inf, nan, 0.0, np.float32(1e30), 0.0])  # gelu(-inf) = 0


def test_gelu_huge_negative_wgpu(gpu):
    got = wt.gelu(_t([-1e30, -1e35, -3e38], gpu)).numpy()
    assert np.all(np.abs(got) < 1e-20), got


def test_gelu_huge_negative_cpu(cpu):
    got = wt.gelu(_t([-10.0, -30.0, -1e4, -1e30, -3e38], cpu)).numpy()
    assert np.all(np.abs(got) < 1e-30) and np.all(np.signbit(got))
    assert np.all(got[1:] == 0.0)


def test_attention_nan_inf(device):
    q = np.ones((2, 1, 2), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        k_inf = np.ones((2, 1, 2), np.float32)
        k_inf[1, 0, 0] = inf  # q . k = +inf: the softmax row is NaN
        got = wt.attention(_t(q, device), _t(k_inf, device), _t(q, device), causal=False).numpy()
        assert np.isnan(got).all()
        k_ninf = np.ones((2, 1, 2), np.float32)
        k_ninf[1, 0, 0] = -inf  # q . k = -inf: that key gets weight 0
        got = wt.attention(_t(q, device), _t(k_ninf, device), _t(q, device), causal=False).numpy()
        np.testing.assert_array_equal(got, 1.0)
        v = np.ones((2, 1, 2), np.float32)
        v[1, 0, 0] = nan  # key 1 is hidden from query 0 by the causal mask
        got = wt.attention(_t(q, device), _t(q, device), _t(v, device), causal=True).numpy()
    assert np.isnan(got[1, 0, 0]) and got[1, 0, 1] == 1.0
    if device.kind == "cpu":
        assert np.isnan(got[0, 0, 0])  # 0 * NaN: the masked key's NaN leaks on the CPU
    else:
        assert got[0, 0, 0] == 1.0  # masked keys are never read
    assert got[0, 0, 1] == 1.0


def test_embedding_copies_nan_inf_bits(device):
    table = np.array([[nan, inf], [-inf, -0.0]], np.float32)
    got = wt.embedding(_t(table, device), [1, 0, 1]).numpy()
    assert got.tobytes() == table[[1, 0, 1]].tobytes()
