"""The lifecycle every service shares: metrics, the gRPC server, its workers (each hop's loop;
ingest's group committer) on a thread each, SIGTERM = finish the batch, commit, leave the group,
stop serving."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from onceflow import metrics
from onceflow.admin.server import ServiceServer
from onceflow.txn.errors import EXIT_OK

log = logging.getLogger(__name__)

EXIT_FAILED = 1  # a worker died, or ended unasked: a supervisor restarts the process


class Worker(Protocol):
    """One long-running part of a service: a hop's loop (`ConsumerDriver`), ingest's group
    committer. ``run`` returns its exit code once stopped, or on its own when it cannot go on
    (fenced 3, stuck 4); ``stop`` asks it to finish gracefully; it tells ``health_listener``
    False while it cannot make progress and True once it can again."""

    name: str
    health_listener: Callable[[bool], None]

    def run(self) -> int: ...

    def stop(self) -> None: ...


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
    workers: Worker | Sequence[Worker],
    server: ServiceServer,
    metrics_port: int,
    host: str,
    grace_s: float = 5.0,
    calls_first: bool = False,
) -> int:
    """Run the workers, one on the main thread and the others on a thread each. When one ends
    (SIGTERM, fenced, stuck, died), all stop. The code is that of the first to end: the cause;
    one that ended with 0 unasked failed. gRPC health is SERVING only while every worker is
    healthy. ``calls_first``: the service's calls feed a worker (ingest's feed its committer),
    so a stop first refuses new calls and lets running ones finish, then stops the workers."""
    workers = [workers] if not isinstance(workers, Sequence) else list(workers)
    lock = threading.Lock()
    asked = threading.Event()
    stopped = False

    def stop_all(serve_grace_s: float) -> None:
        nonlocal stopped
        with lock:
            if stopped:
                return
            stopped = True
        if calls_first:
            log.info("stopping: refusing new calls, letting the running ones finish (%.0f s at most)", serve_grace_s)
            server.stop(serve_grace_s)
        for worker in workers:
            worker.stop()

    def on_signal() -> None:
        asked.set()
        stop_all(grace_s)

    on_stop_signals(on_signal)
    metrics.serve(metrics_port, host)
    server.start()
    unhealthy: set[int] = set()

    def listener(index: int) -> Callable[[bool], None]:
        def changed(healthy: bool) -> None:
            with lock:
                (unhealthy.discard if healthy else unhealthy.add)(index)
                server.set_serving(not unhealthy)

        return changed

    ended: list[int] = []  # exit codes in the order the workers ended

    def run(index: int) -> None:
        code = EXIT_FAILED
        try:
            code = workers[index].run()
        finally:
            with lock:
                first = not stopped
            if first and code == EXIT_OK and not asked.is_set():
                log.error("%s ended unasked; stopping the service for a restart", workers[index].name)
                code = EXIT_FAILED
            ended.append(code)
            stop_all(grace_s if code == EXIT_OK else 0.0)

    for index, worker in enumerate(workers):
        worker.health_listener = listener(index)
    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{workers[i].name}") for i in range(1, len(workers))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    code = next((c for c in ended if c != EXIT_OK), EXIT_OK)
    log.info("workers ended (exit %d); stopping the gRPC server", code)
    server.stop(grace_s)
    return code
