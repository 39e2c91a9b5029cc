"""What `onceflow dlq redrive` makes of letters (pure: docs/decisions/0026)."""

from __future__ import annotations

from onceflow import streams
from onceflow.spout import Limits, check_record
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.dlq import Letter
from onceflow_tools import redrive


def letter(
    topic: str, original: bytes, job: str = "", stage: str = "compute", message: str = "field `amount`: expected int64",
    error_class: str = "Rejected", offset: int = 0,
) -> Letter:
    value = DeadLetter(stage=stage, error_class=error_class, message=message, original=original, job=job)
    return Letter.of(topic, 0, offset, value.SerializeToString())


GONE = "no stream 'orders' (no topic dedup.records.orders): an operator creates it with `onceflow stream create orders`: record 'a'"


def envelope(record_id: str, count: int = 0, stream: str = "", producer: str = "") -> bytes:
    return Envelope(
        record_id=record_id, key=b"u1", payload=b'{"amount":"ten"}', event_time_ms=5, stream=stream, redrive_count=count,
        redrive_job="usersum" if count else "", producer=producer,
    ).SerializeToString()


def test_a_compute_letter_goes_back_to_its_job_one_count_higher_with_its_fix() -> None:
    plan = redrive.plan(
        [letter("compute.dlq", envelope("a"), job="usersum"), letter("compute.dlq", envelope("b", count=2, stream="pay"), job="usersum")],
        {"a": b'{"amount":10}'},
    )
    first, second = plan.records
    assert (first.record_id, first.redrive_job, first.redrive_count, first.payload) == (b"a", "usersum", 1, b'{"amount":10}')
    assert (second.redrive_count, second.stream, second.payload) == (3, b"pay", b'{"amount":"ten"}')
    assert (first.key, first.event_time_ms) == (b"u1", 5)
    assert plan.fixed == 1 and plan.targets == {"usersum": 2}
    # Each count is a record of its own to the gate; the same letter again is the same record.
    keys = {streams.identity(r.stream.decode(), r.record_id.decode(), r.redrive_job, r.redrive_count) for r in plan.records}
    assert len(keys) == 2 and streams.identity("", "a") not in keys


def test_a_gate_letter_goes_back_under_its_own_identity() -> None:
    [record] = redrive.plan([letter("dedup.dlq", envelope("a", stream="orders", producer="shop"), stage="dedup", message=GONE)]).records
    assert (record.redrive_job, record.redrive_count, record.stream, record.producer) == ("", 0, b"orders", "shop")
    # A re-driven record whose stream had gone keeps its redrive identity: still a copy of itself.
    [again] = redrive.plan([letter("dedup.dlq", envelope("a", count=2, stream="orders"), stage="dedup", message=GONE)]).records
    assert (again.redrive_job, again.redrive_count) == ("usersum", 2)


def test_a_replay_the_gate_could_not_judge_and_a_letter_re_driven_already_are_left() -> None:
    beyond = letter("dedup.dlq", envelope("a"), stage="dedup", error_class="ReplayBeyondHorizon",
                    message="beyond the dedup horizon: attempt 2 of 'a': ...")
    done = letter("compute.dlq", envelope("b"), job="usersum", offset=7)
    plan = redrive.plan([beyond, done], done={"compute.dlq/0/7": "at 1 ms to usersum"})
    assert not plan.records
    assert "could count it twice" in plan.refused[0][1] and "re-driven already" in plan.refused[1][1]


def test_a_fix_that_would_reach_two_streams_records_is_refused() -> None:
    """Order 17 and payment 17 are two records: a fix by record_id alone cannot tell them apart."""
    plan = redrive.plan(
        [letter("compute.dlq", envelope("17"), job="usersum"), letter("compute.dlq", envelope("17", stream="pay"), job="paycount", offset=1),
         letter("compute.dlq", envelope("18"), job="usersum", offset=2)],
        {"17": b"{}", "18": b"{}"},
    )
    assert [r.record_id for r in plan.records] == [b"18"]
    assert all("more than one stream or producer" in why for _l, why in plan.refused) and len(plan.refused) == 2


def test_letters_that_are_not_a_jobs_records_are_left_saying_why() -> None:
    partial = PartialAggregate(job="usersum", key="u1").SerializeToString()
    plan = redrive.plan([
        letter("ingest.dlq", envelope("a")),
        letter("source.dlq", b"raw user bytes"),
        letter("compute.late", envelope("b"), job="w"),
        letter("compute.dlq", partial, stage="compute-merge"),
        letter("compute.dlq", envelope("c")),  # no job named
        letter("dedup.dlq", b"\xff not an envelope", stage="dedup"),
        letter("dedup.dlq", envelope("d"), stage="dedup", message="something else: record 'd'"),
    ])
    assert not plan.records
    reasons = [why for _letter, why in plan.refused]
    assert "send it again through ingest" in reasons[0]
    assert "fix the record in the source topic" in reasons[1]
    assert "late by design" in reasons[2]
    assert "not a record" in reasons[3] and "not a record" in reasons[5]
    assert "names no job" in reasons[4]
    assert "only a record whose stream had gone" in reasons[6]


def test_a_client_cannot_set_the_redrive_fields() -> None:
    limits = Limits(max_payload_bytes=100, max_key_bytes=10)
    for record in (IngestRecord(record_id=b"a", redrive_job="usersum"), IngestRecord(record_id=b"a", redrive_count=1)):
        invalid = check_record(0, record, limits)
        assert invalid is not None and "set only by `onceflow dlq redrive`" in invalid.message
        assert check_record(0, record, limits, redrive=True) is None
