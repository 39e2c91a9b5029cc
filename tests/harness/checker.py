"""The checker: reads topics back read_committed and says what was lost, duplicated or left
hanging. Modelled on Kafka's transactions_test.py and Jepsen's Kafka checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from onceflow.codec import decode_envelope
from onceflow.kafka.inspect import (
    TopicRecord, consumed_everything, end_offsets, hanging_transactions, latest_by_key, read_committed,
)

__all__ = [
    "DeliveryReport", "ResultFold", "TopicRecord", "consumed_everything", "end_offsets", "fold_results", "hanging_transactions", "latest_by_key", "read_committed",
    "record_id", "record_id_of_bytes",
]


def record_id(record: TopicRecord) -> str:
    return decode_envelope(record.value).record_id


def record_id_of_bytes(value: bytes) -> str:
    return decode_envelope(value).record_id


@dataclass
class DeliveryReport:
    """How many times each record_id appears, against what should appear."""

    expected: set[str]
    seen: Counter[str] = field(default_factory=Counter)
    allowed_duplicates: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, records: Iterable[TopicRecord], expected: Iterable[str], allowed_duplicates: Iterable[str] = ()) -> DeliveryReport:
        seen = Counter(record_id(r) for r in records)
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


@dataclass
class ResultFold:
    """compute.results of one job applied in order: the final table, and every change that
    contradicts the table at that point (a duplicate or a lost change shows up here)."""

    table: dict[str, bytes] = field(default_factory=dict)
    changes: int = 0
    problems: list[str] = field(default_factory=list)


def fold_results(records: Iterable[TopicRecord], job: str) -> ResultFold:
    from onceflow.v1.results_pb2 import ResultChange

    fold = ResultFold()
    upserts: set[tuple[str, bytes]] = set()
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        change = ResultChange.FromString(record.value)
        if change.job != job:
            continue
        fold.changes += 1
        current = fold.table.get(change.key)
        if change.op == ResultChange.RETRACT:
            if current != change.value:
                fold.problems.append(f"{change.key}: retracts {change.value!r} but the row is {current!r}")
            fold.table.pop(change.key, None)
        else:
            if current is not None:
                fold.problems.append(f"{change.key}: upsert {change.value!r} over {current!r} without a retraction")
            if (change.key, change.value) in upserts:
                fold.problems.append(f"{change.key}: the row {change.value!r} was upserted twice")
            upserts.add((change.key, change.value))
            fold.table[change.key] = change.value
    return fold
