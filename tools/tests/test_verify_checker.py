"""The verify checker's pure parts: finding aborted writes, and a verdict that fails on each
kind of violation."""

from __future__ import annotations

import pytest
import typer

from onceflow.acks import reader_edge
from onceflow.codec import encode_envelope
from onceflow.kafka.inspect import TopicRecord
from onceflow.v1.envelope_pb2 import Envelope
from onceflow_tools.cli.verify import parse_duration
from onceflow_tools.verify.check import Verdict, _aborted

pytestmark = pytest.mark.verify


def _record(offset: int, record_id: str, root: int, edge: int) -> TopicRecord:
    return TopicRecord(0, offset, None, encode_envelope(Envelope(record_id=record_id, root_id=root, edge_id=edge)), ())


def test_aborted_writes_are_those_only_an_uncommitted_read_sees_and_no_committed_write_repeats() -> None:
    committed = [_record(0, "a", 1, 10), _record(3, "b", 2, 20)]
    # Offsets 1 and 2 were in an aborted transaction: "b" was retried (same root, as a replay
    # is) and committed at 3; "c" only ever existed in the aborted transaction.
    everything = [*committed, _record(1, "b", 2, 21), _record(2, "c", 3, 30)]
    aborted = _aborted(committed, everything)
    assert aborted.count == 2
    assert aborted.roots == {3}
    assert aborted.edges == {21, 30}


def test_an_aborted_gate_output_names_the_edge_each_of_its_readers_would_ack() -> None:
    """docs/decisions/0028: a job acks its own edge of a record, so an aborted read shows as an
    ack of that edge, not of the envelope's."""
    named = Envelope(record_id="n", root_id=4, edge_id=40, readers=["usersum", "picky@2"])
    everything = [_record(0, "a", 1, 10), TopicRecord(0, 1, None, encode_envelope(named), ())]
    aborted = _aborted(everything[:1], everything)
    assert aborted.edges == {40, reader_edge(40, "usersum"), reader_edge(40, "picky@2")}


def _verdict(**changes: object) -> Verdict:
    fields: dict[str, object] = dict(
        records=10, distinct=10, faults_injected={"kill9": 1}, lost=0, duplicated=0, aborted_reads=0,
        hanging_transactions=0, sink_matches_batch=True, dlq=0, late=0,
    )
    return Verdict(**(fields | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "violation",
    [{"lost": 1}, {"duplicated": 1}, {"aborted_reads": 1}, {"hanging_transactions": 1}, {"sink_matches_batch": False}, {"unknown": 1}],
)
def test_the_verdict_fails_on_every_kind_of_violation(violation: dict[str, object]) -> None:
    assert _verdict().ok
    verdict = _verdict(**violation)
    assert not verdict.ok
    assert verdict.to_json()["ok"] is False


def test_durations_read_as_operators_write_them() -> None:
    assert parse_duration("90") == parse_duration("90s") == 90
    assert parse_duration("2m") == 120
    assert parse_duration("1.5h") == 5400
    with pytest.raises(typer.BadParameter):
        parse_duration("two minutes")
