"""The Kafka source's stage on onceflow.testing.StageDriver, no broker: each record of the user's
topic lands in ingest.records as ingest writes it, its INIT naming where it landed, in the
transaction that commits the topic's offsets; an aborted copy leaves nothing, and the records
read again carry the same record ids (their place), so a copy that did land would be dropped at
the gate; unmappable records are consumed as dead letters with their reason."""

from __future__ import annotations

import json

import pytest

from onceflow import topology
from onceflow.codec import decode_envelope
from onceflow.spout import Limits
from onceflow.state.store import KeyValueStore
from onceflow.testing import Record, StageDriver
from onceflow.topology import Topic
from onceflow.trees import InFlightTrees
from onceflow.v1.acker_pb2 import AckerMessage
from onceflow_client.kafka_identity import KafkaOrigin

from onceflow_source.mapping import Mapping
from onceflow_source.stage import SourceStage

pytestmark = pytest.mark.source

RECORDS = Topic.INGEST_RECORDS.value
ORDERS = "orders"


def source(tree_timeout_ms: int | None = 30_000, **mapping: str) -> tuple[SourceStage, StageDriver[KeyValueStore]]:
    stage = SourceStage(
        Mapping(Limits(1000, 100), origin=KafkaOrigin("cluster-a", "tid"), **mapping), RECORDS, tree_timeout_ms,
        InFlightTrees(max_attempts=1),
    )
    return stage, StageDriver.for_hop(topology.SOURCE, stage, input_topic=ORDERS, partitions=(1,))


def order(value: bytes, key: bytes = b"k") -> Record:
    return Record(value, key, partition=1, timestamp_ms=5_000, headers=[("trace", b"t-1")])


def test_each_record_lands_as_a_new_root_with_an_init_naming_where_it_landed() -> None:
    stage, driver = source()
    done = driver.process([order(b'{"n": 1}', b"k1"), order(b'{"n": 2}', b"k2")])
    copies = done.topic(RECORDS)
    envelopes = [decode_envelope(r.value) for r in copies]
    assert [r.key for r in copies] == [b"kafka://cluster-a/orders/tid/1/0", b"kafka://cluster-a/orders/tid/1/1"]
    assert [(e.key, e.payload, e.attempt, e.event_time_ms) for e in envelopes] == [
        (b"k1", b'{"n": 1}', 1, 5_000), (b"k2", b'{"n": 2}', 1, 5_000),
    ]
    assert dict(envelopes[0].headers) == {"trace": "t-1"}
    inits = {m.root_id: m for m in done.acks}
    for copy, envelope in zip(copies, envelopes, strict=True):
        started = inits[envelope.root_id]
        assert (started.kind, started.xor_value, started.attempt, started.timeout_ms) == (AckerMessage.INIT, envelope.edge_id, 1, 30_000)
        assert (started.origin.record_id, started.origin.topic, started.origin.offset) == (envelope.record_id, RECORDS, copy.offset)
    assert done.offsets == {(ORDERS, 1): 2}  # the user's topic's offsets commit with the copies
    assert (stage.counts.copied, len(stage.trees or ())) == (2, 2)


def test_an_aborted_copy_leaves_nothing_and_the_records_come_again_with_the_same_ids() -> None:
    stage, driver = source()
    aborted = driver.process([order(b"a"), order(b"b")], abort=True)
    assert driver.topic(RECORDS) == [] and driver.committed_offsets == {}
    assert (stage.counts.copied, len(stage.trees or ())) == (0, 0)  # no tree counts against the cap
    again = driver.process(aborted.records)
    ids = [[decode_envelope(r.value).record_id for r in tx.topic(RECORDS)] for tx in (aborted, again)]
    assert ids[0] == ids[1] == ["kafka://cluster-a/orders/tid/1/0", "kafka://cluster-a/orders/tid/1/1"]
    assert stage.counts.copied == 2 and driver.committed_offsets == {(ORDERS, 1): 2}


def test_unmappable_records_are_consumed_as_dead_letters_with_their_reason() -> None:
    stage, driver = source(tree_timeout_ms=None, id_field="id")
    values = [json.dumps({"id": "a"}).encode(), json.dumps({"id": ""}).encode(), b"oops", json.dumps({"id": "a"}).encode()]
    done = driver.process([order(value) for value in values])
    assert [(d.error_class, d.source_topic, d.source_offset) for d in done.dead_letters()] == [
        ("NoIdField", ORDERS, 1), ("Unparsable", ORDERS, 2),
    ]
    assert [r.key for r in done.topic(RECORDS)] == [b"a", b"a"]  # copies of one record: the gate keeps the first
    assert done.acks == [] and done.offsets == {(ORDERS, 1): 4}  # acking off: no INIT
    assert (stage.counts.copied, stage.counts.dead_lettered) == (2, 2)
