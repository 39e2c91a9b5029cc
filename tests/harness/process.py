"""The fault harness runs services through the same class the CLI uses."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from onceflow.txn.errors import EXIT_RESTART
from onceflow_tools.process import ServiceProcess, free_port, restart_lone_broker

__all__ = ["RestartOnRequest", "ServiceProcess", "free_port", "restart_lone_broker"]


class RestartOnRequest:
    """What a deployment's supervisor does, in a test: a service that exits asking for a
    restart (exit 4: a producer call hung past its timeout, a consumer dropped from its group,
    typically around a broker restart) is started again; with ``codes``, other exits too. Any
    other exit is left for the test to see. ``restarts`` names each restart, for the failure
    message."""

    def __init__(self, processes: Callable[[], Iterable[ServiceProcess]], codes: Iterable[int] = (EXIT_RESTART,)) -> None:
        self._processes = processes
        self._codes = frozenset(codes)
        self.restarts: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restart-on-request", daemon=True)

    def start(self) -> RestartOnRequest:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stopping.wait(0.5):
            for proc in self._processes():
                if proc.proc is not None and proc.proc.poll() in self._codes:
                    self.restarts.append(proc.name)
                    proc.start()
