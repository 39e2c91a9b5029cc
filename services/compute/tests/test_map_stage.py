"""The map hop's handling of bad input, with the pandas engine (no JVM) or a failing stub:
schema violations are found by bisecting the Arrow parse, records a job raises on by bisecting
the engine run, and a job that fails on everything is a job failure, not poison."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Message

from onceflow.acks import reader_edge
from onceflow.codec import encode_envelope
from onceflow.topology import Topic, job_topic
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, Count, Sum
from onceflow_compute.engine.pandas_engine import PandasEngine
from onceflow_compute.engine.run import JobFailed
from onceflow_compute.frames import build_frame
from onceflow_compute.map.stage import MapStage

pytestmark = pytest.mark.compute

SCHEMA = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)])
JOB = Aggregation(name="sum", schema=SCHEMA, key="user", aggregates=(Sum("amount", name="total"), Count("count")))
PARTIALS = job_topic(Topic.COMPUTE_PARTIALS, JOB.name)


def record(offset: int, payload: bytes) -> Message:
    envelope = Envelope(record_id=f"r{offset}", root_id=offset + 1, edge_id=offset + 100, payload=payload, key=b"u")
    return Message(topic=Topic.DEDUP_RECORDS, partition=0, offset=offset, key=b"u", value=encode_envelope(envelope))


def good(offset: int, user: str = "u", amount: int = 1) -> Message:
    return record(offset, json.dumps({"user": user, "amount": amount}).encode())


def test_one_vectorised_parse_for_clean_payloads_with_metadata_columns() -> None:
    frame = build_frame([good(0, "a", 5), record(1, b'{\n "user": "b",\n "amount": 7\n}')], SCHEMA)
    assert not frame.rejected
    assert frame.table.select(["user", "amount", "_record_id"]).to_pylist() == [
        {"user": "a", "amount": 5, "_record_id": "r0"}, {"user": "b", "amount": 7, "_record_id": "r1"},
    ]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        # Issue 45: Arrow's own words were "changed from number to string in row 0", "Invalid value.".
        (b'{"user": "a", "amount": "ten"}', 'schema violation: field `amount`: expected int64, got a string "ten"'),
        (b'{"user": "a", "amount": true}', "field `amount`: expected int64, got a boolean true"),
        (b'{"amount": 3}', "a required field is missing: `user` (string) is missing"),
        (b'{"user": null, "amount": 3}', "a required field is missing: `user` (string) is null"),
        (b"[1, 2]", "not a JSON object but an array [1, 2]"),
        (b"", "empty payload"),
        (b'{"user": "a", "amount": 1} {"user": "b", "amount": 2}', "more than one JSON value"),
        (b"not json", "schema violation: not JSON: Expecting value: line 1 column 1"),
    ],
)
def test_each_bad_payload_is_named_among_good_ones(payload: bytes, reason: str) -> None:
    records = [good(i) for i in range(40)]
    records.insert(17, record(99, payload))
    frame = build_frame(records, SCHEMA)
    assert [(r.offset(), e is not None) for r, e, _ in frame.rejected] == [(99, True)]
    assert reason in frame.rejected[0][2]
    assert frame.table.num_rows == 40 and [r.offset() for r in frame.records] == list(range(40))


def test_a_record_redriven_to_another_job_is_passed_over_and_one_to_this_job_taken() -> None:
    """onceflow dlq redrive (docs/decisions/0026): a letter goes back to the job that refused it."""

    def redriven(offset: int, job: str) -> Message:
        envelope = Envelope(record_id=f"r{offset}", root_id=offset + 1, edge_id=offset + 100, key=b"u",
                            payload=b'{"user": "u", "amount": 5}', redrive_job=job, redrive_count=1)
        return Message(topic=Topic.DEDUP_RECORDS, partition=0, offset=offset, key=b"u", value=encode_envelope(envelope))

    frame = build_frame([good(0), redriven(1, "other"), redriven(2, JOB.name)], SCHEMA, JOB.name)
    assert [r.offset() for r in frame.records] == [0, 2] and not frame.rejected
    assert [e.record_id for e in frame.passed_over] == ["r1"]
    batch = run_stage([good(0), redriven(1, "other")], PandasEngine())
    assert batch.job == JOB.name
    assert not [o for o in batch.outputs if o.topic == Topic.COMPUTE_DLQ]  # passed over: no letter


def test_a_reader_acks_its_own_edge_and_a_record_naming_other_readers_is_read_but_never_acked() -> None:
    """docs/decisions/0028: the gate names the jobs reading the stream; each acks its own edge.
    A job that started after a record passed still counts it, and leaves its tree alone."""

    def named(offset: int, readers: list[str]) -> Message:
        envelope = Envelope(record_id=f"r{offset}", root_id=offset + 1, edge_id=offset + 100, key=b"u",
                            payload=b'{"user": "u", "amount": 5}', readers=readers)
        return Message(topic=Topic.DEDUP_RECORDS, partition=0, offset=offset, key=b"u", value=encode_envelope(envelope))

    records = [named(0, [JOB.name, "other"]), named(1, ["other"]), good(2)]
    frame = build_frame(records, SCHEMA, JOB.name, JOB.name)
    assert [e.edge_id for e in frame.envelopes] == [reader_edge(100, JOB.name), 101, 102]
    assert [e.record_id for e in frame.foreign] == ["r1"] and frame.table.num_rows == 3  # all three counted
    assert [e.edge_id for e in build_frame(records, SCHEMA).envelopes] == [100, 101, 102]  # a batch run acks nothing
    batch = run_stage(records, PandasEngine())
    batch.seal()
    acked = {m.root_id: m.xor_value for o in batch.outputs if o.topic == Topic.ACKER_ACKS
             for m in AckerBatch.FromString(o.value).messages if m.kind == AckerMessage.ACK}
    assert set(acked) == {1, 3}  # root 2's tree is the other job's
    group = acked[3] ^ 102  # good(2): its edge, and the group as its child
    assert acked[1] == reader_edge(100, JOB.name) ^ group


def test_a_map_letter_names_its_job() -> None:
    batch = run_stage([good(0), record(1, b'{"user": "a", "amount": "ten"}')], PandasEngine())
    [letter] = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.COMPUTE_DLQ]
    assert letter.job == JOB.name and letter.source_offset == 1


def test_undecodable_bytes_are_rejected_without_an_envelope() -> None:
    bad = Message(topic=Topic.DEDUP_RECORDS, partition=0, offset=5, key=b"x", value=b"\xff\x00junk")
    frame = build_frame([good(0), bad], SCHEMA)
    assert [(r.offset(), e) for r, e, _ in frame.rejected] == [(5, None)]


class RaisesOn:
    """A job engine that fails whenever the batch holds a poisoned amount."""

    name = "stub"

    def __init__(self, poison: set[int]) -> None:
        self.poison = poison
        self.runs = 0

    def partials(self, job: Aggregation, table: pa.Table) -> pa.Table:
        self.runs += 1
        if self.poison & set(table.column("amount").to_pylist()):
            raise ValueError("amount is poison")
        return PandasEngine().partials(job, table)

    def transform(self, job, table):  # noqa: ANN001, ANN201
        raise NotImplementedError

    def close(self) -> None:
        pass


def run_stage(records: list[Message], engine: object, budget: int = 64) -> Batch:
    batch = Batch(records, None, Topic.COMPUTE_DLQ, "compute", Topic.ACKER_ACKS, 1)
    MapStage(JOB, engine, PARTIALS, Topic.COMPUTE_RESULTS, stats.JobCounts(), budget).process(batch)  # type: ignore[arg-type]
    return batch


def test_records_the_job_raises_on_are_found_by_bisection_and_the_rest_is_aggregated() -> None:
    records = [good(i, f"u{i % 3}", amount=i) for i in range(1, 200)]
    engine = RaisesOn({57, 140})
    batch = run_stage(records, engine)
    letters = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.COMPUTE_DLQ]
    assert sorted(letter.source_offset for letter in letters) == [57, 140]
    assert all("amount is poison" in letter.message for letter in letters)
    partials = {p.key: json.loads(p.partials) for p in
                (PartialAggregate.FromString(o.value) for o in batch.outputs if o.topic == PARTIALS)}
    expected = {f"u{k}": [sum(i for i in range(1, 200) if i % 3 == k and i not in (57, 140)),
                          sum(1 for i in range(1, 200) if i % 3 == k and i not in (57, 140))] for k in range(3)}
    assert partials == expected
    assert engine.runs < 40  # bisection, not one run per record
    acks = [o for o in batch.outputs if o.topic == Topic.ACKER_ACKS]
    assert not acks  # not sealed yet: the loop seals; every record is acked in the buffer
    batch.seal()
    assert [o for o in batch.outputs if o.topic == Topic.ACKER_ACKS]


def test_a_job_failing_on_every_record_fails_the_batch_instead_of_dead_lettering_it() -> None:
    with pytest.raises(JobFailed, match="failed on all 6 records"):
        run_stage([good(i, amount=7) for i in range(6)], RaisesOn({7}))
    engine = RaisesOn({7})
    with pytest.raises(JobFailed, match="could not be isolated within 64 engine runs"):
        run_stage([good(i, amount=7) for i in range(5000)], engine)
    assert engine.runs == 64


def test_the_bisection_budget_bounds_the_engine_runs() -> None:
    records = [good(i, amount=i) for i in range(1000)]
    engine = RaisesOn(set(range(0, 1000, 3)))
    with pytest.raises(JobFailed, match="could not be isolated within 16 engine runs"):
        run_stage(records, engine, budget=16)
    assert engine.runs <= 16


def test_a_lone_failing_record_is_poison_only_once_the_job_has_worked() -> None:
    engine = RaisesOn({7})
    stage = MapStage(JOB, engine, PARTIALS, Topic.COMPUTE_RESULTS, stats.JobCounts())  # type: ignore[arg-type]
    with pytest.raises(JobFailed):  # a broken job would otherwise drain a quiet stream into the DLQ
        stage.process(Batch([good(0, amount=7)], None, Topic.COMPUTE_DLQ, "compute", Topic.ACKER_ACKS, 1))
    stage.process(Batch([good(1, amount=1)], None, Topic.COMPUTE_DLQ, "compute", Topic.ACKER_ACKS, 1))
    batch = Batch([good(2, amount=7)], None, Topic.COMPUTE_DLQ, "compute", Topic.ACKER_ACKS, 1)
    stage.process(batch)
    assert batch.dead_letters == 1


def test_an_errors_meaningful_line_is_kept() -> None:
    """Issue 45: Status showed `AnalysisException: +- LogicalRDD , false`, the plan's last line."""
    from onceflow_compute.engine.run import describe

    class AnalysisException(Exception):
        pass

    class PythonException(Exception):
        pass

    plan = AnalysisException(
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column or function parameter with name `amount` cannot be resolved. "
        "Did you mean one of the following? [`amount_cents`, `user`].;\n'Aggregate [user#1]\n+- LogicalRDD , false"
    )
    assert describe(plan) == (
        "AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column or function parameter with name `amount` cannot "
        "be resolved. Did you mean one of the following? [`amount_cents`, `user`].;"
    )
    worker = PythonException('\n  An exception was thrown from the Python worker.\nTraceback (most recent call last):\n  File "x.py"\nValueError: 13 is unlucky\n')
    assert describe(worker) == "PythonException: ValueError: 13 is unlucky"
    assert describe(ValueError("one line")) == "ValueError: one line"
