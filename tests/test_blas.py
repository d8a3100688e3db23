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


def test_generate_and_chat_run_on_one_blas_thread_unless_told(monkeypatch, capsys):
    """`webtensor generate` and `chat` give numpy's BLAS one thread, as `serve` does (--blas-threads 1, the
    default); --blas-threads 0 leaves the library's count."""
    import io
    import sys

    from webtensor.cli import main

    before = blas.threads()
    if before is None:
        pytest.skip("no OpenBLAS loaded under numpy here")
    blas.set_threads(2)
    if blas.threads() != 2:
        blas.set_threads(before)
        pytest.skip("OpenBLAS runs one thread at most here (OPENBLAS_NUM_THREADS=1 or one core)")
    try:
        for argv, want in ((["generate", "-d", "cpu", "-n", "2", "Hello"], 1),
                           (["generate", "-d", "cpu", "-n", "2", "--blas-threads", "0", "Hello"], 2),
                           (["chat", "-d", "cpu", "-n", "2"], 1),
                           (["chat", "-d", "cpu", "-n", "2", "--blas-threads", "2"], 2)):
            blas.set_threads(2)
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Good morning.\n")))
            assert main(argv) == 0, capsys.readouterr().err
            assert blas.threads() == want, argv
        assert capsys.readouterr().out.strip()
    finally:
        blas.set_threads(before)
