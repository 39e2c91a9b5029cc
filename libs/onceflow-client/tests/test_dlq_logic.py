"""The dead-letter reader's pure parts: decoding a letter's original by the stage that wrote it,
the job and record id it names, and the filter. Letters are built by hand, as each stage writes
them. Against a broker: tests/test_dlq.py."""

from __future__ import annotations

import json

from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow.v1.results_pb2 import ResultChange
from onceflow_client.dlq import Letter, LetterFilter, reason_counts


def envelope(record_id: str, payload: bytes = b'{"amount":"12"}') -> bytes:
    return Envelope(record_id=record_id, root_id=7, attempt=1, key=b"u1", payload=payload).SerializeToString()


def letter(topic: str, offset: int, **fields: object) -> Letter:
    return Letter.of(topic, 0, offset, DeadLetter(**fields).SerializeToString())  # type: ignore[arg-type]


MAP = letter(
    "compute.dlq", 0, stage="compute", error_class="Rejected", message="job orders failed on this record: bad amount",
    original=envelope("o-1"), source_topic="p.dedup.records", failed_at_ms=1_700_000_000_000,
)
SCHEMA = letter("compute.dlq", 1, stage="compute", error_class="Rejected", message="a required field is missing",
                original=envelope("o-2"), source_topic="p.dedup.records")
MERGE = letter(
    "compute.dlq", 2, stage="compute-merge", error_class="ZeroDivisionError", message="division by zero",
    original=PartialAggregate(job="totals", key="u1", partials=b"[1,0]").SerializeToString(),
    source_topic="p.compute.partials.totals",
)
LATE = letter("compute.late", 0, stage="compute", error_class="Rejected",
              message="late: job q8: event time 5 is in a window ending at 10", original=envelope("o-3"))
SINK = letter("sink.dlq", 0, stage="sink", error_class="InvalidResultChange", message="no value",
              original=ResultChange(job="orders", key="u1", op=ResultChange.UPSERT).SerializeToString())
SOURCE = letter("source.dlq", 0, stage="source", error_class="Rejected", message="no id field `order_id`",
                original=b'{"amount": 5}')
GATE = letter("dedup.dlq", 0, stage="dedup", error_class="DecodeError", message="not an Envelope", original=b"\xff\xfe")
ALL = [MAP, SCHEMA, MERGE, LATE, SINK, SOURCE, GATE]


def test_the_original_is_decoded_by_the_stage_that_wrote_it() -> None:
    assert MAP.record_id == "o-1" and MAP.original_dict()["payload"] == '{"amount":"12"}'
    assert MAP.original_dict()["type"] == "Envelope" and MAP.original_dict()["key"] == "u1"
    assert isinstance(MERGE.original, PartialAggregate) and MERGE.record_id is None
    assert MERGE.original_dict() == {"type": "PartialAggregate", "job": "totals", "key": "u1", "partials": "[1,0]"}
    assert isinstance(SINK.original, ResultChange) and SINK.original_dict()["job"] == "orders"
    # A source letter's original is the user's own value: shown as it is, never parsed as ours.
    assert SOURCE.original is None and SOURCE.original_dict() == {"type": "raw", "value": '{"amount": 5}'}
    # Bytes that are no envelope (the reason for the letter) are shown raw, in hex when not text.
    assert GATE.original is None and GATE.original_dict() == {"type": "raw", "value": "fffe"}


def test_the_job_is_read_from_the_partial_the_change_the_topic_or_the_reason() -> None:
    assert [one.job for one in ALL] == ["orders", None, "totals", "q8", "orders", None, None]


def test_a_letter_is_json_whole() -> None:
    document = json.loads(json.dumps(MAP.to_dict()))
    assert document["topic"] == "compute.dlq" and document["record_id"] == "o-1" and document["job"] == "orders"
    assert document["source"] == {"topic": "p.dedup.records", "partition": 0, "offset": 0}
    assert document["failed_at_ms"] == 1_700_000_000_000


def test_the_filter() -> None:
    def kept(keep: LetterFilter) -> list[Letter]:
        return [one for one in ALL if keep(one)]

    assert kept(LetterFilter()) == ALL
    assert kept(LetterFilter(stage="compute")) == [MAP, SCHEMA, LATE]
    assert kept(LetterFilter(job="orders")) == [MAP, SINK]
    assert kept(LetterFilter(record_id="o-2")) == [SCHEMA]
    assert kept(LetterFilter(reason="decodeerror")) == [GATE]  # the error class, any case
    assert kept(LetterFilter(reason="REQUIRED FIELD")) == [SCHEMA]  # or the message
    assert kept(LetterFilter(stage="compute", reason="late")) == [LATE]
    assert kept(LetterFilter(job="nobody")) == []


def test_the_filter_by_stream_keeps_letters_that_hold_a_record_of_it() -> None:
    """issue 45: `onceflow dlq list --stream payments`; the default stream however it is named."""
    paid = letter("compute.dlq", 9, stage="compute", error_class="Rejected", message="bad cents",
                  original=Envelope(record_id="p-1", root_id=8, attempt=1, stream="payments").SerializeToString())
    every = [*ALL, paid]
    assert [one for one in every if LetterFilter(stream="payments")(one)] == [paid]
    assert [one for one in every if LetterFilter(stream="default")(one)] == [MAP, SCHEMA, LATE]
    assert [one for one in every if LetterFilter(stream="")(one)] == [MAP, SCHEMA, LATE]  # no record, no stream
    assert paid.stream == "payments" and MAP.stream == "" and MERGE.stream is None


def test_counts_per_reason() -> None:
    assert reason_counts(ALL).most_common(1) == [("compute: Rejected", 3)]
    assert reason_counts(ALL)["source: Rejected"] == 1
