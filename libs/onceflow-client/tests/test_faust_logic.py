"""The Faust bridge's pure logic: record ids from positions, the raw mapping, and a batch with a
bad event (one the mapping refuses, one ingest refuses) sent without it, the bad ones reported."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.v1.ingest_pb2 import IngestRecord, IngestReply
from onceflow_client.faust import raw_record, record_id, send_events
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


@given(st.text(min_size=1, max_size=40), st.integers(0, 1000), st.integers(0, 2**62))
def test_a_record_id_is_the_position_and_the_same_on_every_read(topic: str, partition: int, offset: int) -> None:
    first, again = event(offset, topic=topic, partition=partition), event(offset, topic=topic, partition=partition)
    assert record_id(first) == record_id(again) == f"{topic}/{partition}/{offset}"


def test_the_raw_mapping_keeps_key_and_value_as_they_are() -> None:
    record = raw_record(event(7, key=None, value="text"))
    assert (record.record_id, record.key, record.payload) == (b"orders/2/7", b"", b"text")
    with pytest.raises(TypeError, match="to_record"):
        raw_record(event(8, value={"a": 1}))


def test_bad_events_are_reported_and_the_rest_sent() -> None:
    ingest = RefusingIngest()
    rejected: list[tuple[str, str]] = []
    batch = [event(0), event(1, key=b"bad"), event(2, value=3.5), event(3)]
    accepted = asyncio.run(send_events(batch, ingest, on_rejected=lambda e, r: rejected.append((record_id(e), r.field))))  # type: ignore[arg-type]
    assert accepted == 2
    assert sorted(rejected) == [("orders/2/1", "key"), ("orders/2/2", "to_record")]
    assert [r.record_id for r in ingest.calls[-1]] == [b"orders/2/0", b"orders/2/3"]
