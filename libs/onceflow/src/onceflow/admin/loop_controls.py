"""Admin controls for any service built on the shared loop."""

from __future__ import annotations

from collections.abc import Callable

from onceflow.admin.server import StatusSnapshot
from onceflow.txn.loop import TransactionalLoop


class LoopControls:
    def __init__(self, loop: TransactionalLoop, gauges: Callable[[], dict[str, float]] = dict) -> None:
        self._loop = loop
        self._gauges = gauges

    def status(self) -> StatusSnapshot:
        stats = self._loop.stats
        return StatusSnapshot(
            state=self._loop.state.value,
            partitions=[(p.topic, p.partition, p.position, p.lag) for p in stats.partitions],
            transactions_committed=stats.committed,
            transactions_aborted=stats.aborted,
            records_in=stats.records_in,
            records_out=stats.records_out,
            last_error=stats.last_error,
            gauges=self._gauges(),
        )

    def pause(self) -> str:
        self._loop.pause()
        return "PAUSED"

    def resume(self) -> str:
        self._loop.resume()
        return "RUNNING"

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        drained = self._loop.drain(timeout_s)
        return ("DRAINED" if drained else "DRAINING"), drained
