"""restart_lone_broker freezes the services only while the broker goes down: they are thawed
whatever happens, and the broker is started again only after a clean stop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onceflow_tools.process import ServiceProcess, restart_lone_broker


class _Broker:
    def __init__(self, stop_fails: bool = False) -> None:
        self.stop_fails = stop_fails
        self.calls: list[str] = []
        self.services: list[ServiceProcess] = []

    def _down(self, how: str) -> None:
        # What the services look like while the broker goes down.
        self.calls.append(how + (" (frozen)" if all(s.stopped() for s in self.services) else " (running)"))
        if self.stop_fails:
            raise RuntimeError("the broker would not stop")

    def stop(self) -> None:
        self._down("stop")

    def kill(self) -> None:
        self._down("kill")

    def start(self) -> None:
        self.calls.append("start" + (" (running)" if not any(s.stopped() for s in self.services) else " (frozen)"))


def _sleepers(tmp_path: Path, count: int) -> list[ServiceProcess]:
    return [
        ServiceProcess(f"sleeper-{i}", "", {}, tmp_path, command=[sys.executable, "-c", "import time; time.sleep(60)"]).start()
        for i in range(count)
    ]


@pytest.mark.parametrize("hard", [False, True])
def test_the_services_are_frozen_while_the_broker_goes_down_and_thawed_before_it_starts(tmp_path: Path, hard: bool) -> None:
    broker = _Broker()
    broker.services = _sleepers(tmp_path, 2)
    try:
        restart_lone_broker(broker, broker.services, hard=hard)  # type: ignore[arg-type]
        assert broker.calls == [("kill" if hard else "stop") + " (frozen)", "start (running)"]
    finally:
        for proc in broker.services:
            proc.kill9()


def test_a_broker_that_fails_to_stop_leaves_no_service_frozen_and_is_not_started(tmp_path: Path) -> None:
    broker = _Broker(stop_fails=True)
    broker.services = _sleepers(tmp_path, 2)
    try:
        with pytest.raises(RuntimeError, match="would not stop"):
            restart_lone_broker(broker, broker.services)  # type: ignore[arg-type]
        assert broker.calls == ["stop (frozen)"]
        assert not any(proc.stopped() for proc in broker.services)
    finally:
        for proc in broker.services:
            proc.kill9()
