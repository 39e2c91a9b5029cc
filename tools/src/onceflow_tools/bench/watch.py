"""How far a consumer group has committed: the one progress measure every contender of ``onceflow
bench`` is timed by, whether it is a onceflow service, the copier or a Quix Streams app."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import partitions_of
from onceflow_tools.bench.cpu import HopCpu


class GroupWatch:
    def __init__(self, common: CommonSettings, group: str, topic: str) -> None:
        # Never subscribes: it only asks the group coordinator, it does not join the group.
        # read_uncommitted, so that librdkafka does not ask for stable offsets (KIP-447): with
        # them, the coordinator holds the answer while the group has a transactional offset
        # commit pending, which a busy exactly-once contender nearly always has; a watch
        # blocked for up to a second saw a burst of commits at once and misdated it (a gate
        # timed at 780,975 records/s). Either way only committed transactions' offsets show.
        self._consumer = clients.consumer(common, group, **{"isolation.level": "read_uncommitted"})
        self._partitions = [TopicPartition(topic, p) for p in partitions_of(common, topic)]

    def offsets(self) -> dict[int, int]:
        """partition -> committed offset (0 for none)."""
        return {tp.partition: max(tp.offset, 0) for tp in self._consumer.committed(self._partitions, timeout=10)}

    def committed(self) -> int:
        """Records committed over every partition (offsets, so on a topic without transaction
        markers: records consumed)."""
        return sum(self.offsets().values())

    def close(self) -> None:
        self._consumer.close()


@dataclass(frozen=True)
class BacklogRun:
    records: int  # committed between the first commit and the end
    seconds: float
    # A peer's whole run as its own wall clock sees it: from its process start (JVM or Python
    # start, group join, the first checkpoint included) to the end, over every record. The
    # cross-check of ``records_per_s`` for a peer that commits rarely: a checkpoint every 5 s can
    # hold most of the backlog, and then the span after the first commit says little.
    start_records: int = 0
    start_seconds: float | None = None
    cpu: HopCpu | None = None  # CPU per record over the same span as ``records_per_s``

    @property
    def records_per_s(self) -> float:
        return self.records / max(self.seconds, 1e-9)

    @property
    def records_per_s_from_start(self) -> float | None:
        return None if self.start_seconds is None else self.start_records / max(self.start_seconds, 1e-9)


def time_backlog(
    watch: GroupWatch, total: int, alive: Callable[[], bool], finished: Callable[[], bool] = lambda: True,
    timeout_s: float = 600.0, after: int = 0, started: float | None = None,
    on_first: Callable[[], None] = lambda: None,
) -> BacklogRun:
    """From the group's first commit past ``after`` (what a warm-up consumed) until it has
    committed all ``total`` records and ``finished()`` holds: startup and the group join are not
    counted, for anyone. With ``started`` (``time.monotonic()`` at the process start) the run
    also carries the whole span from there. ``on_first`` runs at the first commit, where the
    timed span starts (a CPU meter starts there)."""
    first: tuple[float, int] | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        done = watch.committed()
        now = time.monotonic()  # when the coordinator answered, not when it was asked
        if done > after and first is None:
            first = (now, done)
            on_first()
        if done >= total and finished():
            break
        if not alive():
            raise RuntimeError(f"the process under test exited at {done:,} of {total:,} records")
        if now > deadline:
            raise TimeoutError(f"{done:,} of {total:,} records committed after {timeout_s:.0f} s")
        time.sleep(0.05)
    assert first is not None
    if started is None:
        return BacklogRun(total - first[1], now - first[0])
    return BacklogRun(total - first[1], now - first[0], start_records=total - after, start_seconds=now - started)
