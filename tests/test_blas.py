"""`backends.blas`: numpy's OpenBLAS thread count set at run time (the server keeps it at 1)."""

from __future__ import annotations

import numpy as np
import pytest

from webtensor.backends import blas


def test_set_threads_round_trip():
    before = blas.threads()
    if before is None:
        pytest.skip("no OpenBLAS loaded under numpy here")
    try:
        assert blas.set_threads(1) and blas.threads() == 1
        a = np.arange(64.0).reshape(8, 8)
        assert np.array_equal(a @ a, np.einsum("ij,jk->ik", a, a))  # products still right
    finally:
        blas.set_threads(before)
    assert blas.threads() == before


def test_bad_count_is_refused():
    with pytest.raises(ValueError, match="BLAS threads must be >= 1"):
        blas.set_threads(0)
