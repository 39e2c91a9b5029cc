"""The Faust bridge's pure logic: record ids from places (cluster id, topic, topic id, partition,
offset), the raw mapping, and a batch with a bad event (one the mapping refuses, one ingest
refuses) sent without it, the bad ones reported."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.v1.ingest_pb2 import IngestRecord, IngestReply
from onceflow_client.faust import Origin, raw_record, record_id, send_events
from onceflow_client.ingest import RecordsRejected, Rejection


def event(offset: int, key: Any = b"u1", value: Any = b'{"user":"u1","amount":1}', topic: str = "orders", partition: int = 2) -> Any:
    return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition, offset=offset), key=key, value=value)


class RefusingIngest:
    """Refuses records whose key is b"bad", as ingest does: the whole call, naming each."""

    def __init__(self) -> None:
        self.calls: list[list[IngestRecord]] = []

    async def ingest(self, records: list[IngestRecord], wait: str = "committed") -> IngestReply:
        self.calls.append(list(records))
        bad = [Rejection(i, "key", "too long", r.record_id) for i, r in enumerate(records) if r.key == b"bad"]
        if bad:
            raise RecordsRejected(bad)
        return IngestReply(accepted=len(records))


ORIGIN = Origin("cluster-a", {"orders": "topic-a"})


@given(st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True), st.integers(0, 1000), st.integers(0, 2**62))
def test_a_record_id_is_the_place_and_the_same_on_every_read(topic: str, partition: int, offset: int) -> None:
    first, again = event(offset, topic=topic, partition=partition), event(offset, topic=topic, partition=partition)
    origin = Origin("cluster-a", {topic: "topic-a"})
    assert record_id(first, origin) == record_id(again, origin) == f"kafka://cluster-a/{topic}/topic-a/{partition}/{offset}"


def test_a_recreated_topic_or_another_clusters_topic_is_another_topic_and_unknown_parts_are_dashes() -> None:
    place = event(7)
    assert len({record_id(place, ORIGIN), record_id(place, Origin("cluster-a", {"orders": "topic-b"})),
                record_id(place, Origin("cluster-b", {"orders": "topic-a"})), record_id(place)}) == 4
    assert record_id(place) == "kafka://-/orders/-/2/7"
    assert record_id(place, Origin("cluster-a")) == "kafka://cluster-a/orders/-/2/7"


def test_the_longest_topic_name_fits_ingests_limit() -> None:
    topic = "o" * 249
    assert len(record_id(event(2**63 - 1, topic=topic, partition=2**31 - 1), Origin("cluster-a", {topic: "topic-a"}))) <= 256


def test_the_raw_mapping_keeps_key_and_value_as_they_are() -> None:
    record = raw_record(event(7, key=None, value="text"), ORIGIN)
    assert (record.record_id, record.key, record.payload) == (b"kafka://cluster-a/orders/topic-a/2/7", b"", b"text")
    with pytest.raises(TypeError, match="to_record"):
        raw_record(event(8, value={"a": 1}))


def test_bad_events_are_reported_and_the_rest_sent() -> None:
    ingest = RefusingIngest()
    rejected: list[tuple[str, str]] = []
    batch = [event(0), event(1, key=b"bad"), event(2, value=3.5), event(3)]
    accepted = asyncio.run(send_events(batch, ingest, on_rejected=lambda e, r: rejected.append((r.record_id.decode(), r.field)),  # type: ignore[arg-type]
                                       origin=ORIGIN))
    assert accepted == 2
    place = "kafka://cluster-a/orders/topic-a/2/"
    assert sorted(rejected) == [(f"{place}1", "key"), (f"{place}2", "to_record")]
    assert [r.record_id for r in ingest.calls[-1]] == [f"{place}0".encode(), f"{place}3".encode()]


def test_a_record_id_of_the_callers_own_mapping_is_sent_as_it_is() -> None:
    ingest = RefusingIngest()
    asyncio.run(send_events([event(0)], ingest, to_record=lambda e: {"record_id": "mine-1", "payload": b"x"}, origin=ORIGIN))  # type: ignore[arg-type]
    assert [r.record_id for r in ingest.calls[-1]] == [b"mine-1"]
