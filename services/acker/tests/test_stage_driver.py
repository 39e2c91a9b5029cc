"""The acker's stage on onceflow.testing.StageDriver (no broker): a tree is decided exactly once
whether its completing acks come in one transaction or after an abort, after a new owner restored
the trees from acker.changelog, or not at all (a timeout, judged by the clock of what was read
while the acker is behind); a FAIL ends a tree FAILED with its reason; poison is a dead letter."""

from __future__ import annotations

import pytest

from onceflow import acks, topology
from onceflow.state.store import MemoryStore
from onceflow.testing import Record, StageDriver
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, RecordRef, TreeEvent

from onceflow_acker.stage import AckerStage, AckerStats

pytestmark = pytest.mark.acker

EVENTS = Topic.ACKER_EVENTS.value
T0 = 1_000_000  # the broker's clock when the trees start (acker.acks is LogAppendTime)


def acker(partitions: tuple[int, ...] = (0,)) -> tuple[AckerStage, StageDriver[MemoryStore]]:
    stage = AckerStage(EVENTS, Topic.INGEST_RECORDS.value, 60_000, AckerStats())
    driver = StageDriver.for_hop(
        topology.ACKER, stage, store=lambda _partition: MemoryStore(), partitions=partitions, ack_partitions=len(partitions)
    )
    return stage, driver


def sent(*messages: AckerMessage, at_ms: int = T0, partitions: int = 1) -> Record:
    """One stage's acker batch, on its tree's acker.acks partition, stamped by the broker."""
    return Record.of(
        AckerBatch(messages=messages), partition=messages[0].root_id % partitions, timestamp_ms=at_ms, log_append_time=True
    )


def init(root: int, edges: list[int], record_id: str = "r", timeout_ms: int = 30_000, attempt: int = 1) -> AckerMessage:
    origin = RecordRef(record_id=record_id, partition=2, offset=5)
    return acks.init(root, edges, origin, attempt, timeout_ms)


def ack(root: int, edge: int, children: tuple[int, ...] = ()) -> AckerMessage:
    return acks.ack(root, edge, children, "bolt")


def test_a_tree_is_decided_once_when_its_last_edge_is_acked_in_a_later_transaction() -> None:
    stage, driver = acker()
    driver.process([sent(init(7, [11, 12], "rec-7"))])
    driver.process([sent(ack(7, 11, children=(13,)))])
    assert driver.process([sent(ack(7, 12))]).topic(EVENTS) == []  # edge 13 is still out
    done = driver.process([sent(ack(7, 13))])
    (event,) = done.decode(EVENTS, TreeEvent)
    assert (event.outcome, event.root_id, event.attempt) == (TreeEvent.COMPLETED, 7, 1)
    assert (event.origin.record_id, event.origin.topic, event.origin.partition, event.origin.offset) == (
        "rec-7", "ingest.records", 2, 5,
    )
    assert done.topic(EVENTS)[0].key == acks.root_key(7) and event.latency_ms >= 0
    assert driver.table() == {} and done.changes == {0: {acks.root_key(7): None}}  # a tombstone in the changelog
    assert (stage.stats.completed, stage.stats.acks) == (1, 4)


def test_an_aborted_completion_is_decided_once_when_its_acks_come_again() -> None:
    stage, driver = acker()
    driver.process([sent(init(7, [11]))])
    aborted = driver.process([sent(ack(7, 11))], abort=True)
    assert [e.outcome for e in aborted.decode(EVENTS, TreeEvent)] == [TreeEvent.COMPLETED]  # written, never committed
    assert acks.root_key(7) in driver.table() and stage.stats.completed == 0
    driver.process(aborted.records)  # read again from the committed offset
    assert [TreeEvent.FromString(r.value or b"").root_id for r in driver.topic(EVENTS)] == [7]
    assert stage.stats.completed == 1 and driver.table() == {}


def test_a_new_owner_decides_the_trees_it_restored_from_the_changelog() -> None:
    _stage, driver = acker(partitions=(0, 1))
    driver.process([sent(init(root, [root * 10], f"rec-{root}"), partitions=2) for root in (4, 5)])
    driver.restore([1])  # root 5's partition moves to a new owner
    assert acks.root_key(5) in driver.table(1)
    done = driver.process([sent(ack(5, 50), partitions=2), sent(ack(4, 40), partitions=2)])
    events = {e.root_id: e for e in done.decode(EVENTS, TreeEvent)}
    assert {root: e.origin.record_id for root, e in events.items()} == {4: "rec-4", 5: "rec-5"}


def test_a_tree_past_its_deadline_times_out_once_with_the_reason() -> None:
    _stage, driver = acker()
    driver.process([sent(init(7, [11], timeout_ms=5_000))])
    assert driver.punctuate(now_ms=T0 + 4_999).topic(EVENTS) == []
    (event,) = driver.punctuate(now_ms=T0 + 5_000).decode(EVENTS, TreeEvent)
    assert (event.outcome, event.reason, event.origin.record_id) == (TreeEvent.TIMED_OUT, "not fully acked within 5000 ms", "r")
    assert driver.punctuate(now_ms=T0 + 9_000).topic(EVENTS) == [] and driver.table() == {}


def test_while_behind_the_sweep_judges_by_what_was_read_so_a_backlog_times_nothing_out() -> None:
    """An acker back from an outage: every deadline has passed on the wall clock, but the acks
    are still unread in its backlog; only a tree whose deadline the read input has passed may
    time out."""
    _stage, driver = acker()
    driver.process([sent(init(7, [11], timeout_ms=5_000)), sent(init(8, [21], timeout_ms=5_000), at_ms=T0 + 1)])
    driver.process([sent(ack(8, 21), at_ms=T0 + 4_000)])
    assert driver.punctuate(now_ms=T0 + 3_600_000, caught_up=[]).topic(EVENTS) == []  # read up to T0 + 4 s
    (event,) = driver.process([sent(ack(7, 11), at_ms=T0 + 6_000)]).decode(EVENTS, TreeEvent)
    assert event.outcome == TreeEvent.COMPLETED  # its ack came in time, if late to be read


def test_a_failed_record_ends_its_tree_failed_with_the_reason_even_before_its_init() -> None:
    _stage, driver = acker()
    fail = acks.fail(7, "compute", "job raised")
    first = driver.process([sent(init(7, [11])), sent(fail)])
    early = driver.process([sent(acks.fail(8, "compute", "early")), sent(init(8, [21]))])
    (failed,) = first.decode(EVENTS, TreeEvent)
    (held,) = early.decode(EVENTS, TreeEvent)
    assert (failed.outcome, failed.reason) == (TreeEvent.FAILED, "job raised")
    assert (held.outcome, held.reason) == (TreeEvent.FAILED, "failed before its INIT arrived")


def test_poison_is_dead_lettered_with_the_reason_and_the_rest_is_kept() -> None:
    _stage, driver = acker()
    nameless = AckerMessage(kind=AckerMessage.ACK, xor_value=3)
    done = driver.process([Record(b"\xff\xff not a batch"), sent(init(7, [11]), nameless)])
    letters = done.dead_letters()
    assert [(d.error_class, d.stage) for d in letters] == [("DecodeError", "acker"), ("Rejected", "acker")]
    assert letters[1].message == "acker message without root_id" and letters[1].original == nameless.SerializeToString()
    assert list(driver.table()) == [acks.root_key(7)]
