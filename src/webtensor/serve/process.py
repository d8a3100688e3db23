"""`ProcessEngine`: an engine that runs in a child process, so that its Python work does not share
a GIL with the server's HTTP event loop.

On the CPU device a decode step is mostly Python (a few dozen small numpy ops, which hold the GIL),
and in one process the event loop's per-token work (SSE events, socket sends) and the engine's
step run one after the other. Measured on the 2-core machine at 8 streams: the engine's step ~3 ms,
the loop's work ~2 ms a step, so ~5 ms between tokens in one process (docs/performance-notes.md).
In its own process the engine steps on one core while the loop serves the tokens on the other.

The parent keeps what the scheduler reads (name, max_batch, n_ctx, vocab_size, eos_ids, bos_id, the tokenizer, the
chat template, the prompt chunk and budget: sent once by the child) and forwards `launch` / `follow` / `collect`
(and so `step`) and `release` over a pipe; the engine thread waiting on the pipe releases the GIL. Calls are
messages answered in order, so the scheduler can queue a `follow` (the next greedy step, its tokens fed back in the
child: `ModelEngine.follow`) before it reads the step before it: the child then goes from one step to the next
without waiting for the parent. The child builds the model and engine itself (from `spec`, the serve command's
choices), so nothing unpicklable crosses. An exception in the child's step is raised in the parent as an
`EngineProcessError` with the child's message (the scheduler fails that step's requests and goes on); a child that
died is an `EngineProcessError` on every call after.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from typing import Any

from ..errors import ArgumentError, WebtensorError
from .engine import Row, Token, followable

SERVE_CTX = 4096  # positions per slot unless --ctx-size says (every slot holds a KV cache of this many)


class EngineProcessError(WebtensorError):
    """The engine process failed a call (its message), or is gone."""


def build_engine(spec: dict[str, Any]) -> Any:
    """The engine `spec` describes: model (a source for `load_model`; None: the shipped one), device, dtype,
    n_ctx (None: the model's, at most SERVE_CTX), max_batch, engine ("batched" or "reference"), name, blas_threads
    (0: as the library has it), prefix_reuse (default True), chat_template (where given: the template's text, None
    for the plain one, in place of the model's), prefill_chunk and prefill_budget (None: the device's), kv_dtype
    (None: the device's default), kv_memory (the KV pool: bytes or a share of the device's memory,
    `runtime.cache.pool_blocks`; None: the default)."""
    from ..device import Device
    from ..models import loader
    from ..runtime.cache import pool_blocks
    from .engine import ModelEngine

    if spec.get("blas_threads"):
        from ..backends import blas

        blas.set_threads(spec["blas_threads"])
    dev, dtype = Device.parse(spec["device"]), loader.check_dtype(spec["dtype"])
    ck = loader.open_checkpoint(spec["model"])
    if "chat_template" in spec:
        ck.chat_template = spec["chat_template"]
    n_ctx = spec.get("n_ctx") or min(ck.config.spec.n_ctx, SERVE_CTX)
    model = loader.build(ck, dev, dtype, min(n_ctx, ck.config.spec.n_ctx), kv_dtype=spec.get("kv_dtype"))
    return ModelEngine(model, spec["max_batch"], name=spec["name"], engine=spec["engine"],
                       prefix_reuse=spec.get("prefix_reuse", True), prefill_chunk=spec.get("prefill_chunk"),
                       prefill_budget=spec.get("prefill_budget"),
                       kv_blocks=pool_blocks(model, spec["max_batch"], spec.get("kv_memory"),
                                             prefill_chunk=spec.get("prefill_chunk")))


def _child(conn: Any, spec: dict[str, Any]) -> None:
    import signal

    # Ctrl-C and SIGTERM reach the whole process group: the parent drains (running streams finish,
    # still stepping here), then closes this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = build_engine(spec)
        info = {k: getattr(engine, k) for k in ("name", "max_batch", "n_ctx", "vocab_size", "eos_ids", "bos_id",
                                                "tokenizer", "chat_template", "prefill_chunk", "prefill_budget")}
        info["engine"] = getattr(engine, "engine", None)
        info["prefix_reuse"] = getattr(engine, "prefix_reuse", False)
        for k in ("kv_blocks", "block_size", "kv_window", "kv_dtype", "memory"):
            info[k] = getattr(engine, k)
        info["follows"] = bool(getattr(engine, "use_graph", False) and hasattr(engine, "follow"))
        info["device"] = engine.model.device.describe()
        conn.send(("ready", info))
    except Exception as e:  # the parent reports it and exits
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    last = None  # the step launched last (what a "follow" continues)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if msg[0] == "close":
            return
        try:
            if msg[0] == "release":
                engine.release(msg[1], msg[2])
                conn.send(("ok", None))
            elif msg[0] == "follow":
                last = engine.follow(last, msg[1], msg[2])
                conn.send(("ok", engine.collect(last)))
            elif hasattr(engine, "launch"):
                last = engine.launch(msg[1])
                conn.send(("ok", engine.collect(last)))
            else:
                conn.send(("ok", [engine.step(msg[1])]))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


class ProcessEngine:
    """The engine `spec` describes (see `build_engine`), running in a child process."""

    def __init__(self, spec: dict[str, Any], start_timeout: float = 600.0):
        ctx = mp.get_context("spawn")  # (fork would copy a process that may hold a GPU context and threads)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child, spec), name="webtensor-engine", daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(start_timeout):
            self.close()
            raise EngineProcessError(f"the engine process did not start within {start_timeout:.0f} s")
        kind, info = self._recv()
        if kind != "ready":
            self.close()
            raise EngineProcessError(f"the engine process failed to start: {info}")
        self.name: str = info["name"]
        self.max_batch: int = info["max_batch"]
        self.n_ctx: int = info["n_ctx"]
        self.vocab_size: int = info["vocab_size"]
        self.eos_ids: frozenset[int] = info["eos_ids"]
        self.bos_id: int | None = info["bos_id"]
        self.chat_template: str | None = info["chat_template"]
        self.tokenizer = info["tokenizer"]
        self.engine: str | None = info["engine"]
        self.device: str = info["device"]
        self._follows: bool = info["follows"]
        self.prefix_reuse: bool = info["prefix_reuse"]
        self.kv_blocks: int = info["kv_blocks"]
        self.block_size: int = info["block_size"]
        self.kv_window: int | None = info["kv_window"]
        self.kv_dtype: str = info["kv_dtype"]
        self.memory: str = info["memory"]
        self.prefill_chunk: int = info["prefill_chunk"]
        self.prefill_budget: int = info["prefill_budget"]
        self._sent = self._answered = 0  # messages sent, answers received (in order)
        self._answers: dict[int, tuple[str, Any]] = {}  # received, not yet taken

    def _recv(self) -> tuple[str, Any]:
        try:
            msg: tuple[str, Any] = self._conn.recv()  # (the child sends (kind, value) pairs)
            return msg
        except (EOFError, OSError) as e:
            raise EngineProcessError(f"the engine process is gone (exit code {self._proc.exitcode})") from e

    def _send(self, *msg: Any) -> int:
        """Send a call; its ticket, for `_answer`."""
        try:
            self._conn.send(msg)
        except (BrokenPipeError, OSError) as e:
            raise EngineProcessError(f"the engine process is gone (exit code {self._proc.exitcode})") from e
        self._sent += 1
        return self._sent - 1

    def _answer(self, ticket: int) -> Any:
        """The answer to call `ticket` (those before it, received on the way, are kept for theirs)."""
        while ticket not in self._answers:
            self._answers[self._answered] = self._recv()
            self._answered += 1
        kind, value = self._answers.pop(ticket)
        if kind == "error":
            raise EngineProcessError(value)
        return value

    def launch(self, rows: Sequence[Row]) -> int:
        """Start a step in the child; `collect` its tokens."""
        return self._send("step", list(rows))

    def can_follow(self, rows: Sequence[Row], steps: int = 1) -> bool:
        return self._follows and followable(rows, self.n_ctx, steps)

    def follow(self, prev: int, rows: Sequence[Row], steps: int = 1) -> int:
        """`steps` steps after `prev` (the last launched), their tokens fed back in the child."""
        if prev != self._sent - 1:
            raise ArgumentError("follow continues the last launched step only")
        return self._send("follow", list(rows), steps)

    def collect(self, ticket: int) -> list[list[Token]]:
        """The tokens of a launched step or followed steps: per step, per row."""
        tokens: list[list[Token]] = self._answer(ticket)
        return tokens

    def step(self, rows: Sequence[Row]) -> list[Token]:
        return self.collect(self.launch(rows))[0]

    def release(self, slot: int, keep: int = 0) -> None:
        self._answer(self._send("release", slot, keep))

    def close(self) -> None:
        """Stop the child (it exits on its own when the parent goes, too)."""
        try:
            self._conn.send(("close",))
        except OSError:
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
