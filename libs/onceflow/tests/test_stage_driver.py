"""onceflow.testing.StageDriver itself: a committed batch writes its outputs, changelog and
offsets together and only then reaches the store; an aborted one leaves no trace, state rolled
back included (and the check of that is shown to fail on a store that kept the aborted writes);
a new owner restores the store from the changelog the driver's transactions wrote."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from onceflow import topology
from onceflow.kafka.records import partition_of
from onceflow.spout import new_record
from onceflow.state.store import MemoryStore, StoreDiverged
from onceflow.state.stores import Changelog
from onceflow.testing import Record, StageDriver
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord

pytestmark = pytest.mark.foundation

COUNTS, CHANGELOG, DLQ = "counts", "counter.changelog", "counter.dlq"


class Counter:
    """Counts records per key in its state and emits each new count; b"poison" is rolled back
    alone and dead-lettered, b"crash" fails the whole batch. Remembers what the driver told it.
    (Not a RecordStage: that dead-letters whatever a record raises, a diverged store included.)"""

    name = "counter"

    def __init__(self) -> None:
        self.committed = 0
        self.rollbacks = 0
        self.assigned: list[tuple[list[int], dict[int, MemoryStore]]] = []
        self.revoked: list[int] = []
        self.ticks: list[tuple[int, frozenset[int]]] = []

    def process(self, batch: Batch[MemoryStore]) -> None:
        for record in batch.records:
            if record.value() == b"crash":
                raise SystemError("the stage is broken")
            savepoint = batch.savepoint()
            state, key = batch.state(partition_of(record)), record.key() or b""
            count = int(state.get(key) or 0) + 1
            state.put(key, str(count).encode())
            if record.value() == b"poison":
                batch.rollback_to(savepoint)
                batch.dead_letter(record, ValueError("poison pill"))
                continue
            batch.emit(COUNTS, str(count).encode(), key=key)
            batch.after_commit.append(self._count)

    def _count(self) -> None:
        self.committed += 1

    def punctuate(self, batch: Batch[MemoryStore]) -> None:
        self.ticks.append((batch.now_ms, batch.caught_up))

    def on_assign(self, partitions: list[int], stores: Mapping[int, MemoryStore]) -> None:
        self.assigned.append((partitions, dict(stores)))

    def on_revoke(self, partitions: list[int]) -> None:
        self.revoked += partitions

    def on_rollback(self) -> None:
        self.rollbacks += 1


def counter(partitions: tuple[int, ...] = (0,), store: type[MemoryStore] = MemoryStore) -> tuple[Counter, StageDriver[MemoryStore]]:
    stage = Counter()
    changelog = Changelog(CHANGELOG, lambda _partition: store())
    return stage, StageDriver(stage, input_topic="words", dlq_topic=DLQ, changelog=changelog, partitions=partitions)


def test_a_committed_batch_writes_outputs_changelog_and_offsets_together_then_reaches_the_store() -> None:
    stage, driver = counter()
    first = driver.process([Record(b"x", b"a"), Record(b"x", b"b"), Record(b"x", b"a")])
    assert first.committed and first.values(COUNTS) == [b"1", b"1", b"2"]
    assert first.changes == {0: {b"a": b"2", b"b": b"1"}}
    assert [(r.key, r.value, r.offset) for r in driver.changelog(0)] == [(b"a", b"2", 0), (b"b", b"1", 1)]
    assert driver.table(0) == {b"a": b"2", b"b": b"1"} and driver.store(0).checkpoint == 2
    assert driver.committed_offsets == {("words", 0): 3} == first.offsets
    assert stage.committed == 3  # after_commit ran, once per record
    second = driver.process([Record(b"x", b"a")])
    assert [r.offset() for r in second.records] == [3]  # the consumer went on from where it committed
    assert [r.value for r in driver.topic(COUNTS)] == [b"1", b"1", b"2", b"3"]


def assert_rolled_back(driver: StageDriver[MemoryStore], table: dict[bytes, bytes], changelog: int) -> None:
    """Nothing of an aborted transaction is left: not in the store, not in the changelog."""
    assert driver.table(0) == table, "the store kept writes of an aborted transaction"
    assert len(driver.changelog(0)) == changelog, "the changelog kept records of an aborted transaction"


def test_an_abort_rolls_state_back_and_the_records_come_again_at_their_offsets() -> None:
    stage, driver = counter()
    driver.process([Record(b"x", b"a")])
    aborted = driver.process([Record(b"x", b"a"), Record(b"x", b"c")], abort=True)
    assert not aborted.committed and aborted.changes == {0: {b"a": b"2", b"c": b"1"}}  # the stage did write
    assert_rolled_back(driver, {b"a": b"1"}, changelog=1)
    assert driver.topic(COUNTS) == [driver.topic(COUNTS)[0]] and driver.committed_offsets == {("words", 0): 1}
    assert stage.committed == 1 and stage.rollbacks == 1  # no after_commit; the stage was told
    again = driver.process([Record(b"x", b"a"), Record(b"x", b"c")])
    assert [r.offset() for r in again.records] == [r.offset() for r in aborted.records] == [1, 2]
    assert again.values(COUNTS) == [b"2", b"1"]  # counted once: as if the abort never happened
    assert driver.table(0) == {b"a": b"2", b"c": b"1"}


def test_the_rollback_check_fails_on_a_store_that_kept_the_aborted_writes() -> None:
    """The check above can fail: a driver that let an aborted overlay reach the store."""
    _stage, driver = counter()
    driver.process([Record(b"x", b"a")])
    aborted = driver.process([Record(b"x", b"a")], abort=True)
    driver.store(0).apply(aborted.changes[0], None)  # what a broken abort would do
    with pytest.raises(AssertionError, match="kept writes of an aborted transaction"):
        assert_rolled_back(driver, {b"a": b"1"}, changelog=1)


def test_a_poison_record_is_rolled_back_alone_and_dead_lettered_with_its_reason() -> None:
    _stage, driver = counter()
    done = driver.process([Record(b"x", b"a"), Record(b"poison", b"a"), Record(b"x", b"b")])
    (letter,) = done.dead_letters()
    assert (letter.stage, letter.error_class, letter.message) == ("counter", "ValueError", "poison pill")
    assert (letter.source_topic, letter.source_offset, letter.original) == ("words", 1, b"poison")
    assert done.values(COUNTS) == [b"1", b"1"] and driver.table(0) == {b"a": b"1", b"b": b"1"}


def test_a_stage_that_fails_on_the_batch_commits_nothing_and_its_error_is_raised() -> None:
    stage, driver = counter()
    driver.process([Record(b"x", b"a")])
    with pytest.raises(SystemError, match="broken"):
        driver.process([Record(b"x", b"a"), Record(b"crash", b"a")])
    assert driver.table(0) == {b"a": b"1"} and driver.committed_offsets == {("words", 0): 1}
    assert stage.rollbacks == 1
    assert [r.offset() for r in driver.process([Record(b"x", b"b")]).records] == [1]  # read again from the commit


def test_a_new_owner_restores_the_store_from_the_changelog() -> None:
    stage, driver = counter(partitions=(0, 1))
    driver.process([Record(b"x", b"a"), Record(b"x", b"a", partition=1), Record(b"x", b"b")])
    driver.process([Record(b"x", b"a")])
    old = driver.store(0)
    driver.restore()
    assert driver.store(0) is not old and len(old) == 0  # closed: nothing left but the changelog
    assert driver.table(0) == {b"a": b"2", b"b": b"1"} and driver.table(1) == {b"a": b"1"}
    assert driver.store(0).checkpoint == len(driver.changelog(0)) == 3  # a then b, then a again: the later wins
    assert stage.revoked == [0, 1] and [p for p, _ in stage.assigned] == [[0, 1], [0, 1]]
    assert stage.assigned[-1][1][0] is driver.store(0)  # the stage is handed the restored store
    assert driver.process([Record(b"x", b"a")]).values(COUNTS) == [b"3"]


class Forgetful(MemoryStore):
    """A store outside the process that can lose what it was written (a Redis rolled back): it
    says so at the next read, as the Redis stores' continuity checks do."""

    def lose(self) -> None:
        self._data.clear()
        self.lost = True

    def get(self, key: bytes) -> bytes | None:
        if getattr(self, "lost", False):
            raise StoreDiverged(0, "rolled back behind the test's back")
        return super().get(key)

    def reset(self) -> None:
        super().reset()
        self.lost = False


