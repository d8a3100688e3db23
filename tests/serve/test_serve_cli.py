"""`webtensor serve` / `bench-serve` refuse bad arguments before loading anything: one line on stderr,
exit status 2; a port in use or a checkpoint that cannot load: one line, exit status 1. And `serve`
on lavapipe (WebGPU) gives each of several concurrent streams what it gets alone."""

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
    ["serve", "--max-body", "0"],
    ["serve", "--keep-alive", "-1"],
    ["serve", "--idle-timeout", "0"],
    ["serve", "--cors-origins", "example.com"],
    ["serve", "--cors-origins", " , "],
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
    assert len(lines) == 1 and lines[0].startswith("webtensor: error: "), r.stderr
    assert args[1] in lines[0], r.stderr  # the option is named


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "webtensor.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_port_in_use_is_one_line_and_exit_1_before_the_model_loads():
    import socket
    import time

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t0 = time.monotonic()
        r = _run_cli("serve", "--device", "cpu", "--port", str(port), "--model", "/nonexistent/checkpoint")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines == [f"webtensor: error: cannot listen on 127.0.0.1:{port}: Address already in use"], r.stderr
    assert time.monotonic() - t0 < 20  # (no model loaded: the checkpoint named does not even exist)


def test_a_checkpoint_that_cannot_load_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    for extra in ([], ["--engine-process", "off"]):
        r = _run_cli("serve", "--device", "cpu", "--port", "0", "--model", str(tmp_path), *extra)
        assert r.returncode == 1 and r.stdout == "", (extra, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("webtensor: error: ") and "config.json" in lines[0], r.stderr
    r = _run_cli("serve", "--device", "cpu", "--port", "0", "--model", str(ROOT / "pyproject.toml"))  # not a GGUF file
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert r.stderr.strip().endswith("not a GGUF file: it starts with b'[bui', not b'GGUF'"), r.stderr


def test_cli_defaults_are_the_servers():
    from webtensor.serve import app, cli, server

    assert (cli.MAX_BODY, cli.KEEP_ALIVE, cli.IDLE_TIMEOUT) == (app.MAX_BODY, server.KEEP_ALIVE, server.IDLE_TIMEOUT)
    assert app.BODY_TIMEOUT == server.IDLE_TIMEOUT


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
