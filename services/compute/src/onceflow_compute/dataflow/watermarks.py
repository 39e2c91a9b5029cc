"""Event-time watermarks: how far a worker's input has progressed in event time.

Per input partition the watermark is the newest event time seen minus the out-of-orderness
bound: an event older than that is late. The worker's watermark is the minimum over its
assigned partitions, because the slowest one decides what may still arrive; a partition that has
sent nothing for ``idle_timeout_ms`` of processing time (or nothing since it was assigned) is
left out, so a quiet partition cannot stall the whole worker. The worker's watermark never goes
back: a rebalance that hands it a slower partition holds it, it does not rewind it.

Pure: no Kafka, no clock. Callers pass processing time in. Readers (Stats, metrics) may call
from other threads than the one observing: they iterate over snapshots of the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class _PartitionTime:
    newest_event_ms: int | None
    last_activity_ms: int


class WatermarkTracker:
    def __init__(self, bound_ms: int, idle_timeout_ms: int) -> None:
        if bound_ms < 0 or idle_timeout_ms <= 0:
            raise ValueError("bound_ms must be >= 0 and idle_timeout_ms > 0")
        self.bound_ms = bound_ms
        self.idle_timeout_ms = idle_timeout_ms
        self._partitions: dict[int, _PartitionTime] = {}
        self._emitted: int | None = None

    def assign(self, partitions: Iterable[int], now_ms: int) -> None:
        for partition in partitions:
            self._partitions.setdefault(partition, _PartitionTime(None, now_ms))

    def revoke(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self._partitions.pop(partition, None)

    def observe(self, partition: int, event_time_ms: int, now_ms: int) -> None:
        state = self._partitions.setdefault(partition, _PartitionTime(None, now_ms))
        if state.newest_event_ms is None or event_time_ms > state.newest_event_ms:
            state.newest_event_ms = event_time_ms
        state.last_activity_ms = max(state.last_activity_ms, now_ms)

    def partition_watermark(self, partition: int) -> int | None:
        state = self._partitions.get(partition)
        if state is None or state.newest_event_ms is None:
            return None
        return state.newest_event_ms - self.bound_ms

    def is_idle(self, partition: int, now_ms: int) -> bool:
        state = self._partitions.get(partition)
        return state is None or now_ms - state.last_activity_ms >= self.idle_timeout_ms

    def watermark(self, now_ms: int) -> int | None:
        """The worker's watermark (None until some active partition has seen an event)."""
        table = list(self._partitions.items())
        active = [state for _p, state in table if now_ms - state.last_activity_ms < self.idle_timeout_ms]
        if active and all(state.newest_event_ms is not None for state in active):
            current = min(state.newest_event_ms for state in active if state.newest_event_ms is not None) - self.bound_ms
            if self._emitted is None or current > self._emitted:
                self._emitted = current
        return self._emitted

    def partitions(self) -> dict[int, int | None]:
        return {p: self.partition_watermark(p) for p in sorted(list(self._partitions))}