def test_a_diverged_store_is_rebuilt_from_the_changelog_and_the_batch_read_again() -> None:
    stage, driver = counter(store=Forgetful)
    driver.process([Record(b"x", b"a"), Record(b"x", b"b")])
    store = driver.store(0)
    assert isinstance(store, Forgetful)
    store.lose()
    with pytest.raises(StoreDiverged):
        driver.process([Record(b"x", b"a")])
    assert driver.table(0) == {b"a": b"1", b"b": b"1"} and driver.stores is not None and driver.stores.repairs == 1
    assert stage.rollbacks == 1
    assert driver.process([Record(b"x", b"a")]).values(COUNTS) == [b"2"]


def test_a_punctuation_sees_the_clock_and_the_caught_up_partitions_it_is_given() -> None:
    stage, driver = counter(partitions=(0, 1))
    driver.punctuate(now_ms=5_000, caught_up=[1])
    driver.punctuate(now_ms=6_000)
    assert stage.ticks == [(5_000, frozenset({1})), (6_000, frozenset({0, 1}))]


def test_records_keep_what_they_were_given_and_a_partition_not_owned_is_refused() -> None:
    _stage, driver = counter()
    (record,) = driver.process([Record(b"x", b"k", offset=41, timestamp_ms=7, log_append_time=True, headers=[("h", b"v")])]).records
    assert (record.offset(), record.timestamp(), record.headers()) == (41, (TIMESTAMP_LOG_APPEND_TIME, 7), [("h", b"v")])
    assert driver.committed_offsets == {("words", 0): 42}
    with pytest.raises(ValueError, match="does not own"):
        driver.process([Record(b"x", b"k", partition=3)])


