"""Running the app under uvicorn, with a graceful drain on SIGTERM / SIGINT: the scheduler stops
admitting at once, uvicorn stops accepting connections, running streams get `grace` seconds to
finish, then the process exits with status 0 (a second SIGINT forces the exit)."""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from .app import create_app
from .engine import Engine
from .scheduler import Scheduler


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, scheduler: Scheduler):
        super().__init__(config)
        self.scheduler = scheduler

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # unlike uvicorn's own, this does not re-raise the signal after the drain: the exit status is 0
        self.scheduler.begin_drain()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def serve(engine: Engine, host: str, port: int, max_queue: int = 256, api_key: str | None = None,
          grace: float = 30.0, log_level: str = "warning", prefill_budget: int = 256) -> None:
    """Serve `engine` on host:port until a signal, then drain (`prefill_budget`: the scheduler's)."""
    app = create_app(engine, max_queue, api_key, prefill_budget=prefill_budget)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=max(1, round(grace)))
    DrainingServer(config, app.state.scheduler).run()
