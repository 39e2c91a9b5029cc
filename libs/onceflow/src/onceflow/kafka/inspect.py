"""Reading topics back as a consumer that only sees committed data: used by the checker, the
demo and `onceflow verify`-style tools, never on the hot path."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.records import headers_of, offset_of, partition_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


def partitions_of(common: CommonSettings, topic: str) -> list[int]:
    metadata = clients.admin(common).list_topics(topic, timeout=10)
    return sorted(metadata.topics[topic].partitions)


def wait_partition_count(common: CommonSettings, topic: str, stop: threading.Event) -> int:
    """``topic``'s partition count, retried while the broker starts or the topic is missing;
    0 if ``stop`` is set first."""
    while True:
        try:
            count = len(partitions_of(common, topic))
            if count:
                return count
            problem = "no such topic (run `onceflow infra topics`)"
        except Exception as exc:  # noqa: BLE001 - the broker may still be starting
            problem = str(exc)
        log.warning("%s: %s; retrying", topic, problem)
        if stop.wait(1.0):
            return 0


def end_offsets(common: CommonSettings, topic: str, timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark). Retried while the topic's leaders are
    still being elected (a topic created a moment ago, a broker that just restarted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _end_offsets(common, topic)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            transient = isinstance(err, KafkaError) and (err.retriable() or err.code() in _LEADERSHIP_CODES)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


_LEADERSHIP_CODES = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


def _end_offsets(common: CommonSettings, topic: str) -> dict[int, tuple[int, int]]:
    admin = clients.admin(common)
    result: dict[int, list[int]] = {}
    partitions = partitions_of(common, topic)
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
        for tp, future in admin.list_offsets(request, isolation_level=isolation, request_timeout=15).items():
            result.setdefault(tp.partition, []).append(future.result().offset)
    return {p: (offsets[0], offsets[1]) for p, offsets in result.items()}


def hanging_transactions(common: CommonSettings, topics: Iterable[str], wait_s: float = 0.0) -> dict[str, list[int]]:
    """Partitions whose read_committed end is below the high watermark (an open transaction),
    after waiting up to ``wait_s`` for open transactions to finish or time out."""
    deadline = time.monotonic() + wait_s
    while True:
        hanging = {}
        for topic in topics:
            stuck = [p for p, (lso, hw) in end_offsets(common, topic).items() if lso < hw]
            if stuck:
                hanging[topic] = stuck
        if not hanging or time.monotonic() >= deadline:
            return hanging
        time.sleep(0.5)


def committed_offsets(common: CommonSettings, group_id: str, topic: str) -> dict[int, int]:
    """partition -> the group's committed offset (-1001 when none). A consumer that never
    subscribes only asks the coordinator; it does not join the group."""
    reader = clients.consumer(common, group_id)
    try:
        asked = [TopicPartition(topic, p) for p in partitions_of(common, topic)]
        return {tp.partition: tp.offset for tp in reader.committed(asked, timeout=10)}
    finally:
        reader.close()


def consumed_everything(common: CommonSettings, group_id: str, topic: str) -> bool:
    """Whether the group has committed past every committed record of ``topic``. Not "offset
    == end offset": the end may be a transaction marker's offset, which no consumer commits
    past, so this reads what lies after the group's offsets instead."""
    committed = committed_offsets(common, group_id, topic)
    return not read_committed(common, topic, start={p: max(o, 0) for p, o in committed.items()})


def read_committed(
    common: CommonSettings,
    topic: str,
    start: Mapping[int, int] | None = None,
    timeout_s: float = 120.0,
    on_progress: Callable[[int], None] | None = None,
) -> list[TopicRecord]:
    """Every committed record of ``topic`` (from ``start`` offsets, else the beginning) up to
    each partition's last stable offset."""
    return _read(common, topic, start, timeout_s, on_progress, "read_committed")


def find_committed(
    common: CommonSettings, topic: str, keep: Callable[[TopicRecord], bool], timeout_s: float = 120.0
) -> list[TopicRecord]:
    """The committed records of ``topic`` that ``keep`` accepts, read from the beginning to each
    partition's end without holding the rest: a lookup in a topic of any size."""
    return _read(common, topic, None, timeout_s, None, "read_committed", keep)


def latest_by_key(records: Iterable[TopicRecord]) -> dict[tuple[int, bytes], bytes]:
    """A compacted changelog read as a table: (partition, key) -> last value, tombstones removed
    (keyless records are not part of the table)."""
    table: dict[tuple[int, bytes], bytes] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if record.key is None:
            continue
        if record.value is None:
            table.pop((record.partition, record.key), None)
        else:
            table[(record.partition, record.key)] = record.value
    return table


def read_uncommitted(common: CommonSettings, topic: str, timeout_s: float = 120.0) -> list[TopicRecord]:
    """Every record of ``topic`` up to the high watermark, aborted transactions' included: what
    a checker compares the committed read with to find the aborted writes."""
    return _read(common, topic, None, timeout_s, None, "read_uncommitted")


def _read(
    common: CommonSettings,
    topic: str,
    start: Mapping[int, int] | None,
    timeout_s: float,
    on_progress: Callable[[int], None] | None,
    isolation: str,
    keep: Callable[[TopicRecord], bool] | None = None,
) -> list[TopicRecord]:
    # A read to the end: the broker answers a fetch at the end at once instead of holding it
    # for fetch.wait.max.ms (500), and a short consume returns what came instead of waiting for
    # 10,000 records. A checker's read of a small topic took 1.6 s, now a small part of that.
    reader = clients.reader(common, **{"isolation.level": isolation, "fetch.wait.max.ms": 10})
    records: list[TopicRecord] = []
    try:
        partitions = partitions_of(common, topic)
        starts = start or {}
        reader.assign([TopicPartition(topic, p, starts.get(p, OFFSET_BEGINNING)) for p in partitions])
        pending = set(partitions)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} did not reach their end")
            for message in clients.consume_ready(reader, 10_000, 0.05):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                record = TopicRecord(
                    partition_of(message), offset_of(message), message.key(), message.value(), headers_of(message)
                )
                if keep is None or keep(record):
                    records.append(record)
            if on_progress is not None:
                on_progress(len(records))
    finally:
        reader.close()
    return records
