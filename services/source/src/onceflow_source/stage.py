"""The source's stage on the shared loop: each record of the user's topic becomes a new record
of ingest.records (as ingest writes it, INIT included), or a dead letter with the reason."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from onceflow import spout
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
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        key=message.key(),
        value=message.value(),
        headers=message.headers() or (),
        timestamp_ms=0 if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
    )


class SourceStage:
    name = "source"

    def __init__(self, mapping: Mapping, ingest_topic: str, tree_timeout_ms: int | None) -> None:
        self._mapping = mapping
        self._ingest_topic = ingest_topic
        self._tree_timeout_ms = tree_timeout_ms  # None: acking off
        self.counts = SourceCounts()

    def process(self, batch: Batch) -> None:
        copied = dead = 0
        for message in batch.records:
            try:
                record = map_record(source_record(message), self._mapping)
            except Unmappable as exc:
                batch.dead_letter(message, exc)
                dead += 1
                continue
            batch.emit_new(self._ingest_topic, spout.new_record(record, batch.now_ms), self._tree_timeout_ms)
            copied += 1

        def count() -> None:
            self.counts.copied += copied
            self.counts.dead_lettered += dead

        batch.after_commit.append(count)
