"""For the chat tests: `Terminal`, a `webtensor` process on a pseudo-terminal (its stdin, stdout and stderr, and its
controlling terminal, so that Ctrl-C typed there is a real SIGINT from the terminal driver); and copies of the
shipped GPT-2 with a chat template of the test's (`with_template`), optionally with a ChatML end-of-turn token
`<|im_end|>` in its vocabulary that is not its EOS (`IM_END`)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SHIPPED = SRC / "webtensor" / "models" / "shipped"
IM_END = 4095  # the id `with_template(..., im_end=True)` gives <|im_end|> (the shipped vocabulary's last merge)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def env(**extra: str) -> dict[str, str]:
    """The environment of a `webtensor` process under test: this checkout's sources, no WEBTENSOR_* settings."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("WEBTENSOR_")}
    out.update(XDG_RUNTIME_DIR="/tmp", PYTHONPATH=str(SRC), **extra)
    return out


def with_template(dst: Path, template: str, im_end: bool = False) -> Path:
    """A copy of the shipped GPT-2 in `dst` whose chat template is `template` (chat_template.jinja); `im_end`: its
    last BPE merge ("Ġb" + "an" -> id 4095) replaced by a special added token <|im_end|> with that id, so that a
    ChatML template's turn ends with a special token that is not the model's EOS (<|endoftext|>, id 0)."""
    dst.mkdir(parents=True)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json"):
        shutil.copy(SHIPPED / f, dst / f)
    (dst / "chat_template.jinja").write_text(template, encoding="utf-8")
    if im_end:
        tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
        vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
        last = "".join(merges.pop())
        assert vocab.pop(last) == IM_END
        vocab["<|im_end|>"] = IM_END
        tj["added_tokens"].append({"id": IM_END, "content": "<|im_end|>", "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
        (dst / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    return dst


class Terminal:
    """`python -m webtensor ARGS` on a pseudo-terminal. `expect(regex)` reads until the output after the last match
    holds it; `send(bytes)` types; `wait()` gives the exit status. `stdout`: a file that takes the process's stdout
    instead of the terminal (`webtensor chat > replies.txt`)."""

    def __init__(self, *args: str, stdout: Path | None = None, **extra_env: str):
        pid, fd = pty.fork()
        if pid == 0:  # the child: a session leader whose controlling terminal is the pty
            try:
                if stdout is not None:
                    os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
                os.execve(sys.executable, [sys.executable, "-m", "webtensor", *args],
                          env(TERM="dumb", NO_COLOR="1", **extra_env))
            finally:
                os._exit(127)
        self.pid, self.fd, self.out, self.pos = pid, fd, b"", 0
        self.status: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child has gone and the pty is closed
            data = b""
        if not data:
            raise EOFError
        self.out += data
        return True

    def expect(self, pattern: bytes, timeout: float = 60) -> re.Match[bytes]:
        rx = re.compile(pattern, re.S)
        end = time.monotonic() + timeout
        while True:
            m = rx.search(self.out, self.pos)
            if m:
                self.pos = m.end()
                return m
            if time.monotonic() > end:
                raise AssertionError(f"{pattern!r} did not come within {timeout} s; output since the last match: "
                                     f"{self.out[self.pos:]!r}")
            try:
                self._read(end - time.monotonic())
            except EOFError:
                raise AssertionError(f"the process ended before {pattern!r}; its output: {self.out!r}") from None

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while self.status is None:
            try:
                self._read(0.05)
            except EOFError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > end:
                self.close()
                raise AssertionError(f"the process did not end within {timeout} s; its output: {self.out!r}")
        return self.status

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
