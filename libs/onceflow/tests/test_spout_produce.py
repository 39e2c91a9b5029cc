"""`spout.produce_new_records` with a fake producer: each INIT names where its record landed,
no INIT is written for a record that was not delivered, and without acking only records go out."""

from __future__ import annotations

import pytest

from onceflow import spout
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage
from onceflow.v1.ingest_pb2 import IngestRecord

pytestmark = pytest.mark.foundation


class FakeMessage:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class FakeProducer:
    def __init__(self, deliver: bool = True) -> None:
        self.deliver = deliver
        self.produced: list[tuple[str, bytes | None, bytes | None, int | None]] = []
        self._callbacks: list = []

    def produce(self, topic, value, key=None, partition=None, headers=None, on_delivery=None) -> None:  # type: ignore[no-untyped-def]
        self.produced.append((topic, value, key, partition))
        if on_delivery is not None:
            self._callbacks.append(on_delivery)

    def flush(self) -> None:
        for offset, callback in enumerate(self._callbacks):
            callback(None if self.deliver else "lost", FakeMessage(offset % 3, 100 + offset))
        self._callbacks = []

    @staticmethod
    def abortable(reason: str) -> Exception:
        return RuntimeError(reason)


def _records(count: int) -> list[spout.NewRecord]:
    return [spout.new_record(IngestRecord(record_id=f"r{i}".encode(), payload=b"p"), 1) for i in range(count)]


def test_each_init_names_where_its_record_landed() -> None:
    producer, records = FakeProducer(), _records(7)
    spout.produce_new_records(producer, "ingest.records", records, spout.Inits("acker.acks", 4, 30_000))  # type: ignore[arg-type]
    assert [p[:3] for p in producer.produced[:7]] == [("ingest.records", r.envelope, r.record_id) for r in records]
    inits = [m for topic, value, _k, partition in producer.produced[7:] for m in AckerBatch.FromString(value).messages
             if topic == "acker.acks" and m.root_id % 4 == partition]
    assert len(inits) == 7 and all(m.kind == AckerMessage.INIT and m.timeout_ms == 30_000 for m in inits)
    by_root = {m.root_id: m for m in inits}
    for index, record in enumerate(records):
        init = by_root[record.root_id]
        assert (init.origin.record_id, init.origin.topic) == (record.record_id.decode(), "ingest.records")
        assert (init.origin.partition, init.origin.offset) == (index % 3, 100 + index)
        assert init.xor_value == record.edge_id and init.attempt == 1


def test_a_record_not_delivered_aborts_before_any_init() -> None:
    producer = FakeProducer(deliver=False)
    with pytest.raises(RuntimeError, match="not delivered"):
        spout.produce_new_records(producer, "ingest.records", _records(2), spout.Inits("acker.acks", 4, 1000))  # type: ignore[arg-type]
    assert all(topic == "ingest.records" for topic, *_ in producer.produced)


def test_without_acking_only_the_records_are_written() -> None:
    producer = FakeProducer()
    spout.produce_new_records(producer, "ingest.records", _records(3), None)  # type: ignore[arg-type]
    assert [topic for topic, *_ in producer.produced] == ["ingest.records"] * 3
