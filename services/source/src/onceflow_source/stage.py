"""The source's stage on the shared loop: each record of the user's topic becomes a new record
of ingest.records (as ingest writes it, INIT included), or a dead letter with the reason."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from onceflow import spout
from onceflow.kafka.records import offset_of, partition_of
from onceflow.state.store import KeyValueStore
from onceflow.trees import InFlightTrees
from onceflow.txn.batch import Batch

from onceflow_source.mapping import Mapping, SourceRecord, Unmappable, map_record


@dataclass
class SourceCounts:
    copied: int = 0
    dead_lettered: int = 0


def source_record(message: Message) -> SourceRecord:
    kind, timestamp = message.timestamp()
    return SourceRecord(
        topic=message.topic() or "",
        partition=partition_of(message),
        offset=offset_of(message),
        key=message.key(),
        value=message.value(),
        headers=_headers_of(message),
        timestamp_ms=0 if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
    )


def _headers_of(message: Message) -> list[tuple[str, bytes | None]]:
    """A consumed record's headers; librdkafka gives (name, bytes or None) pairs."""
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in pairs]


class SourceStage:
    name = "source"

    def __init__(
        self, mapping: Mapping, ingest_topic: str, tree_timeout_ms: int | None, trees: InFlightTrees | None = None
    ) -> None:
        self._mapping = mapping
        self._ingest_topic = ingest_topic
        self._tree_timeout_ms = tree_timeout_ms  # None: acking off
        # The trees this instance started and that have not ended yet (acker.events): the cap.
        self.trees = trees
        self.counts = SourceCounts()

    def process(self, batch: Batch[KeyValueStore]) -> None:
        copied = dead = 0
        started: list[tuple[int, str]] = []
        for message in batch.records:
            try:
                record = map_record(source_record(message), self._mapping)
            except Unmappable as exc:
                batch.dead_letter(message, exc)
                dead += 1
                continue
            new = spout.new_record(record, batch.now_ms, self._mapping.producer)
            batch.emit_new(self._ingest_topic, new, self._tree_timeout_ms)
            started.append((new.root_id, new.record_id.decode(errors="replace")))
            copied += 1

        def count() -> None:
            self.counts.copied += copied
            self.counts.dead_lettered += dead
            if self.trees is not None and self._tree_timeout_ms is not None:
                self.trees.add(started)  # committed: their INITs are the acker's now

        batch.after_commit.append(count)