class Spout:
    """A stage that starts a tree per record (as the Kafka source does) and acks an envelope."""

    name = "spout"

    def process(self, batch: Batch[MemoryStore]) -> None:
        for message in batch.records:
            record = new_record(IngestRecord(record_id=message.value() or b"", payload=b"p"), batch.now_ms)
            batch.emit_new("ingest.records", record, 30_000)
        batch.ack(Envelope(root_id=7, edge_id=5), children=[3])


def test_new_roots_are_written_with_inits_naming_where_they_landed() -> None:
    driver = StageDriver(Spout(), input_topic="user.topic", dlq_topic="spout.dlq", ack_partitions=2)
    driver.process([b"first"])
    done = driver.process([b"r1", b"r2"])
    roots = done.topic("ingest.records")
    assert [(r.key, r.offset) for r in roots] == [(b"r1", 1), (b"r2", 2)]  # after the first batch's root
    inits = {m.origin.record_id: m for m in done.acks if m.kind == AckerMessage.INIT}
    assert {k: (m.origin.offset, m.timeout_ms) for k, m in inits.items()} == {"r1": (1, 30_000), "r2": (2, 30_000)}
    (ack,) = [m for m in done.acks if m.kind == AckerMessage.ACK]
    assert (ack.root_id, ack.xor_value, ack.stage) == (7, 5 ^ 3, "spout")
    for record in done.topic("acker.acks"):  # one AckerBatch per acker.acks partition, each of its own trees
        assert {m.root_id % 2 for m in AckerBatch.FromString(record.value or b"").messages} == {record.partition}


def test_for_hop_takes_the_hops_topics_from_the_topology() -> None:
    stage = Counter()
    driver = StageDriver.for_hop(topology.COMPUTE_MERGE, stage, job="usersum", store=lambda _partition: MemoryStore())
    assert (driver.input_topic, driver.dlq_topic, driver.changelog_topic) == (
        "compute.partials.usersum", "compute.dlq", "compute.changelog.usersum",
    )
    assert StageDriver.for_hop(topology.COMPUTE_MAP, stage, job="usersum").stores is None  # no store given: stateless
    with pytest.raises(ValueError, match="spout"):
        StageDriver.for_hop(topology.SOURCE, stage)
    with pytest.raises(ValueError, match="no changelog"):
        StageDriver.for_hop(topology.SOURCE, stage, input_topic="orders", store=lambda _partition: MemoryStore())
