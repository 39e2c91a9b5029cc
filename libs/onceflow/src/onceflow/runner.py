"""The lifecycle every loop-based service shares: metrics, gRPC server, the loop on the main
thread, SIGTERM = finish the batch, commit, leave the group, stop serving."""

from __future__ import annotations

import logging
import signal

from onceflow import metrics
from onceflow.admin.server import ServiceServer
from onceflow.txn.loop import TransactionalLoop

log = logging.getLogger(__name__)


def run_loop_service(loop: TransactionalLoop, server: ServiceServer, metrics_port: int, host: str, grace_s: float = 5.0) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop())
    metrics.serve(metrics_port, host)
    server.start()
    code = loop.run()
    log.info("loop ended (exit %d); stopping the gRPC server", code)
    server.stop(grace_s)
    return code
