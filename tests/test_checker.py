"""The checker must be able to fail: it is fed known-bad deliveries and has to say so."""

import pytest

from onceflow.codec import encode_envelope
from onceflow.v1.envelope_pb2 import Envelope
from tests.harness.checker import DeliveryReport, TopicRecord, latest_by_key

pytestmark = pytest.mark.foundation


def _records(*record_ids: str) -> list[TopicRecord]:
    return [TopicRecord(0, i, None, encode_envelope(Envelope(record_id=r)), ()) for i, r in enumerate(record_ids)]


def test_exactly_once_passes_only_when_each_id_appears_once():
    DeliveryReport.of(_records("a", "b"), ["a", "b"]).assert_exactly_once()
    for delivered in (("a",), ("a", "b", "b"), ("a", "b", "c")):
        with pytest.raises(AssertionError):
            DeliveryReport.of(_records(*delivered), ["a", "b"]).assert_exactly_once()


def test_at_least_once_tolerates_only_explained_duplicates():
    DeliveryReport.of(_records("a", "a", "b"), ["a", "b"], allowed_duplicates={"a"}).assert_at_least_once()
    with pytest.raises(AssertionError):
        DeliveryReport.of(_records("a", "b", "b"), ["a", "b"], allowed_duplicates={"a"}).assert_at_least_once()
    with pytest.raises(AssertionError):
        DeliveryReport.of(_records("a"), ["a", "b"], allowed_duplicates={"b"}).assert_at_least_once()


def test_changelog_table_applies_tombstones_in_offset_order():
    records = [
        TopicRecord(0, 2, b"k", None, ()),
        TopicRecord(0, 1, b"k", b"1", ()),
        TopicRecord(1, 5, b"k", b"7", ()),
    ]
    assert latest_by_key(records) == {(1, b"k"): b"7"}
