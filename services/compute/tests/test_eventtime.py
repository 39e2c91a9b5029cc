"""The map hop's lateness rule: judged against the record's partition watermark, which carries
over from committed batches (a restart resumes it), never from batch boundaries."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Message

from onceflow.codec import encode_envelope
from onceflow.state import MemoryStore
from onceflow.topology import Topic, job_topic
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope

from onceflow_compute.api import Aggregation, Count, Hopping, Tumbling
from onceflow_compute.frames import build_frame
from onceflow_compute.map.eventtime import EventTimeGate

pytestmark = pytest.mark.dataflow

SCHEMA = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("t", pa.int64(), nullable=False)])

PARTIALS = job_topic(Topic.COMPUTE_PARTIALS, "j")


def job(window) -> Aggregation:  # type: ignore[no-untyped-def]
    return Aggregation(name="j", schema=SCHEMA, key="user", aggregates=(Count("n"),), window=window, time_column="t")


def record(offset: int, t: int, partition: int = 0) -> Message:
    payload = json.dumps({"user": "u", "t": t}).encode()
    envelope = Envelope(record_id=f"r{offset}", root_id=offset + 1, edge_id=offset + 100, payload=payload, key=b"u")
    return Message(topic=Topic.DEDUP_RECORDS, partition=partition, offset=offset, key=b"u", value=encode_envelope(envelope))


def run(gate: EventTimeGate, stores: dict[int, MemoryStore], records: list[Message]) -> tuple[list[str], Batch]:
    """One batch through the gate, committed: the kept record ids, and the batch."""
    batch = Batch(records, stores, Topic.COMPUTE_DLQ, "compute")  # type: ignore[arg-type]
    kept, _late, marks = gate.split(build_frame(records, SCHEMA), batch)
    assert not [o for o in batch.outputs if o.topic.endswith("partials")]  # watermarks wait for the partials
    gate.emit_watermarks(batch, marks)
    for partition, overlay in batch.overlays.items():
        stores[partition].apply(overlay.changes, None)
    return [e.record_id for e in kept.envelopes], batch


def late_ids(batch: Batch) -> list[str]:
    letters = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.COMPUTE_LATE]
    return [Envelope.FromString(letter.original).record_id for letter in letters]


def test_the_watermark_carries_over_committed_batches() -> None:
    gate = EventTimeGate(job(Tumbling(1_000)), 100, Topic.COMPUTE_LATE, PARTIALS, 2, 1)
    stores = {0: MemoryStore()}
    kept, _ = run(gate, stores, [record(0, 5_000)])
    assert kept == ["r0"]
    # A new batch (or a restarted worker) starts from the committed newest event time, 5000:
    # the watermark is 4900, so [1000, 2000) has expired and [4000, 5000) has not.
    kept, batch = run(gate, stores, [record(1, 1_500), record(2, 4_950)])
    assert kept == ["r2"] and late_ids(batch) == ["r1"]
    letter = DeadLetter.FromString(next(o.value for o in batch.outputs if o.topic == Topic.COMPUTE_LATE))
    assert "watermark of partition 0 was 4900" in letter.message
    # Each partials partition hears partition 0's watermark.
    marks = [PartialAggregate.FromString(o.value) for o in batch.outputs if o.topic == PARTIALS]
    assert sorted(o.partition for o in batch.outputs if o.topic == PARTIALS) == [0, 1]
    assert {(m.watermark.partition, m.watermark.watermark_ms, m.watermark.partitions) for m in marks} == {(0, 4_900, 1)}


def test_partitions_keep_their_own_watermarks_and_batch_boundaries_do_not_matter() -> None:
    records = [record(0, 5_000, 0), record(1, 1_500, 1), record(2, 1_400, 0), record(3, 9_000, 1), record(4, 1_600, 1)]
    whole = run(EventTimeGate(job(Tumbling(1_000)), 100, "late", "partials", 1, 2), {0: MemoryStore(), 1: MemoryStore()}, records)
    gate, stores = EventTimeGate(job(Tumbling(1_000)), 100, "late", "partials", 1, 2), {0: MemoryStore(), 1: MemoryStore()}
    split = [run(gate, stores, [r])[0] for r in records]
    assert whole[0] == [rid for kept in split for rid in kept] == ["r0", "r1", "r3"]


def test_a_record_with_an_expired_hopping_window_is_late_in_all_of_them() -> None:
    gate = EventTimeGate(job(Hopping(1_000, 500)), 0, Topic.COMPUTE_LATE, "partials", 1, 1)
    stores = {0: MemoryStore()}
    run(gate, stores, [record(0, 2_000)])
    # 1_400 is in [500, 1500) (expired at 2000) and [1000, 2000) (not yet): late, whole.
    kept, batch = run(gate, stores, [record(1, 1_400), record(2, 2_100)])
    assert kept == ["r2"] and late_ids(batch) == ["r1"]


def test_a_record_from_the_future_is_dead_lettered_and_never_moves_event_time() -> None:
    # Issue 39: one far-future record per partition held the watermark there, persisted, and
    # every later record of every windowed job went to compute.late, across restarts.
    now = 1_800_000_000_000
    gate = EventTimeGate(job(Tumbling(1_000)), 100, Topic.COMPUTE_LATE, PARTIALS, 1, 1, max_ahead_ms=60_000)
    stores = {0: MemoryStore()}

    def taken_at(offset: int, t: int) -> Message:
        message = record(offset, t)
        envelope = Envelope.FromString(message.value())
        envelope.ingest_time_ms = now
        return Message(topic=message.topic(), partition=0, offset=offset, key=b"u", value=encode_envelope(envelope))

    kept, batch = run(gate, stores, [taken_at(0, now + 10 * 365 * 86_400_000), taken_at(1, now + 59_000)])
    assert kept == ["r1"]  # within the bound: taken
    letters = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.COMPUTE_DLQ]
    assert len(letters) == 1 and "event time from the future" in letters[0].message and "60000" in letters[0].message
    assert gate.newest(batch, 0) == now + 59_000  # the future record did not move the partition's event time
    kept, batch = run(gate, stores, [taken_at(2, now + 58_950)])
    assert kept == ["r2"] and late_ids(batch) == []
