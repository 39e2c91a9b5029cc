"""Starts a service again when it exits asking for that: ``python -m onceflow_tools.supervise CMD [ARG...]``.

Every service exits 4 when it is stuck beyond what its process can repair (a Kafka client
wedged after a broker restart), and 3 when it is fenced: a newer instance took over, or the
broker aborted a transaction it held open through an outage longer than the transaction
timeout. Both ask for a new process (docs/architecture.md, "Exit codes"). Kubernetes and Compose
(`restart: on-failure`) give one; local processes (Tilt's serve_cmd, a terminal) get it here.

Any other exit (0 after SIGTERM, 2 for settings it refused) is passed on. SIGTERM and SIGINT go
to the service and end the supervision: a service stopped on purpose is not started again.
Restarting on 3 is safe only while one process at a time runs each instance name, as here."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from onceflow.txn.errors import EXIT_FENCED, EXIT_RESTART

log = logging.getLogger("onceflow.supervise")

RESTART_CODES: dict[int, str] = {EXIT_FENCED: "fenced", EXIT_RESTART: "stuck, asking for a new process"}


@dataclass
class Backoff:
    """Waits between starts: doubling from ``first_s`` to ``most_s`` while the service keeps
    exiting soon after it starts; back to ``first_s`` after a run of ``steady_s``."""

    first_s: float = 1.0
    most_s: float = 30.0
    steady_s: float = 60.0
    _next_s: float = 0.0

    def after(self, ran_s: float) -> float:
        self._next_s = self.first_s if ran_s >= self.steady_s or not self._next_s else min(self.most_s, self._next_s * 2)
        return self._next_s


class Supervisor:
    def __init__(self, argv: list[str], backoff: Backoff | None = None) -> None:
        self.argv = argv
        self.backoff = backoff or Backoff()
        self.restarts = 0
        self._stop_signal: int | None = None
        self._child: subprocess.Popen[bytes] | None = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only a flag and a forwarded signal: the main thread is in waitpid or a short sleep.
        self._stop_signal = signum
        if self._child is not None and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        while True:
            started = time.monotonic()
            self._child = subprocess.Popen(self.argv)
            code = self._child.wait()
            if self._stop_signal is not None or code not in RESTART_CODES:
                return code
            delay = self.backoff.after(time.monotonic() - started)
            self.restarts += 1
            log.warning(
                "%s exited %d (%s); starting it again in %.0f s (restart %d)",
                self.argv[0], code, RESTART_CODES[code], delay, self.restarts,
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                if self._stop_signal is not None:
                    return code
                time.sleep(0.1)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.splitlines()[0])
        return 0 if argv else 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s supervise: %(message)s")
    return Supervisor(argv).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
