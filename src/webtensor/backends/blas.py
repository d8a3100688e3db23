"""The threads of the BLAS under numpy (OpenBLAS, as numpy's wheels bundle it), set at run time.

The CPU device's products are numpy's, and numpy's OpenBLAS starts one thread per core. A server
on the CPU device shares its cores with its own HTTP event loop (and often a load generator):
there OpenBLAS's extra threads, which spin while they wait for work, take the core the event loop
needs, and on a loaded machine every small product waits for a core for all of its threads
(measured on the 2-core machine under load: 43 -> 414 tok/s at 8 streams with one BLAS thread;
docs/performance-notes.md). OPENBLAS_NUM_THREADS only works before numpy loads, hence this: the
library's own `openblas_set_num_threads`, found among the loaded shared objects."""

from __future__ import annotations

import ctypes
from pathlib import Path

# the setter's names: plain OpenBLAS, and numpy's bundled scipy-openblas (64-bit integers, prefixed)
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


def _libraries() -> list[ctypes.CDLL]:
    """The OpenBLAS libraries loaded in this process (Linux: from /proc/self/maps), numpy's first."""
    import numpy  # noqa: F401  (loads numpy's BLAS)

    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    names = (line.split()[-1] for line in maps.read_text().splitlines() if "/" in line)
    paths = dict.fromkeys(p for p in names if "openblas" in p.rsplit("/", 1)[-1].lower() and ".so" in p)
    out = []
    for p in paths:
        try:
            out.append(ctypes.CDLL(p))
        except OSError:
            continue
    return out


def _call(names: tuple[str, ...], *args: int) -> int | None:
    for lib in _libraries():
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return int(fn(*args) or 0)
    return None


def threads() -> int | None:
    """OpenBLAS's thread count now, or None where no OpenBLAS is loaded."""
    return _call(_GETTERS)


def set_threads(n: int) -> bool:
    """Use `n` (>= 1) BLAS threads from now on; False where no OpenBLAS is loaded (nothing done)."""
    if n < 1:
        raise ValueError(f"BLAS threads must be >= 1, got {n}")
    return _call(_SETTERS, n) is not None
