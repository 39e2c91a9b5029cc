"""The boundary checks every spout shares (ingest, the Kafka source): `onceflow.spout`, without a broker."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow.codec import decode_envelope
from onceflow.spout import Limits, check_record, envelope_bytes

pytestmark = [pytest.mark.foundation, pytest.mark.security]

LIMITS = Limits(max_payload_bytes=100, max_key_bytes=10)


@pytest.mark.parametrize(
    ("record", "field", "message"),
    [
        (IngestRecord(), "records[4].record_id", "required"),
        (IngestRecord(record_id=b"x" * 257), "records[4].record_id", "257 bytes, the limit is 256"),
        (IngestRecord(record_id=b"ok\xff"), "records[4].record_id", "not valid UTF-8"),
        (IngestRecord(record_id=b"a", payload=b"p" * 101), "records[4].payload", "101 bytes, the limit is 100"),
        (IngestRecord(record_id=b"a", key=b"k" * 11), "records[4].key", "11 bytes"),
        (IngestRecord(record_id=b"a", event_time_ms=-1), "records[4].event_time_ms", "negative"),
        (IngestRecord(record_id=b"a", headers={f"h{i}": "" for i in range(33)}), "records[4].headers", "33 headers, the limit is 32"),
        (IngestRecord(record_id=b"a", headers={"n" * 257: ""}), "records[4].headers", "a name of 257 bytes"),
        (IngestRecord(record_id=b"a", headers={"trace": "v" * (16 * 1024 + 1)}), "records[4].headers['trace']", "16385 bytes"),
        (IngestRecord(record_id=b"a", payload=b"p" * 90, headers={f"h{i}": "v" * 16_384 for i in range(32)}), "records[4]", "bytes in all, the limit is 524288"),
    ],
)
def test_invalid_records_name_field_and_index(record, field, message):
    invalid = check_record(4, record, LIMITS)
    assert invalid is not None
    assert invalid.field == field
    assert message in invalid.message


def test_event_time_is_bounded_ahead_of_the_taking_clock_only():
    limits = Limits(max_payload_bytes=100, max_key_bytes=10, max_event_time_ahead_ms=1_000)
    ahead = check_record(2, IngestRecord(record_id=b"a", event_time_ms=10_001), limits, now_ms=9_000)
    assert ahead is not None and ahead.field == "records[2].event_time_ms" and "1001 ms ahead" in ahead.message
    assert check_record(2, IngestRecord(record_id=b"a", event_time_ms=10_000), limits, now_ms=9_000) is None
    assert check_record(2, IngestRecord(record_id=b"a", event_time_ms=1), limits, now_ms=9_000) is None  # the past: late, not invalid
    assert check_record(2, IngestRecord(record_id=b"a", event_time_ms=10_001), limits) is None  # no clock given: not checked


def test_limits_are_inclusive():
    assert check_record(0, IngestRecord(record_id="é".encode() * 128, payload=b"p" * 100, key=b"k" * 10), LIMITS) is None


@given(
    record_id=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1).filter(lambda s: len(s.encode()) <= 256),
    payload=st.binary(max_size=100),
    key=st.binary(max_size=10),
    event_time_ms=st.integers(min_value=0, max_value=2**62),
    headers=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    stream=st.sampled_from(["", "default", "orders"]),
)
def test_record_bytes_plus_added_fields_parse_as_the_envelope(record_id, payload, key, event_time_ms, headers, stream):
    record = IngestRecord(
        record_id=record_id.encode(), payload=payload, key=key, event_time_ms=event_time_ms, headers=headers, stream=stream.encode()
    )
    assert check_record(0, record, LIMITS) is None
    envelope = decode_envelope(envelope_bytes(record, ingest_time_ms=1234, root_id=5, edge_id=6, attempt=2))
    assert (envelope.record_id, envelope.key, envelope.payload, dict(envelope.headers)) == (record_id, key, payload, headers)
    assert envelope.stream == stream
    assert envelope.attempt == 2
    assert envelope.ingest_time_ms == 1234
    assert envelope.event_time_ms == (event_time_ms or 1234)
    assert (envelope.root_id, envelope.edge_id) == (5, 6)


def test_a_refusals_metric_label_is_the_fields_name_whatever_header_a_caller_makes_up() -> None:
    """Issue 39: header names became Prometheus label values, so a caller could grow them without bound."""
    limits = Limits(max_payload_bytes=100, max_key_bytes=10, max_header_value_bytes=4)
    labels = set()
    for name in ("a.b", "x']y", "zz" * 50, "ç.d"):
        invalid = check_record(3, IngestRecord(record_id=b"a", headers={name: "toolong"}), limits, field_prefix="stream")
        assert invalid is not None and name in invalid.field
        labels.add(invalid.kind)
    assert labels == {"headers"}
    assert check_record(0, IngestRecord(), limits).kind == "record_id"  # type: ignore[union-attr]
    assert check_record(0, IngestRecord(record_id=b"a", payload=b"p" * 20), Limits(10, 10, max_record_bytes=12)).kind in ("payload", "record")  # type: ignore[union-attr]
