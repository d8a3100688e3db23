"""Helpers for the serving tests: a real server process on 127.0.0.1 (a free port), and raw HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODEL = "webtensor-shipped"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process; `url` is its base URL once /health answers."""

    def __init__(self, args: list[str], port: int, own_group: bool = False):
        """`own_group`: the process leads a process group of its own (its children with it: `kill_group`)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                                         os.environ.get("PYTHONPATH")]))}
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=own_group)

    @classmethod
    def cli(cls, *extra: str, own_group: bool = False) -> Server:
        port = free_port()
        return cls(["-m", "webtensor.cli", "serve", "--port", str(port), *extra], port, own_group).wait_ready()

    def kill_group(self) -> None:
        """SIGKILL the server and every process it started (a crash: nothing is finished or answered)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    @classmethod
    def faulty(cls, delay: float, max_batch: int, max_queue: int, api_key: str | None = None,
               grace: float = 10.0) -> Server:
        port = free_port()
        args = [str(Path(__file__).with_name("fault_server.py")), str(port), str(delay), str(max_batch),
                str(max_queue), api_key or "-", str(grace)]
        return cls(args, port).wait_ready()

    def wait_ready(self, timeout: float = 60) -> Server:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.proc.stdout.read()}")
            try:
                if get(self.url + "/health")[0] == 200:
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not come up")

    def health(self) -> dict[str, Any]:
        return get(self.url + "/health")[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def request(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
            ) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON or text, headers)."""
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw, hdrs = r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        status, raw, hdrs = e.code, e.read(), dict(e.headers)
    try:
        return status, json.loads(raw), hdrs
    except ValueError:
        return status, raw.decode(), hdrs


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    return request("GET", url, None, headers)


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request("POST", url, raw, headers)


def wait_for(pred: Any, timeout: float, interval: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def assert_openai_error(body: Any, type_: str) -> dict[str, Any]:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == type_ and isinstance(err["message"], str) and err["message"], err
    return err
