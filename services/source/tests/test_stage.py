"""The source's stage on a real Batch (no broker): good records become new roots as ingest writes
them, bad ones dead letters with their reason class, and one bad record stops nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from onceflow import streams
from onceflow.codec import decode_envelope
from onceflow.spout import Limits
from onceflow.trees import InFlightTrees
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow_client.kafka_identity import KafkaOrigin
from onceflow_source.mapping import Mapping
from onceflow_source.service import PendingCap
from onceflow_source.stage import SourceStage

pytestmark = pytest.mark.source


@dataclass
class FakeMessage:
    _value: bytes | None
    _offset: int
    _key: bytes | None = b"k"
    _headers: list[tuple[str, bytes]] = field(default_factory=list)

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1000 + self._offset


def test_good_records_become_new_roots_and_bad_ones_dead_letters() -> None:
    messages = [FakeMessage(b'{"id": "a"}', 0), FakeMessage(b"{}", 1), FakeMessage(b"oops", 2), FakeMessage(b'{"id": 5}', 3),
                FakeMessage(b'{"id": "big", "pad": "' + b"x" * 2000 + b'"}', 4)]
    batch = Batch(messages, None, "p.source.dlq", "source", "p.acker.acks", 4)  # type: ignore[arg-type]
    stage = SourceStage(Mapping(Limits(1000, 100), id_field="id"), "p.ingest.records", tree_timeout_ms=30_000)
    stage.process(batch)
    assert [(r.topic, r.record.record_id, r.tree_timeout_ms) for r in batch.new_roots] == [
        ("p.ingest.records", b"a", 30_000), ("p.ingest.records", b"5", 30_000)]
    assert decode_envelope(batch.new_roots[0].record.envelope).event_time_ms == 1000
    letters = [DeadLetter.FromString(out.value or b"") for out in batch.outputs]
    assert all(out.topic == "p.source.dlq" for out in batch.outputs)
    assert [(d.source_offset, d.error_class) for d in letters] == [(1, "NoIdField"), (2, "Unparsable"), (4, "OverLimit")]
    assert letters[2].message.startswith("payload: ") and letters[1].original == b"oops"
    assert batch.dead_letters == 3
    for callback in batch.after_commit:
        callback()
    assert (stage.counts.copied, stage.counts.dead_lettered) == (2, 3)


def test_without_acking_the_roots_carry_no_tree_timeout() -> None:
    batch = Batch([FakeMessage(b"v", 9)], None, "dlq", "source")  # type: ignore[list-item]
    mapping = Mapping(Limits(1000, 100), origin=KafkaOrigin("cluster-a", "topic-a"))
    SourceStage(mapping, "ingest.records", tree_timeout_ms=None).process(batch)
    assert [(r.record.record_id, r.tree_timeout_ms) for r in batch.new_roots] == [(b"kafka://cluster-a/orders/topic-a/2/9", None)]


def test_trees_count_against_the_cap_once_committed_and_leave_it_when_they_end() -> None:
    """ONCEFLOW_SOURCE_MAX_PENDING: what PendingCap holds the loop on."""
    trees = InFlightTrees(max_attempts=1)
    stage = SourceStage(Mapping(Limits(1000, 100), id_field="id"), "p.ingest.records", 30_000, trees)
    cap = PendingCap(trees, max_pending=2)
    batch = Batch([FakeMessage(b'{"id": "a"}', 0), FakeMessage(b'{"id": "b"}', 1), FakeMessage(b"oops", 2)],
                  None, "p.source.dlq", "source", "p.acker.acks", 4)  # type: ignore[arg-type]
    stage.process(batch)
    assert len(trees) == 0 and not cap()  # an aborted batch starts no tree
    for committed in batch.after_commit:
        committed()
    assert len(trees) == 2 and cap()  # the letter started none
    trees.on_event(TreeEvent(root_id=batch.new_roots[0].record.root_id, outcome=TreeEvent.COMPLETED, attempt=1))
    assert len(trees) == 1 and not cap()


def test_a_source_with_a_producer_name_scopes_its_record_ids_by_it() -> None:
    """ONCEFLOW_SOURCE_PRODUCER (issue 39): the gate keys its records by (stream, producer, id),
    so an ingest caller sending the same ids first drops none of them."""
    batch = Batch([FakeMessage(b'{"id": "a"}', 0)], None, "p.source.dlq", "source", "p.acker.acks", 4)  # type: ignore[arg-type]
    SourceStage(Mapping(Limits(1000, 100), id_field="id", producer="orders-source"), "p.ingest.records", 30_000).process(batch)
    envelope = decode_envelope(batch.new_roots[0].record.envelope)
    assert envelope.producer == "orders-source"
    assert streams.identity(envelope.stream, envelope.record_id, producer=envelope.producer) != streams.identity("", "a")
