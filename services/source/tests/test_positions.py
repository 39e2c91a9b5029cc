"""Where the source resumes a partition (no broker): a recreated topic from its start, a
position lost to retention from the log's start with the loss said, a position past the log's
end refused, and a position stored before topic ids taken as the current topic's."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import OFFSET_BEGINNING
from hypothesis import given
from hypothesis import strategies as st

from onceflow_source.positions import PositionRefused, position_metadata, resume_at, stored_topic_id

pytestmark = pytest.mark.source
OLD, NEW = "pN1uCbZfRYyfUvK2Hfu9Xw", "Q2Ehk1ZcQ0i9Xx0nm8bTqA"


def test_the_metadata_round_trips_and_says_when_it_knows_nothing() -> None:
    assert stored_topic_id(position_metadata(OLD)) == OLD
    assert stored_topic_id(position_metadata("")) == ""  # stored while the broker had no topic ids
    assert stored_topic_id("") is None and stored_topic_id(None) is None and stored_topic_id("someone else's") is None


def test_nothing_stored_starts_at_the_beginning_silently() -> None:
    assert resume_at("orders", 0, -1001, None, NEW, 0, 10).offset == OFFSET_BEGINNING


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_recreated_topic_is_copied_from_its_start_with_a_warning(stored: int, low: int, length: int) -> None:
    resume = resume_at("orders", 1, stored, position_metadata(OLD), NEW, low, low + length)
    assert resume.offset == OFFSET_BEGINNING and resume.level == logging.WARNING
    assert resume.note.startswith(f"topic orders was recreated (id {OLD} -> {NEW}): copying it from its start under its new identity")


@given(st.integers(0, 1000), st.integers(0, 1000), st.sampled_from([None, "", position_metadata(""), position_metadata(NEW)]))
def test_a_position_of_this_topic_or_of_no_known_topic_resumes_where_it_is(low: int, ahead: int, metadata: str | None) -> None:
    """Stored before the upgrade (no metadata), or while the broker had no topic ids: taken as
    the current topic's, so an upgraded source goes on where it was."""
    high = low + ahead
    for stored in (low, high, (low + high) // 2):
        resume = resume_at("orders", 0, stored, metadata, NEW, low, high)
        assert (resume.offset, resume.note) == (stored, "")


def test_a_broker_without_topic_ids_cannot_compare_and_resumes_where_it_is() -> None:
    assert resume_at("orders", 0, 5, position_metadata(OLD), "", 0, 10).offset == 5


@given(st.integers(0, 1000), st.integers(1, 1000), st.integers(0, 1000))
def test_a_position_lost_to_retention_resumes_at_the_logs_start_and_says_how_many_were_lost(stored: int, gap: int, length: int) -> None:
    low = stored + gap
    resume = resume_at("orders", 2, stored, position_metadata(NEW), NEW, low, low + length)
    assert resume.offset == low and resume.level == logging.ERROR
    assert f"{gap} records were deleted (retention) before the source copied them and are lost" in resume.note


@given(st.integers(0, 1000), st.integers(1, 1000))
def test_a_position_past_the_logs_end_is_refused_never_reset(high: int, beyond: int) -> None:
    with pytest.raises(PositionRefused, match=f"stored position {high + beyond} is past the log's end {high}"):
        resume_at("orders", 0, high + beyond, position_metadata(NEW), NEW, 0, high)
