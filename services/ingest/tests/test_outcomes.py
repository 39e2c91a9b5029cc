"""What ingest tells a caller, and does, when a tree does not complete (docs/decisions/0022).
Pure: trees and events by hand, the replayer's batch without Kafka.

The rule under test: ABORTED only for a record that took no effect and never will; a timed-out
tree may still take effect, so its caller hears "unknown" (retriable), and by default nothing is
replayed or dead-lettered for it."""

from __future__ import annotations

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message
from hypothesis import given
from hypothesis import strategies as st

from onceflow.acks import next_root_id
from onceflow.codec import decode_envelope, encode_envelope
from onceflow.trees import InFlightTrees, Waiter
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import RecordRef, TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope

from onceflow_ingest.replay import Original, ReplayStage

pytestmark = pytest.mark.edges

ROOT = 0x1234


def event(outcome: TreeEvent.Outcome.ValueType, attempt: int = 1, root_id: int = ROOT, record_id: str = "r") -> TreeEvent:
    return TreeEvent(
        root_id=root_id, outcome=outcome, attempt=attempt, reason="why",
        origin=RecordRef(record_id=record_id, topic="ingest.records", partition=0, offset=7),
    )


def waited(max_attempts: int, *outcomes: TreeEvent.Outcome.ValueType) -> Waiter:
    """One record's tree through ``outcomes``, attempt by attempt, as the acker reports them."""
    trees = InFlightTrees(max_attempts)
    waiter = Waiter(remaining=1)
    trees.add([(ROOT, "r")], waiter)
    root = ROOT
    for attempt, outcome in enumerate(outcomes, start=1):
        trees.on_event(event(outcome, attempt, root))
        root = next_root_id(root, attempt + 1)
    return waiter


def test_without_replays_a_timed_out_tree_is_unknown_never_aborted() -> None:
    waiter = waited(1, TreeEvent.TIMED_OUT)
    assert waiter.done.is_set() and waiter.failures == [] and len(waiter.unknown) == 1


def test_a_failed_tree_is_aborted() -> None:
    waiter = waited(1, TreeEvent.FAILED)
    assert waiter.done.is_set() and len(waiter.failures) == 1 and waiter.unknown == []


def test_with_replays_a_failure_after_a_timeout_is_still_unknown() -> None:
    """Attempt 1 timed out (its copy may be in a stalled hop), attempt 2 failed: attempt 1 can
    still take effect, so ABORTED would be a lie."""
    waiter = waited(2, TreeEvent.TIMED_OUT, TreeEvent.FAILED)
    assert waiter.done.is_set() and waiter.failures == [] and len(waiter.unknown) == 1


@given(st.lists(st.sampled_from([TreeEvent.COMPLETED, TreeEvent.FAILED, TreeEvent.TIMED_OUT]), min_size=1, max_size=4))
def test_aborted_only_when_every_attempt_failed(outcomes: list[TreeEvent.Outcome.ValueType]) -> None:
    max_attempts = len(outcomes)
    # The tree ends at its first COMPLETED (a completed tree is never replayed).
    if TreeEvent.COMPLETED in outcomes:
        outcomes = outcomes[: outcomes.index(TreeEvent.COMPLETED) + 1]
    waiter = waited(max_attempts, *outcomes)
    if outcomes[-1] != TreeEvent.COMPLETED and len(outcomes) < max_attempts:
        assert not waiter.done.is_set()  # a replay is still to come
        return
    assert waiter.done.is_set()
    if outcomes[-1] == TreeEvent.COMPLETED:
        assert waiter.failures == [] and waiter.unknown == []
    elif all(o == TreeEvent.FAILED for o in outcomes):
        assert len(waiter.failures) == 1 and waiter.unknown == []
    else:
        assert waiter.failures == [] and len(waiter.unknown) == 1


class Fetcher:
    def __init__(self, envelope: Envelope, appended_ms: int) -> None:
        self.original = Original(encode_envelope(envelope), appended_ms)
        self.fetched = 0

    def fetch(self, partition: int, offset: int) -> Original | None:
        self.fetched += 1
        return self.original


def replay_batch(stage: ReplayStage, *events: TreeEvent) -> Batch:  # type: ignore[type-arg]
    records = [
        Message(topic="acker.events", partition=0, offset=i, key=b"", value=e.SerializeToString(),
                timestamp=(TIMESTAMP_LOG_APPEND_TIME, 1))
        for i, e in enumerate(events)
    ]
    batch: Batch = Batch(records, None, "ingest.dlq", stage.name, "acker.acks")  # type: ignore[type-arg]
    stage.process(batch)
    batch.seal()
    for callback in batch.after_commit:
        callback()
    return batch


def stage_with(replay: bool, max_attempts: int = 3) -> tuple[ReplayStage, Fetcher]:
    original = Envelope(record_id="r", root_id=ROOT, edge_id=9, attempt=1, ingest_time_ms=1_000, payload=b"p")
    fetcher = Fetcher(original, appended_ms=1_050)
    stage = ReplayStage(fetcher, "ingest.records", "ingest.dlq", "acker.acks", max_attempts, 30_000, replay=replay)  # type: ignore[arg-type]
    return stage, fetcher


def test_by_default_a_timed_out_tree_is_counted_not_replayed_nor_dead_lettered() -> None:
    stage, fetcher = stage_with(replay=False)
    batch = replay_batch(stage, event(TreeEvent.TIMED_OUT))
    assert [o.topic for o in batch.outputs] == []
    assert (stage.timed_out, stage.replayed, stage.dead_lettered, fetcher.fetched) == (1, 0, 0, 0)


def test_by_default_a_failed_tree_goes_to_the_dlq_saying_it_took_no_effect() -> None:
    stage, _fetcher = stage_with(replay=False)
    batch = replay_batch(stage, event(TreeEvent.FAILED))
    (letter,) = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == "ingest.dlq"]
    assert letter.error_class == "FAILED" and "took no effect" in letter.message


def test_a_replay_carries_its_originals_log_append_time() -> None:
    stage, _fetcher = stage_with(replay=True)
    batch = replay_batch(stage, event(TreeEvent.TIMED_OUT))
    (out,) = [o for o in batch.outputs if o.topic == "ingest.records"]
    replayed = decode_envelope(out.value)
    assert (replayed.attempt, replayed.first_appended_ms, replayed.ingest_time_ms) == (2, 1_050, 1_000)
    assert replayed.root_id == next_root_id(ROOT, 2)


def test_a_replay_given_up_on_after_a_timeout_is_not_called_never_applied() -> None:
    stage, _fetcher = stage_with(replay=True, max_attempts=1)
    batch = replay_batch(stage, event(TreeEvent.TIMED_OUT))
    (letter,) = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == "ingest.dlq"]
    assert "gave up after 1 attempt" in letter.message and "may still take effect" in letter.message
