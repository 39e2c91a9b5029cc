"""Ingest's replayer (a stage over acker.events) on onceflow.testing.StageDriver, no broker: a
timed-out tree's record goes back to ingest.records as attempt n+1 with an INIT naming its
original, in the transaction that commits the event's offset; an aborted replay comes again
as the same tree; past its last attempt, or with nothing to read back, the record is a dead
letter with the reason; a completed tree is only consumed."""

from __future__ import annotations

import pytest

from onceflow import topology
from onceflow.acks import next_root_id
from onceflow.codec import decode_envelope, encode_envelope
from onceflow.state.store import KeyValueStore
from onceflow.testing import Record, StageDriver
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import AckerMessage, RecordRef, TreeEvent
from onceflow.v1.envelope_pb2 import Envelope

from onceflow_ingest.replay import Original, ReplayStage

pytestmark = pytest.mark.acker

RECORDS, DLQ = Topic.INGEST_RECORDS.value, Topic.INGEST_DLQ.value
ROOT = 0xABC


class Originals:
    """ingest.records as the replayer reads it back by (partition, offset)."""

    def __init__(self, records: dict[tuple[int, int], Envelope]) -> None:
        self._at = {at: Original(encode_envelope(envelope), 1_050) for at, envelope in records.items()}

    def fetch(self, partition: int, offset: int) -> Original | None:
        return self._at.get((partition, offset))


ORIGINAL = Envelope(record_id="r", root_id=ROOT, edge_id=9, attempt=1, ingest_time_ms=1_000, payload=b"p")


def replayer(max_attempts: int = 3) -> tuple[ReplayStage, StageDriver[KeyValueStore]]:
    stage = ReplayStage(Originals({(0, 7): ORIGINAL}), RECORDS, DLQ, Topic.ACKER_ACKS.value, max_attempts, 30_000, replay=True)  # type: ignore[arg-type]
    return stage, StageDriver.for_hop(topology.INGEST_REPLAYER, stage)


def decided(outcome: TreeEvent.Outcome, attempt: int = 1, partition: int = 0, offset: int = 7) -> Record:
    event = TreeEvent(
        root_id=ROOT if attempt == 1 else next_root_id(ROOT, attempt), outcome=outcome, attempt=attempt, reason="why",
        origin=RecordRef(record_id="r", topic=RECORDS, partition=partition, offset=offset),
    )
    return Record.of(event, key=event.root_id.to_bytes(8, "big"))


def test_a_timed_out_tree_is_replayed_as_the_next_attempt_with_an_init_naming_its_original() -> None:
    stage, driver = replayer()
    done = driver.process([decided(TreeEvent.TIMED_OUT)])
    (out,) = done.topic(RECORDS)
    replay = decode_envelope(out.value)
    assert out.key == b"r" and (replay.record_id, replay.payload, replay.attempt) == ("r", b"p", 2)
    assert replay.root_id == next_root_id(ROOT, 2) and replay.edge_id != ORIGINAL.edge_id
    (started,) = done.acks
    assert (started.kind, started.root_id, started.xor_value, started.attempt) == (AckerMessage.INIT, replay.root_id, replay.edge_id, 2)
    assert (started.origin.partition, started.origin.offset, started.timeout_ms) == (0, 7, 30_000)
    assert done.offsets == {(Topic.ACKER_EVENTS.value, 0): 1} and stage.replayed == 1


def test_an_aborted_replay_is_not_counted_and_comes_again_as_the_same_tree() -> None:
    stage, driver = replayer()
    aborted = driver.process([decided(TreeEvent.TIMED_OUT)], abort=True)
    assert driver.topic(RECORDS) == [] and stage.replayed == 0 and driver.committed_offsets == {}
    again = driver.process(aborted.records)
    first, second = (decode_envelope(tx.topic(RECORDS)[0].value) for tx in (aborted, again))
    assert first.root_id == second.root_id  # derived, not random: whoever saw the timeout can follow it
    assert stage.replayed == 1 and len(driver.topic(RECORDS)) == 1


def test_past_its_last_attempt_the_record_is_a_dead_letter_that_does_not_claim_it_never_applied() -> None:
    stage, driver = replayer(max_attempts=3)
    done = driver.process([decided(TreeEvent.TIMED_OUT, attempt=3)])
    (letter,) = done.dead_letters()
    assert (letter.stage, letter.error_class) == ("ingest", "TIMED_OUT")
    assert "gave up after 3 attempt(s)" in letter.message and "may still take effect" in letter.message
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (RECORDS, 0, 7)
    assert letter.original == encode_envelope(ORIGINAL) and done.topic(DLQ)[0].key == b"r"
    assert done.topic(RECORDS) == [] and done.acks == [] and stage.dead_lettered == 1


def test_a_tree_with_nothing_to_read_back_is_a_dead_letter_naming_why() -> None:
    _stage, driver = replayer()
    done = driver.process([decided(TreeEvent.TIMED_OUT, offset=99), decided(TreeEvent.FAILED, partition=-1)])
    assert [letter.message for letter in done.dead_letters()] == [
        "original of r not found at ingest.records[0]@99", f"tree {ROOT:#x} has no origin to replay",
    ]
    assert done.topic(RECORDS) == []


def test_a_completed_tree_is_consumed_and_nothing_else() -> None:
    stage, driver = replayer()
    done = driver.process([decided(TreeEvent.COMPLETED)])
    assert done.written == [] and driver.committed_offsets == {(Topic.ACKER_EVENTS.value, 0): 1}
    assert (stage.replayed, stage.dead_lettered, stage.timed_out) == (0, 0, 0)
