"""Dead-letter warnings roll up: the first letter of each reason per interval is logged whole,
the rest only counted, and the counts logged once the interval ends (issue 45)."""

from __future__ import annotations

import logging

import pytest

from onceflow.txn.letter_log import LetterLog, reason_of


def test_a_thousand_letters_of_one_reason_are_one_line_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    letters = LetterLog(interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="onceflow.txn.batch"):
        for i in range(1000):
            letters.note("compute", "Rejected", f"a required field is missing: `user` (string) is null #{i}", f"t[0]@{i}")
        letters.note("compute", "Rejected", "field `amount`: expected int64, got a string \"ten\"", "t[1]@0")
        assert len(caplog.records) == 2  # one per reason
        now[0] = 61.0
        letters.flush_if_due()
    summary = caplog.records[-1].getMessage()
    assert "1001 dead letters in the last 61 s" in summary
    assert "compute: Rejected: a required field is missing x1,000" in summary
    assert "field `amount` x1" in summary
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onceflow.txn.batch"):
        letters.note("compute", "Rejected", "a required field is missing: again", "t[0]@1001")
        assert len(caplog.records) == 1  # a new interval logs its first letter again
        now[0] = 130.0
        letters.flush_if_due()
        assert len(caplog.records) == 1  # nothing counted beyond what was logged: no summary


def test_reasons_group_by_the_message_head() -> None:
    assert reason_of("dedup", "ValueError", "not an envelope: bad bytes") == "dedup: ValueError: not an envelope"
    assert reason_of("s", "E", "no colon here") == "s: E: no colon here"
