"""Named streams' pure rules (docs/decisions/0025): names, topics, the gate's identity, and the
directory's cache."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow import streams
from onceflow.spout import Limits, check_record
from onceflow.v1.ingest_pb2 import IngestRecord

LIMITS = Limits(max_payload_bytes=1024, max_key_bytes=64)
NAMES = st.from_regex(streams.STREAM_NAME, fullmatch=True)


def test_the_default_stream_is_dedup_records_however_it_is_written() -> None:
    assert streams.topic_of("") == streams.topic_of("default") == "dedup.records"
    assert streams.topic_of("orders") == "dedup.records.orders"
    assert streams.stream_of_topic("dedup.records") == "default"
    assert streams.stream_of_topic("dedup.records.orders") == "orders"
    for other in ("dedup.changelog", "dedup.records.", "dedup.records.a.b", "ingest.records"):
        assert streams.stream_of_topic(other) is None
    assert streams.identity("", "17") == streams.identity("default", "17") == "17"


@given(NAMES)
def test_a_name_round_trips_through_its_topic(name: str) -> None:
    assert streams.stream_of_topic(streams.topic_of(name)) == streams.display(name)


@given(st.tuples(NAMES | st.just(""), st.text(min_size=1)), st.tuples(NAMES | st.just(""), st.text(min_size=1)))
def test_identities_of_two_records_differ_unless_stream_and_id_do(a: tuple[str, str], b: tuple[str, str]) -> None:
    """Order 17 and payment 17 are two records; no default-stream id stands for a named stream's
    (ingest refuses NUL in a record_id, so such ids never reach the gate)."""
    if "\x00" in a[1] or "\x00" in b[1]:
        return
    same = streams.canonical(a[0]) == streams.canonical(b[0]) and a[1] == b[1]
    assert (streams.identity(*a) == streams.identity(*b)) == same
    assert streams.split_identity(streams.identity(*a)) == (streams.display(a[0]), a[1])


def test_names_that_cannot_name_a_topic_are_refused() -> None:
    for bad in ("a.b", "a b", "x" * 101, "é"):
        with pytest.raises(ValueError, match="1 to 100 of"):
            streams.check_stream_name(bad)


def test_ingest_refuses_a_bad_or_missing_stream_and_a_nul_in_a_record_id() -> None:
    exists = {"", "orders"}.__contains__
    record = IngestRecord(record_id=b"a", stream=b"orders")
    assert check_record(0, record, LIMITS, stream_exists=exists) is None
    assert check_record(0, IngestRecord(record_id=b"a", stream=b"default"), LIMITS, stream_exists=lambda s: streams.canonical(s) == "") is None
    missing = check_record(3, IngestRecord(record_id=b"a", stream=b"ordres"), LIMITS, stream_exists=exists)
    assert missing is not None and missing.field == "records[3].stream"
    assert "no stream 'ordres'" in missing.message and "onceflow stream create ordres" in missing.message
    bad = check_record(0, IngestRecord(record_id=b"a", stream=b"a.b"), LIMITS, stream_exists=exists)
    assert bad is not None and bad.field == "records[0].stream"
    nul = check_record(0, IngestRecord(record_id=b"a\x00b"), LIMITS)
    assert nul is not None and nul.field == "records[0].record_id" and "NUL" in nul.message


def test_the_directory_answers_from_its_cache_and_looks_again_for_the_missing() -> None:
    calls: list[int] = []
    topics = {"p.dedup.records", "p.dedup.records.orders", "q.dedup.records.other", "p.ingest.records"}

    def listing() -> set[str]:
        calls.append(1)
        return set(topics)

    directory = streams.StreamDirectory(listing, "p.", refresh_s=0.0)
    assert directory.exists("orders") and directory.exists("") and directory.exists("default")
    assert not directory.exists("other")  # another prefix's
    looked = len(calls)
    assert directory.exists("orders") and len(calls) == looked  # known: no lookup
    topics.add("p.dedup.records.payments")
    assert directory.exists("payments")  # created since: found on the next lookup
    slow = streams.StreamDirectory(listing, "p.", refresh_s=3600.0)
    assert not slow.exists("nope") and not slow.exists("nope2")
    assert len(calls) == looked + 2  # one lookup for both misses within refresh_s


def test_a_failing_lookup_is_unknown_never_absent_and_a_deleted_stream_is_noticed() -> None:
    answers: list[set[str] | Exception] = [{"dedup.records.orders"}, RuntimeError("broker down"), set()]

    def listing() -> set[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    directory = streams.StreamDirectory(listing, "", refresh_s=0.0, ttl_s=0.0)
    assert directory.exists("orders")
    with pytest.raises(streams.StreamLookupFailed, match="broker down"):
        directory.exists("orders")  # stale and unanswered: neither present nor absent
    assert not directory.exists("orders")  # listed again: deleted since
    assert directory.exists("") and directory.exists("default")  # the default stream, without a listing
