"""The suite's tolerance rule (tolerance.py): assert_close and its scales do what they say, and parity
tests compare through it, never with a bare relative error that a result near zero defeats."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from tolerance import FLOOR_ULPS, U32, assert_close, attention_scale, cached_attention_scale, linear_scale

import webtensor as wt

TESTS = Path(__file__).resolve().parent


def test_relative_error_without_a_scale() -> None:
    want = np.array([3.0, -4.0])  # ||want|| = 5
    assert_close(want + [3e-5, 0], want, rtol=1e-5)  # 3e-5 <= 5e-5
    with pytest.raises(AssertionError, match=r"\|\|got - want\|\| = 6e-05 > 1e-05 \* \|\|want\|\| \(5\)"):
        assert_close(want + [6e-5, 0], want, rtol=1e-5)


def test_a_result_near_zero_gets_the_floor_of_its_terms() -> None:
    """The newcomer's failure: one output of -1.3e-27 (GELU's tail) whose float32 pre-activation had
    terms of magnitude ~40. Relative error alone cannot pass; FLOOR_ULPS units of roundoff of the
    terms' magnitude can, and one more cannot."""
    want, scale = np.array([-1.3e-27]), np.array([40.0])
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(want + 1e-6, want)
    assert_close(want + 1e-6, want, scale)  # 1e-6 <= 32 * 2^-24 * 40 = 7.6e-5
    assert_close(want + FLOOR_ULPS * U32 * 40 * 0.999, want, scale, rtol=0)
    with pytest.raises(AssertionError, match=r"\+ 32 \* 5.96e-08 \* \|\|scale\|\| \(40\)"):
        assert_close(want + FLOOR_ULPS * U32 * 40 * 1.001, want, scale, rtol=0)


def test_nan_inf_and_shapes_fail() -> None:
    want = np.ones(3)
    for bad in (np.nan, np.inf):
        with pytest.raises(AssertionError, match=r"worst element \(1,\)"):
            assert_close(np.array([1.0, bad, 1.0]), want, np.ones(3))
    with pytest.raises(AssertionError, match=r"shape \(1, 3\) != the reference's \(3,\)"):
        assert_close(np.ones((1, 3)), want)


def test_scales_bound_the_exact_results() -> None:
    """|x @ w + b| <= linear_scale and |attention| <= attention_scale, elementwise (a scale is the sum
    of the terms' magnitudes, so it bounds the sum), and both are what the docstrings say on a case
    worked by hand."""
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((3, 7)), rng.standard_normal((7, 5)), rng.standard_normal(5)
    assert np.all(np.abs(x @ w + b) <= linear_scale(x, w, b) + 1e-12)
    assert np.array_equal(linear_scale([[1.0, -2.0]], [[3.0], [-4.0]], [-5.0]), [[16.0]])  # 3 + 8 + 5
    q, k, v = rng.standard_normal((4, 6, 8)), rng.standard_normal((9, 2, 8)), rng.standard_normal((9, 2, 8))
    for causal in (False, True):
        mag = attention_scale(q, k, v, causal, 0.3)
        exact = wt.attention(*(wt.tensor(a.astype(np.float32)) for a in (q, k, v)), causal=causal, scale=0.3)
        assert mag.shape == (4, 6, 8) and np.all(np.abs(exact.numpy()) <= mag * (1 + 1e-5))
    one = attention_scale(np.ones((1, 1, 1)), np.array([[[1.0]], [[-1.0]]]), np.array([[[2.0]], [[-2.0]]]), scale=1.0)
    p = np.exp([1.0, -1.0]) / np.exp([1.0, -1.0]).sum()  # the weights of the two keys; their values cancel
    assert np.allclose(one, (p @ [2.0, 2.0]) * (1 + 1.0))  # P |V| (1 + max |q| |k| scale)
    kc, vc = rng.standard_normal((2, 5, 2, 8)), rng.standard_normal((2, 5, 2, 8))
    rows = cached_attention_scale(q[:2], kc, vc, [4, 1], [1, 0], 0.3)
    assert np.allclose(rows[1], attention_scale(q[1:2], kc[0, :2], vc[0, :2], scale=0.3)[0])


def _bare_relative_errors(text: str) -> list[int]:
    """The lines (1-based) that assert on rel_err(...) directly: `assert rel_err(a, b) <= tol`, or a
    comparison `rel_err(a, b) <= tol` elsewhere in an expression."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if re.search(r"\bassert\b.*\brel_err\(", code) or re.search(r"\brel_err\(.*\)\s*<=", code):
            hits.append(n)
    return hits


def test_the_suite_compares_through_assert_close() -> None:
    """No test asserts on a bare relative error (conftest.rel_err, or an inline norm ratio): it fails
    correct code whose result is near zero. Use tolerance.assert_close(got, want, scale, rtol=...)."""
    assert _bare_relative_errors("    assert rel_err(got, want) <= 1e-5\n    x = 1\n") == [1]  # (the check works)
    assert _bare_relative_errors("    print(rel_err(a, b))  # assert rel_err(a, b) <= 1\n") == []
    inline = re.compile(r"np\.linalg\.norm\([^)]*-[^)]*\)\s*/\s*np\.linalg\.norm\(")
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("conftest.py", "tolerance.py", Path(__file__).name):
            continue
        text = path.read_text()
        found += [f"{path.relative_to(TESTS)}:{n}" for n in _bare_relative_errors(text)]
        found += [f"{path.relative_to(TESTS)}:{text[:m.start()].count(chr(10)) + 1}" for m in inline.finditer(text)]
    assert not found, ("compare with tolerance.assert_close(got, want, scale, rtol=...) (a floor for results "
                       f"near zero): {', '.join(found)}")
