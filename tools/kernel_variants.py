"""Record every kernel variant webtensor's WebGPU runtime builds (a kernel file and its defines: what
`WgpuContext.kernel` compiles) while the native kernel and model suites run, and write them to
tests/data/kernel_variants.txt, one `web.selftest.variant_line` a line: the list the browser test compiles with
Chromium's shader compiler (Tint) and the native test with naga (tests/web/test_browser.py, test_web_native.py).

The suites run as CI runs them (CI=true: hypothesis derandomized, so the same shapes and the same variants every
time), on lavapipe under every policy they force (CPU-style and GPU-style kernels, a device without subgroups or
shader-f16), the shader-checked repetition left out (it builds the same variants). Run it after changing which
defines a planner passes, or adding a kernel or an `// #if`; the native test says when the list is stale.

    python tools/kernel_variants.py [--out tests/data/kernel_variants.txt] [PYTEST_ARGS ...]

(about 8 minutes on 2 cores). Extra arguments go to pytest, replacing the default suites.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["tests/test_*.py", "tests/models", "tests/quant", "tests/formats", "tests/serve", "tests/reliability"]
HEADER = """\
# The kernel variants webtensor's WebGPU runtime builds (a kernel file and its defines), one a line, as the native
# kernel and model suites build them: written by tools/kernel_variants.py (rerun it when a planner's defines change;
# tests/web/test_web_native.py says when this list misses a kernel, an `// #if` branch or a quantized type).
# tests/web/test_browser.py compiles each with the browser's shader compiler, test_web_native.py with naga.
"""


class Recorder:
    """A pytest plugin: every (kernel file, defines) a WgpuContext compiled or found compiled during the session."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def pytest_sessionstart(self, session: Any) -> None:
        from webtensor.backends.wgpu import context

        real = context.WgpuContext.kernel
        seen = self.seen

        def kernel(ctx: Any, file: str, defines: dict[str, str] | None = None, signature: Any = None) -> Any:
            k = real(ctx, file, defines, signature)  # (only what built)
            if signature is None:  # (a kernel of one's own, outside kernels/, is no runtime variant)
                seen.add((file, tuple(sorted((defines or {}).items()))))
            return k

        context.WgpuContext.kernel = kernel  # type: ignore[method-assign]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "kernel_variants.txt")
    a, pytest_args = p.parse_known_args()
    os.environ["CI"] = "true"  # (derandomized hypothesis; the WebGPU tests must run)
    sys.path.insert(0, str(ROOT / "src"))
    import glob

    import pytest

    from webtensor.backends.wgpu.context import KERNEL_DIR
    from webtensor.web.selftest import variant_line

    suites = pytest_args or sorted(f for s in SUITES for f in glob.glob(str(ROOT / s)))
    rec = Recorder()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "not browser", "--shader-checks", "off", *suites],
                       plugins=[rec])
    lines = sorted({variant_line(f, dict(d)) for f, d in rec.seen if (KERNEL_DIR / f"{f}.wgsl").is_file()})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(HEADER + "\n".join(lines) + "\n")
    kernels = {line.split()[0] for line in lines}
    print(f"wrote {a.out}: {len(lines)} variants of {len(kernels)} kernels (pytest exit {code})")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
