"""Ingest ends with the code of whatever part of it stopped, so a supervisor restarts it: its
committer and its replayer are workers of the shared lifecycle (`onceflow.runner`), which stops
them all when one ends and exits with the code of the one that ended first."""

from __future__ import annotations

import threading
from collections.abc import Callable

from onceflow.runner import EXIT_FAILED, run_loop_service
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART

from onceflow_ingest.service import CommitterWorker


class _Committer:
    def __init__(self) -> None:
        self.died, self.fenced = threading.Event(), threading.Event()
        self.closed = False

    def start(self) -> None:
        pass

    def close(self, timeout_s: float) -> None:
        self.closed = True


class _Replayer:
    """A hop that ends by itself with ``code`` (None: runs until stopped)."""

    name = "ingest-replayer"

    def __init__(self, code: int | None) -> None:
        self.code, self.stopped = code, threading.Event()
        self.health_listener: Callable[[bool], None] = lambda _healthy: None

    def run(self) -> int:
        if self.code is not None:
            return self.code
        self.stopped.wait(10)
        return EXIT_OK

    def stop(self) -> None:
        self.stopped.set()


class _Server:
    def __init__(self) -> None:
        self.serving: list[bool] = []

    def start(self) -> None:
        pass

    def stop(self, grace_s: float) -> None:
        pass

    def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)


def _run(committer: _Committer, replayer: _Replayer) -> int:
    worker = CommitterWorker(committer, grace_s=1.0)  # type: ignore[arg-type]
    return run_loop_service([worker, replayer], _Server(), metrics_port=0, host="127.0.0.1", calls_first=True)  # type: ignore[arg-type]


def test_serves_on_while_every_part_runs() -> None:
    committer, replayer = _Committer(), _Replayer(None)
    worker = CommitterWorker(committer, grace_s=1.0)  # type: ignore[arg-type]
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(worker.run()))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not done  # nothing ended it
    worker.stop()
    thread.join(5)
    assert done == [EXIT_OK] and committer.closed  # a stop commits what is queued
    replayer.stop()


def test_a_stuck_replayer_ends_ingest_for_a_restart() -> None:
    committer = _Committer()
    assert _run(committer, _Replayer(EXIT_RESTART)) == EXIT_RESTART
    assert committer.closed


def test_a_fenced_replayer_or_committer_ends_ingest_as_fenced() -> None:
    assert _run(_Committer(), _Replayer(EXIT_FENCED)) == EXIT_FENCED
    fenced = _Committer()
    fenced.fenced.set()
    assert _run(fenced, _Replayer(None)) == EXIT_FENCED


def test_a_replayer_that_returned_unasked_is_a_failure() -> None:
    assert _run(_Committer(), _Replayer(EXIT_OK)) == EXIT_FAILED
    died = _Committer()
    died.died.set()
    assert _run(died, _Replayer(None)) == EXIT_FAILED
