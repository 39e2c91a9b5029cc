"""onceflow_tools.supervise on real child processes: exits 3 and 4 start the service again, any
other exit and any stop signal end the supervision with the service's own code."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from onceflow_tools.supervise import Backoff, Supervisor


def exits_in_turn(tmp_path: Path, codes: list[int]) -> list[str]:
    """A child that exits with the next of ``codes`` each time it is started."""
    runs = tmp_path / "runs"
    script = (
        "import pathlib, sys\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        f"sys.exit({codes!r}[n])\n"
    )
    return [sys.executable, "-c", script]


def test_exits_3_and_4_start_the_service_again_until_it_exits_otherwise(tmp_path: Path) -> None:
    supervisor = Supervisor(exits_in_turn(tmp_path, [4, 3, 4, 0]), Backoff(first_s=0.01))
    assert supervisor.run() == 0
    assert supervisor.restarts == 3


def test_refused_settings_are_passed_on_and_never_restarted(tmp_path: Path) -> None:
    supervisor = Supervisor(exits_in_turn(tmp_path, [2, 0]), Backoff(first_s=0.01))
    assert supervisor.run() == 2
    assert supervisor.restarts == 0


def test_a_stop_signal_reaches_the_service_and_ends_the_supervision(tmp_path: Path) -> None:
    # The service takes SIGTERM as a stop and then exits 4, as a stuck one might while stopping:
    # stopped on purpose, it is not started again.
    ready = tmp_path / "ready"
    script = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(4))\n"
        f"pathlib.Path({str(ready)!r}).write_text('up')\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "onceflow_tools.supervise", sys.executable, "-c", script],
        stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and child.poll() is None, "the service never started"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 4
    assert "starting it again" not in (child.stderr.read() if child.stderr else "")


def test_the_wait_doubles_while_the_service_fails_at_once_and_resets_after_a_steady_run() -> None:
    backoff = Backoff(first_s=1.0, most_s=5.0, steady_s=60.0)
    assert [backoff.after(0.5) for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff.after(120.0) == 1.0


def test_a_signal_during_the_wait_ends_it(tmp_path: Path) -> None:
    supervisor = Supervisor(exits_in_turn(tmp_path, [4, 0]), Backoff(first_s=30.0))
    signalled: list[float] = []

    def signal_once_waiting() -> None:
        # Once the first child has exited and the 30 s wait has begun: a fixed delay raced a
        # child that was slow to start on a loaded machine (SIGTERM reached the child instead).
        while supervisor.restarts < 1:
            time.sleep(0.01)
        signalled.append(time.monotonic())
        supervisor._on_signal(signal.SIGTERM, None)

    threading.Thread(target=signal_once_waiting, daemon=True).start()
    assert supervisor.run() == 4
    assert signalled and time.monotonic() - signalled[0] < 5
