"""`webtensor serve` / `bench-serve` refuse bad arguments before loading anything: one line on stderr,
exit status 2. And `serve` on lavapipe (WebGPU) gives each of several concurrent streams what it gets
alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_helpers import MODEL, ROOT, Server  # noqa: E402

BAD_ARGS = [
    ["serve", "--port", "70000"],
    ["serve", "--max-batch", "0"],
    ["serve", "--max-queue", "-1"],
    ["serve", "--device", "tpu"],
    ["serve", "--dtype", "bfloat16"],
    ["serve", "--engine", "fast"],
    ["serve", "--blas-threads", "-1"],
    ["serve", "--prefill-budget", "0"],
    ["serve", "--model", str(ROOT / "pyproject.toml")],
    ["bench-serve", "--concurrency", "1,x"],
    ["bench-serve", "--concurrency", "0"],
    ["bench-serve", "--url", "ftp://host"],
    ["bench-serve", "--url", "http://127.0.0.1:1,ftp://host"],
    ["bench-serve", "--max-tokens", "0"],
]


@pytest.mark.parametrize("args", BAD_ARGS, ids=lambda a: " ".join(a[:3]))
def test_bad_arguments_exit_2_with_one_line(args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "webtensor.cli", *args], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("webtensor: error: --"), r.stderr


@pytest.mark.wgpu
def test_lavapipe_concurrent_streams_match_alone(gpu):
    openai = pytest.importorskip("openai")
    s = Server.cli("--device", "lavapipe", "--max-batch", "4")
    try:
        aclient = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)

        async def run(i: int) -> str:
            kw = dict(temperature=0) if i % 2 == 0 else dict(temperature=0.8, seed=i)
            stream = await aclient.completions.create(model=MODEL, prompt=f"Story {i}:" + " and" * i,
                                                      max_tokens=3 + i, stream=True, **kw)
            return "".join([c.choices[0].text async for c in stream])

        async def main() -> tuple[list[str], list[str]]:
            alone = [await run(i) for i in range(4)]
            return alone, list(await asyncio.gather(*(run(i) for i in range(4))))

        alone, together = asyncio.run(main())
        assert together == alone and all(alone)
    finally:
        s.stop()
