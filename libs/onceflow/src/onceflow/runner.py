"""The lifecycle every consuming service shares (all but ingest): metrics, gRPC server, the loop on the main
thread, SIGTERM = finish the batch, commit, leave the group, stop serving."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence

from onceflow import metrics
from onceflow.admin.server import ServiceServer
from onceflow.txn.driver import ConsumerDriver

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


def run_loop_service(
    loops: ConsumerDriver | Sequence[ConsumerDriver],
    server: ServiceServer,
    metrics_port: int,
    host: str,
    grace_s: float = 5.0,
) -> int:
    """Run one loop on the main thread, or several (a service with more than one hop) on one
    thread each. When one ends (SIGTERM, or fenced), all stop; the worst exit code wins, so a
    fenced hop makes the process exit 3 like a fenced single loop. gRPC health is SERVING
    only while every loop's stage is healthy."""
    loops = [loops] if isinstance(loops, ConsumerDriver) else list(loops)

    def stop_all() -> None:
        for loop in loops:
            loop.stop()

    on_stop_signals(stop_all)
    metrics.serve(metrics_port, host)
    server.start()
    unhealthy: set[int] = set()
    lock = threading.Lock()

    def listener(index: int) -> Callable[[bool], None]:
        def changed(healthy: bool) -> None:
            with lock:
                (unhealthy.discard if healthy else unhealthy.add)(index)
                server.set_serving(not unhealthy)

        return changed

    codes = [0] * len(loops)

    def run(index: int) -> None:
        try:
            codes[index] = loops[index].run()
        finally:
            stop_all()

    for index, loop in enumerate(loops):
        loop.health_listener = listener(index)
    threads = [threading.Thread(target=run, args=(i,), name=f"loop-{loops[i].name}") for i in range(1, len(loops))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    code = max(codes)
    log.info("loops ended (exit %d); stopping the gRPC server", code)
    server.stop(grace_s)
    return code
