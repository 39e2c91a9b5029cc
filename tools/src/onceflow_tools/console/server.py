"""Serving the console: in the foreground (`onceflow console`) or on a thread beside something
else (`onceflow demo`)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import uvicorn

from onceflow.admin.fleet import Endpoint
from onceflow.admin.tls import ClientTLS
from onceflow.config import CommonSettings
from onceflow_tools.console.app import Console, build
from onceflow_tools.console.settings import ConsoleSettings
from onceflow_tools.console.watch import FleetWatch

log = logging.getLogger(__name__)
# Open event streams would otherwise hold a shutdown until their clients go.
GRACEFUL_SHUTDOWN_S = 2


def _server(
    settings: ConsoleSettings, endpoints: list[Endpoint], tls: ClientTLS | None, common: CommonSettings | None = None
) -> tuple[uvicorn.Server, FleetWatch]:
    watch = FleetWatch(endpoints, tls, settings.poll_interval_s, settings.deadline_s, settings.history)
    app = build(Console(watch, settings, common or CommonSettings(), tls))
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    return uvicorn.Server(config), watch


def url(settings: ConsoleSettings) -> str:
    return f"http://{settings.host}:{settings.port}/"


def serve(settings: ConsoleSettings, endpoints: list[Endpoint], tls: ClientTLS | None) -> None:
    """Until SIGINT or SIGTERM (uvicorn's handlers), then stop polling."""
    server, watch = _server(settings, endpoints, tls)
    watch.start()
    try:
        server.run()
    finally:
        watch.stop()


@dataclass
class BackgroundConsole:
    """The console on a daemon thread, for a command that runs a pipeline of its own."""

    settings: ConsoleSettings
    endpoints: list[Endpoint]
    tls: ClientTLS | None = None
    # The pipeline's topic prefix and brokers, when they are not the environment's.
    common: CommonSettings | None = None
    _server: uvicorn.Server | None = None
    _watch: FleetWatch | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return url(self.settings)

    def start(self, timeout_s: float = 10.0) -> BackgroundConsole:
        self._server, self._watch = _server(self.settings, self.endpoints, self.tls, self.common)
        self._watch.start()
        self._thread = threading.Thread(target=self._server.run, name="console", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the console did not start on {self.url}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=GRACEFUL_SHUTDOWN_S + 3)
        if self._watch is not None:
            self._watch.stop()
