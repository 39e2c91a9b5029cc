"""Where a version stands in its inputs: how far behind it is, and how far back history goes.

"Behind" counts committed records, not offsets: a partition's end may be a transaction marker's
offset, which no consumer commits past, so offsets alone would show a lag of one for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import committed_offsets, end_offsets, partitions_of

# Beyond this many records a version is plainly behind: counting stops (the lag is an estimate).
COUNT_EXACTLY_UP_TO = 20_000


@dataclass(frozen=True)
class Behind:
    """Committed records of ``topic`` a group has not consumed below ``target``."""

    topic: str
    records: int
    exact: bool  # False: at least this many (counting stopped)

    def __str__(self) -> str:
        return f"{self.records}{'' if self.exact else '+'} records of {self.topic}"


def low_watermarks(common: CommonSettings, topic: str) -> dict[int, int]:
    reader = clients.reader(common)
    try:
        return {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in partitions_of(common, topic)}
    finally:
        reader.close()


def stable_ends(common: CommonSettings, topic: str) -> dict[int, int]:
    """partition -> last stable offset: the end of what read_committed readers can see."""
    return {p: lso for p, (lso, _hw) in end_offsets(common, topic).items()}


def group_positions(common: CommonSettings, group: str, topic: str) -> dict[int, int]:
    """partition -> the group's next offset, the partition's low watermark where it has none."""
    committed = committed_offsets(common, group, topic)
    lows = low_watermarks(common, topic)
    return {p: o if o >= 0 else lows.get(p, 0) for p, o in committed.items()}


def behind(common: CommonSettings, topic: str, positions: Mapping[int, int], target: Mapping[int, int]) -> Behind:
    """How many committed records lie in [positions[p], target[p]) over all partitions."""
    gaps = {p: (positions.get(p, 0), end) for p, end in target.items() if end > positions.get(p, 0)}
    if not gaps:
        return Behind(topic, 0, True)
    if sum(end - start for start, end in gaps.values()) > COUNT_EXACTLY_UP_TO:
        return Behind(topic, sum(end - start for start, end in gaps.values()), False)
    return Behind(topic, _count_committed(common, topic, gaps), True)


def _count_committed(common: CommonSettings, topic: str, gaps: Mapping[int, tuple[int, int]]) -> int:
    reader = clients.reader(common, **{"fetch.wait.max.ms": 10})
    counted = 0
    try:
        reader.assign([TopicPartition(topic, p, start) for p, (start, _end) in gaps.items()])
        open_partitions = set(gaps)
        while open_partitions:
            messages = reader.consume(500, timeout=2.0)
            if not messages:
                break
            for message in messages:
                partition = message.partition()
                if partition not in open_partitions:
                    continue
                error = message.error()
                if error is not None:
                    open_partitions.discard(partition)  # end of partition
                    continue
                offset = message.offset()
                if offset is None or offset >= gaps[partition][1]:
                    open_partitions.discard(partition)
                    continue
                counted += 1
    finally:
        reader.close()
    return counted


def earliest_retained_ms(common: CommonSettings, topic: str) -> int | None:
    """The timestamp of the oldest record still in ``topic`` (the smallest over its partitions'
    first records), None if it holds none: how far back a reprocessing can go."""
    reader = clients.reader(common, **{"isolation.level": "read_uncommitted"})
    oldest: int | None = None
    try:
        partitions = partitions_of(common, topic)
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        waiting = set(partitions)
        while waiting:
            messages = reader.consume(len(waiting) * 2, timeout=2.0)
            if not messages:
                break
            for message in messages:
                if message.partition() not in waiting:
                    continue
                waiting.discard(message.partition())
                if message.error() is None:
                    stamp = message.timestamp()[1]
                    oldest = stamp if oldest is None else min(oldest, stamp)
    finally:
        reader.close()
    return oldest


def offsets_for_time(common: CommonSettings, topic: str, at_ms: int) -> dict[int, int]:
    """partition -> the first offset whose timestamp is at or after ``at_ms`` (the end where none is)."""
    reader = clients.reader(common)
    try:
        asked = [TopicPartition(topic, p, at_ms) for p in partitions_of(common, topic)]
        found = reader.offsets_for_times(asked, timeout=10)
        ends = stable_ends(common, topic)
        return {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in found}
    finally:
        reader.close()
