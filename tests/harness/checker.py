"""The checker: reads topics back read_committed and says what was lost, duplicated or left
hanging. Modelled on Kafka's transactions_test.py and Jepsen's Kafka checks."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import OffsetSpec

from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.v1.envelope_pb2 import Envelope


@dataclass(frozen=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]

    def envelope(self) -> Envelope:
        return decode_envelope(self.value)

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


def partitions_of(common: CommonSettings, topic: str) -> list[int]:
    metadata = clients.admin(common).list_topics(topic, timeout=10)
    return sorted(metadata.topics[topic].partitions)


def end_offsets(common: CommonSettings, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark)."""
    admin = clients.admin(common)
    result: dict[int, list[int]] = {}
    for isolation in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions_of(common, topic)}
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


def read_committed(common: CommonSettings, topic: str, timeout_s: float = 60.0) -> list[TopicRecord]:
    """Every committed record of ``topic``, up to each partition's last stable offset."""
    reader = clients.reader(common)
    records: list[TopicRecord] = []
    try:
        partitions = partitions_of(common, topic)
        reader.assign([TopicPartition(topic, p, -2) for p in partitions])
        pending = set(partitions)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} did not reach their end")
            for message in reader.consume(num_messages=10_000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {error}")
                records.append(
                    TopicRecord(
                        message.partition(),
                        message.offset(),
                        message.key(),
                        message.value(),
                        tuple(message.headers() or ()),
                    )
                )
    finally:
        reader.close()
    return records


def latest_by_key(records: Iterable[TopicRecord]) -> dict[tuple[int, bytes], bytes]:
    """A compacted changelog read as a table: (partition, key) -> last value, tombstones removed."""
    table: dict[tuple[int, bytes], bytes] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key is not None
        if record.value is None:
            table.pop((record.partition, record.key), None)
        else:
            table[(record.partition, record.key)] = record.value
    return table


@dataclass
class DeliveryReport:
    """How many times each record_id appears, against what should appear."""

    expected: set[str]
    seen: Counter[str] = field(default_factory=Counter)
    allowed_duplicates: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, records: Iterable[TopicRecord], expected: Iterable[str], allowed_duplicates: Iterable[str] = ()) -> DeliveryReport:
        seen = Counter(r.envelope().record_id for r in records)
        return cls(set(expected), seen, set(allowed_duplicates))

    @property
    def missing(self) -> set[str]:
        return {rid for rid in self.expected if self.seen[rid] == 0}

    @property
    def duplicated(self) -> dict[str, int]:
        return {rid: n for rid, n in self.seen.items() if n > 1}

    @property
    def unexpected(self) -> set[str]:
        return set(self.seen) - self.expected

    def summary(self) -> str:
        dup = self.duplicated
        return (
            f"expected={len(self.expected)} distinct_seen={len(self.seen)} total_seen={sum(self.seen.values())} "
            f"missing={len(self.missing)} duplicated={len(dup)} unexpected={len(self.unexpected)} "
            f"e.g. missing={sorted(self.missing)[:5]} duplicated={sorted(dup.items())[:5]}"
        )

    def assert_exactly_once(self) -> None:
        assert not self.missing and not self.duplicated and not self.unexpected, self.summary()

    def assert_at_least_once(self) -> None:
        """Nothing missing; duplicates only where a client retried."""
        unexplained = set(self.duplicated) - self.allowed_duplicates
        assert not self.missing and not self.unexpected and not unexplained, (
            f"{self.summary()} unexplained duplicates={sorted(unexplained)[:5]}"
        )
