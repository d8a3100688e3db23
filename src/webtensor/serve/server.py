"""Running the app under uvicorn: the listening socket, connection timeouts, and a graceful drain.

`bind` makes the listening socket before anything else (the CLI calls it before loading a model, so
a port in use is one line and exit status 1, not a model load and a traceback). Connections: an
idle persistent connection is closed `keep_alive` seconds after its last response (uvicorn's
keep-alive), and any connection that has not sent a whole request head (request line and headers)
within `idle_timeout` seconds of opening or of its last response is closed too (`_HeadDeadline`:
uvicorn's own timer stops at a request's first byte, and a new connection has none); a request body
that stalls as long, or has not all arrived `body_timeout` seconds after its head, gets a 408.

On SIGTERM / SIGINT the scheduler stops admitting at once, uvicorn stops accepting connections,
running streams get `grace` seconds to finish; any still running then is ended with an error event
and `data: [DONE]` (the scheduler's `abort`), and the process exits with status 0 (a second SIGINT
forces the exit).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Sequence
from types import FrameType

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .app import BODY_DEADLINE, MAX_BODY, create_app
from .engine import Engine
from .scheduler import Scheduler

KEEP_ALIVE = 5.0  # seconds (uvicorn's and vLLM's default)
IDLE_TIMEOUT = 30.0  # seconds to send a request head (or a stalled body's next bytes)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening: connections are refused until the server
    starts); OSError if the address is in use or cannot be had."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (a restart reuses a port in TIME_WAIT)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


class _HeadDeadline(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a deadline on each request head: `head_timeout` seconds from
    the connection's opening, or from its last response, to the end of the next request's headers."""

    head_timeout = IDLE_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # (as uvicorn's)
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout, self._expire)

    def _disarm(self) -> None:
        timer: asyncio.TimerHandle | None = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _expire(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def _protocol(head_timeout: float) -> type[_HeadDeadline]:
    return type("HeadDeadlineProtocol", (_HeadDeadline,), {"head_timeout": head_timeout})


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, grace: float):
        super().__init__(config)
        self.scheduler, self.grace = scheduler, grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # unlike uvicorn's own, this does not re-raise the signal after the drain: the exit status is 0
        self.scheduler.begin_drain()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (its own timeout a little past the grace period), with the grace
        period's end: every stream still running ends with an error event and [DONE]."""

        def end() -> None:
            n = self.scheduler.abort(f"the server is shutting down: its grace period ({self.grace:g} s) ended "
                                     "before this request did")
            if n:
                uvicorn.config.logger.warning("grace period over: %d request(s) ended with an error", n)
        timer = asyncio.get_running_loop().call_later(self.grace, end)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def serve(engine: Engine, host: str, port: int, max_queue: int = 256, api_key: str | None = None,
          grace: float = 30.0, log_level: str = "warning", prefill_budget: int | None = None,
          sock: socket.socket | None = None, max_body: int = MAX_BODY, cors_origins: Sequence[str] = (),
          keep_alive: float = KEEP_ALIVE, idle_timeout: float = IDLE_TIMEOUT, body_timeout: float = BODY_DEADLINE
          ) -> None:
    """Serve `engine` on `sock` (None: bound here to host:port) until a signal, then drain
    (`prefill_budget`: the scheduler's, None: the engine's; `max_body`, `cors_origins`: the app's)."""
    sock = sock or bind(host, port)
    app = create_app(engine, max_queue, api_key, prefill_budget=prefill_budget, max_body=max_body,
                     cors_origins=cors_origins, body_timeout=idle_timeout, body_deadline=body_timeout)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, http=_protocol(idle_timeout),
                            # (uvicorn annotates these int, but hands them to loop.call_later and asyncio.timeout,
                            # which take float seconds: `--keep-alive 0.5` is meant as it is, not rounded)
                            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=grace + 5)  # type: ignore[arg-type]
    DrainingServer(config, app.state.scheduler, grace).run(sockets=[sock])
