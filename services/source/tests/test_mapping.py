"""The Kafka source's mapping, without a broker: record_id derivation (the record's place in the
world: cluster id, topic, topic id, partition, offset), what goes to source.dlq and why, and that
a mapped record is exactly what ingest would write for it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow import spout
from onceflow.codec import decode_envelope
from onceflow.spout import RECORD_ID_MAX_BYTES, Limits
from onceflow_client.kafka_identity import KafkaOrigin
from onceflow_source.mapping import (
    Mapping,
    MappingFailed,
    NoIdField,
    OverLimit,
    SourceRecord,
    Unparsable,
    default_record_id,
    map_record,
)

pytestmark = pytest.mark.source

LIMITS = Limits(max_payload_bytes=1000, max_key_bytes=100)
ORIGIN = KafkaOrigin("MkU3OEVBNTcwNTJENDM2Qk", "pN1uCbZfRYyfUvK2Hfu9Xw")
BY_OFFSET = Mapping(LIMITS, origin=ORIGIN)
BY_FIELD = Mapping(LIMITS, id_field="id", origin=ORIGIN)


def record(value: bytes | None, *, topic: str = "orders", partition: int = 0, offset: int = 0, **kw) -> SourceRecord:
    return SourceRecord(topic=topic, partition=partition, offset=offset, key=kw.pop("key", b"k"), value=value, **kw)


topics = st.from_regex(r"[a-zA-Z0-9._-]{1,60}", fullmatch=True)


@given(topics, st.integers(0, 10_000), st.integers(0, 2**62), st.binary(max_size=200))
def test_by_default_the_record_id_is_the_records_place_in_the_world(topic: str, partition: int, offset: int, value: bytes) -> None:
    mapped = map_record(record(value, topic=topic, partition=partition, offset=offset), BY_OFFSET)
    expected = f"kafka://{ORIGIN.cluster_id}/{topic}/{ORIGIN.topic_id}/{partition}/{offset}"
    assert mapped.record_id.decode() == expected == default_record_id(ORIGIN, topic, partition, offset)
    assert mapped.payload == value


@given(topics, st.integers(0, 100), st.integers(0, 2**40))
def test_a_recreated_topic_or_another_clusters_topic_of_the_same_name_is_another_topic(topic: str, partition: int, offset: int) -> None:
    """Issue 46: the recreated topic's offsets start at 0 again, and another cluster's topic of
    the same name has the same offsets: with `topic/partition/offset` their ids were equal."""
    place = record(b"v", topic=topic, partition=partition, offset=offset)
    ids = {
        map_record(place, Mapping(LIMITS, origin=origin)).record_id
        for origin in (ORIGIN, KafkaOrigin(ORIGIN.cluster_id, "Q2Ehk1ZcQ0i9Xx0nm8bTqA"),
                       KafkaOrigin("b3RoZXJjbHVzdGVyaWQxMj", ORIGIN.topic_id), KafkaOrigin(ORIGIN.cluster_id))
    }
    assert len(ids) == 4


def test_a_broker_without_topic_ids_gives_the_fallback_identity() -> None:
    fallback = map_record(record(b"v", offset=7), Mapping(LIMITS, origin=KafkaOrigin(ORIGIN.cluster_id)))
    assert fallback.record_id == f"kafka://{ORIGIN.cluster_id}/orders/-/0/7".encode()


@given(st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True), st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1))
def test_any_topic_name_fits_ingests_limit_and_stays_its_own(topic: str, partition: int, offset: int) -> None:
    mapped = map_record(record(b"v", topic=topic, partition=partition, offset=offset), BY_OFFSET)
    assert len(mapped.record_id) <= RECORD_ID_MAX_BYTES
    assert mapped.record_id.endswith(f"/{ORIGIN.topic_id}/{partition}/{offset}".encode())
    other = map_record(record(b"v", topic=topic + "x", partition=partition, offset=offset), BY_OFFSET)
    assert other.record_id != mapped.record_id


def test_the_longest_topic_name_is_compacted_with_a_hash_and_keeps_a_readable_prefix() -> None:
    topic = "t" * 249
    mapped = map_record(record(b"v", topic=topic, partition=2**31 - 1, offset=2**63 - 1), BY_OFFSET).record_id.decode()
    assert len(f"kafka://{ORIGIN.cluster_id}/{topic}/{ORIGIN.topic_id}/{2**31 - 1}/{2**63 - 1}") > RECORD_ID_MAX_BYTES
    name = mapped.split("/")[3]
    assert name.startswith("t" * 40 + "~") and len(name) == 40 + 1 + 24 and len(mapped) <= RECORD_ID_MAX_BYTES
    # Two long names that share their first 40 characters stay two topics.
    assert map_record(record(b"v", topic="t" * 248 + "u"), BY_OFFSET).record_id != map_record(record(b"v", topic=topic), BY_OFFSET).record_id


@given(st.binary(max_size=100), st.integers(0, 1000), st.integers(0, 1000))
def test_the_same_payload_at_two_offsets_is_two_records(value: bytes, first: int, gap: int) -> None:
    one = map_record(record(value, offset=first), BY_OFFSET)
    two = map_record(record(value, offset=first + gap + 1), BY_OFFSET)
    assert one.record_id != two.record_id and one.payload == two.payload


# NUL is reserved in record ids (onceflow.streams), and a lone surrogate is no UTF-8: such ids
# are dead letters, tested below.
@given(
    st.one_of(
        st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=100),
        st.integers(-(2**63), 2**63),
    ),
    st.integers(0, 1000),
)
def test_with_an_id_field_the_record_id_is_that_field_wherever_the_record_sits(value: str | int, offset: int) -> None:
    body = json.dumps({"id": value, "amount": 3}).encode()
    mapped = map_record(record(body, offset=offset), BY_FIELD)
    assert mapped.record_id.decode() == str(value)


def test_an_id_field_that_is_no_utf8_is_a_dead_letter_not_a_crash() -> None:
    body = json.dumps({"id": "\ud800", "amount": 3}).encode()  # JSON may escape a lone surrogate
    with pytest.raises(MappingFailed, match="UnicodeEncodeError"):
        map_record(record(body, offset=1), BY_FIELD)


def test_an_id_field_holding_nul_is_refused() -> None:
    with pytest.raises(OverLimit, match="NUL byte"):
        map_record(record(json.dumps({"id": "a\x00b"}).encode()), BY_FIELD)


def test_a_dotted_id_field_reaches_into_nested_objects() -> None:
    body = json.dumps({"meta": {"event": {"id": "e-7"}}}).encode()
    assert map_record(record(body), Mapping(LIMITS, "meta.event.id")).record_id == b"e-7"


@pytest.mark.parametrize(
    ("value", "reason", "says"),
    [
        (b"not json", Unparsable, "not JSON"),
        (b"\xff\xfe", Unparsable, "not JSON"),
        (None, Unparsable, "empty"),
        (b"[1, 2]", Unparsable, "list, not a JSON object"),
        (b'{"user": "u1"}', NoIdField, "no id field 'id'"),
        (b'{"id": null}', NoIdField, "not a string or an integer"),
        (b'{"id": true}', NoIdField, "not a string or an integer"),
        (b'{"id": {"a": 1}}', NoIdField, "not a string or an integer"),
        (b'{"id": ""}', NoIdField, "empty"),
        (json.dumps({"id": "x" * (RECORD_ID_MAX_BYTES + 1)}).encode(), OverLimit, "record_id"),
    ],
)
def test_a_record_without_a_usable_id_is_refused_with_its_reason(value: bytes | None, reason: type, says: str) -> None:
    with pytest.raises(reason, match=".*") as refused:
        map_record(record(value), BY_FIELD)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"value": b"v" * 1001}, "payload: 1001 bytes, the limit is 1000"),
        ({"value": b"v", "key": b"k" * 101}, "key: 101 bytes, the limit is 100"),
        ({"value": b"v", "headers": [("h", b"\xff")]}, "header 'h' is not UTF-8"),
        ({"value": b"v", "headers": [(f"h{i}", b"x") for i in range(33)]}, "headers: 33 headers"),
    ],
)
def test_a_record_over_ingests_limits_is_refused_with_its_reason(kwargs: dict, says: str) -> None:
    value = kwargs.pop("value")
    with pytest.raises(OverLimit) as refused:
        map_record(record(value, **kwargs), BY_OFFSET)
    assert says in str(refused.value)


@given(st.binary(max_size=300) | st.none(), st.binary(max_size=50) | st.none(),
       st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20) | st.none()), max_size=40),
       st.text(max_size=6))
def test_mapping_either_maps_or_names_a_reason_and_never_crashes(value, key, headers, id_field) -> None:  # type: ignore[no-untyped-def]
    try:
        mapped = map_record(record(value, key=key, headers=headers), Mapping(LIMITS, id_field))
    except (Unparsable, NoIdField, OverLimit) as exc:
        assert str(exc)
    else:
        assert spout.check_record(0, mapped, LIMITS) is None


def test_a_mapped_record_becomes_the_envelope_ingest_would_write() -> None:
    mapped = map_record(record(b'{"id": "a1", "n": 1}', key=b"user-1", headers=[("trace", b"t")], timestamp_ms=1234), BY_FIELD)
    new = spout.new_record(mapped, ingest_time_ms=5000)
    envelope = decode_envelope(new.envelope)
    assert new.record_id == b"a1" == envelope.record_id.encode()
    assert (envelope.key, envelope.payload, dict(envelope.headers)) == (b"user-1", b'{"id": "a1", "n": 1}', {"trace": "t"})
    assert (envelope.event_time_ms, envelope.ingest_time_ms, envelope.attempt) == (1234, 5000, 1)
    assert (envelope.root_id, envelope.edge_id) == (new.root_id, new.edge_id) and new.root_id and new.edge_id


def test_a_record_without_a_timestamp_takes_ingest_time() -> None:
    envelope = decode_envelope(spout.new_record(map_record(record(b"v"), BY_OFFSET), ingest_time_ms=77).envelope)
    assert envelope.event_time_ms == 77
