"""The lifecycle every loop-based service shares: metrics, gRPC server, the loop on the main
thread, SIGTERM = finish the batch, commit, leave the group, stop serving."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from onceflow import metrics
from onceflow.admin.server import ServiceServer
from onceflow.txn.loop import TransactionalLoop

log = logging.getLogger(__name__)


def on_stop_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call ``stop`` on a fresh thread. Never from the handler itself: a
    handler runs on the main thread between bytecodes, possibly while that thread holds the
    lock inside the very Event the handler would set (``Event.wait`` in the main loop), and
    that lock is not reentrant: the process would hang, ignoring every later SIGTERM."""

    def handle(_signum: int, _frame: object) -> None:
        threading.Thread(target=stop, name="stop-signal", daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)


def run_loop_service(loop: TransactionalLoop, server: ServiceServer, metrics_port: int, host: str, grace_s: float = 5.0) -> int:
    on_stop_signals(loop.stop)
    metrics.serve(metrics_port, host)
    server.start()
    code = loop.run()
    log.info("loop ended (exit %d); stopping the gRPC server", code)
    server.stop(grace_s)
    return code
