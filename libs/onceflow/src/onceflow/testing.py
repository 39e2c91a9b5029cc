"""A stage under test with no broker, as Kafka Streams' TopologyTestDriver tests a topology.

``StageDriver`` runs any stage (``txn.batch.Stage``) over records given in memory, through the
real ``Batch`` (savepoints, dead letters, acker messages), the real state overlay and the hop's
real stores, and then commits or aborts the batch as one transaction: on commit the outputs, the
changelog records and the input offsets are written together and only then does the overlay
reach the stores and ``after_commit`` run; on abort none of it happens, the consumer goes back
to its committed offsets and the stage's ``on_rollback`` runs. The topics are in memory too, so
a partition's store can be dropped and restored from the changelog records the driver's own
transactions wrote: exactly once is the point, so aborts and restores are first-class here.

It is built on the stage interface and ``Batch`` alone, not on the loop: what the loop adds
(polling, Kafka transactions, rebalance callbacks, retries) is what the broker-backed suite in
``tests/`` is for (docs/architecture.md, "Testing a stage").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any, Generic, TypeVar, cast

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message
from google.protobuf.message import Message as ProtoMessage

from onceflow import spout
from onceflow.config import CommonSettings
from onceflow.kafka.records import offset_of, partition_of
from onceflow.state.store import StoreDiverged, StoreT
from onceflow.state.stores import Changelog, PartitionStores
from onceflow.topology import Hop, Topic, job_topic
from onceflow.txn.batch import Batch, Stage
from onceflow.txn.producer import TransactionalProducer
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage
from onceflow.v1.envelope_pb2 import DeadLetter

__all__ = ["Produced", "Record", "StageDriver", "Transaction"]

M = TypeVar("M", bound=ProtoMessage)

# (topic, partition): where a record is, and what an input position is of.
TopicAndPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Record:
    """One input record as the consumer hands it to a stage.

    ``offset`` None: the next of its partition, so records sent again after an abort get the
    offsets they had (the consumer seeks back). ``timestamp_ms`` None: no timestamp.
    ``log_append_time``: stamped by the broker (ingest.records and acker.acks are), not by its
    writer, which is what the gate's horizon and the acker's deadlines go by. ``topic`` None:
    the driver's input topic."""

    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    offset: int | None = None
    timestamp_ms: int | None = None
    log_append_time: bool = False
    headers: list[tuple[str, bytes]] | None = None
    topic: str | None = None

    @classmethod
    def of(cls, message: ProtoMessage, key: bytes | None = None, **fields: Any) -> Record:
        """A protobuf value (an Envelope, AckerBatch, TreeEvent, PartialAggregate), serialized
        as the codec does (deterministically)."""
        return replace(cls(message.SerializeToString(deterministic=True), key), **fields)


@dataclass(frozen=True, slots=True)
class Produced:
    """A record a transaction wrote. The driver has no partitioner: a record produced without a
    partition lands in partition 0 of its topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


class _Writes:
    """What one transaction produces, in order. It stands in for the transactional producer
    only where the real spout code (``spout.produce_new_records``) writes new roots and their
    INITs, so an INIT names the offset its record landed at, as on a broker."""

    def __init__(self, ends: Mapping[TopicAndPartition, int]) -> None:
        self._ends = dict(ends)
        self.records: list[Produced] = []
        self._reports: list[tuple[Callable[[object, Message], None], Message]] = []

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: Callable[[object, Message], None] | None = None,
    ) -> None:
        at = (topic, 0 if partition is None else partition)
        offset = self._ends.get(at, 0)
        self._ends[at] = offset + 1
        self.records.append(Produced(topic, at[1], offset, key, value, headers))
        if on_delivery is not None:
            self._reports.append((on_delivery, Message(topic=topic, partition=at[1], offset=offset, key=key, value=value)))

    def flush(self) -> None:
        reports, self._reports = self._reports, []
        for callback, message in reports:
            callback(None, message)

    @staticmethod
    def abortable(reason: str) -> Exception:
        return RuntimeError(reason)


class _ReplayedStores(PartitionStores[StoreT]):
    """The hop's real stores (assignment, catch-up, repair after a divergence, revocation), with
    the one step that reads a broker, the restore, reading the driver's changelog instead."""

    def __init__(self, changelog: Changelog[StoreT], records: Callable[[int], Sequence[Produced]]) -> None:
        # Never used for Kafka: a short restore timeout makes a base class that stopped calling
        # _restore fail fast here rather than wait a minute for a broker.
        super().__init__(CommonSettings.model_construct(), changelog.topic, changelog.store_factory, restore_timeout_s=1.0)
        self._records = records

    def _restore(self, targets: list[int]) -> int:
        applied = 0
        for partition in targets:
            store = self[partition]
            unread = self._records(partition)[store.checkpoint or 0 :]
            if not unread:
                continue
            changes: dict[bytes, bytes | None] = {}
            for record in unread:  # later records win, as in order
                if record.key is None:
                    raise ValueError(f"changelog record {record.topic}[{partition}]@{record.offset} without a key")
                changes[record.key] = record.value
            store.apply(changes, checkpoint=unread[-1].offset + 1)
            applied += len(unread)
        self.restored_records += applied
        return applied


@dataclass
class Transaction(Generic[StoreT]):
    """One batch as the driver ran it: its input, and everything its transaction wrote (or
    would have written, when it was aborted) in the order the loop produces it: new roots and
    their INITs, the outputs, dead letters and acker batches, then the changelog."""

    batch: Batch[StoreT]
    records: list[Message]
    written: list[Produced]
    committed: bool
    dlq_topic: str
    acks_topic: str

    def topic(self, name: str) -> list[Produced]:
        return [record for record in self.written if record.topic == name]

    def values(self, name: str) -> list[bytes | None]:
        return [record.value for record in self.topic(name)]

    def decode(self, name: str, kind: type[M]) -> list[M]:
        """The values written to ``name``, as protobuf messages of ``kind``."""
        return [kind.FromString(record.value or b"") for record in self.topic(name)]

    def dead_letters(self, topic: str | None = None) -> list[DeadLetter]:
        """The letters to the stage's DLQ (or to ``topic``: compute.late), each with its reason."""
        return self.decode(topic or self.dlq_topic, DeadLetter)

    @property
    def acks(self) -> list[AckerMessage]:
        """Every acker message of the transaction (ACK, FAIL, GROUP, and the INITs of new roots)."""
        return [message for batch in self.decode(self.acks_topic, AckerBatch) for message in batch.messages]

    @property
    def changes(self) -> dict[int, dict[bytes, bytes | None]]:
        """The state changes per input partition (None: deleted), as the changelog gets them."""
        return {partition: dict(overlay.changes) for partition, overlay in self.batch.overlays.items() if overlay.changes}

    @property
    def offsets(self) -> dict[TopicAndPartition, int]:
        """The input positions the transaction commits (or would have, if aborted): each
        partition's next offset."""
        positions: dict[TopicAndPartition, int] = {}
        for record in self.records:
            at = (record.topic() or "", partition_of(record))
            positions[at] = max(positions.get(at, 0), offset_of(record) + 1)
        return positions


class StageDriver(Generic[StoreT]):
    """Runs ``stage`` over in-memory records, one transaction per call, owning ``partitions`` of
    its input (restored and handed to ``on_assign`` at once). With a ``changelog``, each owned
    partition gets the store its factory makes, restored from the changelog on assignment."""

    def __init__(
        self,
        stage: Stage[StoreT],
        *,
        input_topic: str,
        dlq_topic: str,
        changelog: Changelog[StoreT] | None = None,
        acks_topic: str = Topic.ACKER_ACKS.value,
        ack_partitions: int = 1,
        partitions: Iterable[int] = (0,),
    ) -> None:
        self.stage = stage
        self.input_topic = input_topic
        self.dlq_topic = dlq_topic
        self.acks_topic = acks_topic
        self.ack_partitions = ack_partitions
        self.changelog_topic = changelog.topic if changelog is not None else None
        # The committed records of every topic partition: the driver's broker.
        self._topics: dict[TopicAndPartition, list[Produced]] = {}
        self._committed: dict[TopicAndPartition, int] = {}  # input positions committed
        self._position: dict[TopicAndPartition, int] = {}  # the consumer's, ahead of them within a batch
        self.stores: PartitionStores[StoreT] | None = (
            None if changelog is None else _ReplayedStores(changelog, lambda partition: self.changelog(partition))
        )
        # The stage's optional hooks (txn.batch.Stage), as the loop finds them.
        self._punctuate: Callable[[Batch[StoreT]], None] | None = getattr(stage, "punctuate", None)
        self._on_assign: Callable[[list[int], Mapping[int, StoreT]], None] | None = getattr(stage, "on_assign", None)
        self._on_revoke: Callable[[list[int]], None] | None = getattr(stage, "on_revoke", None)
        self._on_rollback: Callable[[], None] | None = getattr(stage, "on_rollback", None)
        self.owned: list[int] = []
        self.assign(partitions)

    @classmethod
    def for_hop(
        cls,
        hop: Hop,
        stage: Stage[StoreT],
        *,
        job: str = "",
        input_topic: str | None = None,
        store: Callable[[int], StoreT] | None = None,
        ack_partitions: int = 1,
        partitions: Iterable[int] = (0,),
    ) -> StageDriver[StoreT]:
        """The hop's input, DLQ and changelog as ``onceflow.topology`` names them (unprefixed),
        for ``job`` where the hop is a job's. ``input_topic`` names what a spout reads;
        ``store``: each owned partition's store (none: the hop keeps no state, as the map hop of
        a job without event time)."""
        if input_topic is None:
            if hop.input is None:
                raise ValueError(f"{hop.name} is a spout: name the topic it reads (input_topic)")
            input_topic = job_topic(hop.input, job)
        if store is not None and hop.changelog is None:
            raise ValueError(f"{hop.name} declares no changelog, so it has no store")
        changelog = None if store is None or hop.changelog is None else Changelog(job_topic(hop.changelog, job), store)
        return cls(
            stage, input_topic=input_topic, dlq_topic=job_topic(hop.dlq, job), changelog=changelog,
            ack_partitions=ack_partitions, partitions=partitions,
        )

    # -- transactions ----------------------------------------------------------------------

    def process(
        self,
        records: Iterable[Record | Message | bytes] = (),
        *,
        punctuate: bool = False,
        now_ms: int | None = None,
        caught_up: Iterable[int] | None = None,
        abort: bool = False,
    ) -> Transaction[StoreT]:
        """One batch in one transaction: the stage processes ``records`` (then ``punctuate``s,
        if asked, as the loop does when a punctuation is due), and the transaction commits, or
        with ``abort`` is aborted after the stage is done. ``now_ms`` fixes the batch's clock;
        ``caught_up``: the partitions read to their end, as a punctuation sees them (unset:
        all). A stage that raises abandons the batch as the loop does (after rebuilding a store
        that diverged) and the error is raised here, after the rollback."""
        messages = [self._consumed(record) for record in records]
        batch: Batch[StoreT] = Batch(
            messages, self.stores, self.dlq_topic, self.stage.name, self.acks_topic, self.ack_partitions
        )
        if now_ms is not None:
            batch.now_ms = now_ms
        try:
            if messages:
                self.stage.process(batch)
            if punctuate:
                if self._punctuate is None:
                    raise TypeError(f"stage {self.stage.name} has no punctuate")
                if caught_up is not None:
                    batch.caught_up = frozenset(caught_up)
                self._punctuate(batch)
            batch.seal()
        except StoreDiverged as exc:
            assert self.stores is not None  # only a store raises it
            self.stores.repair(exc)
            self._roll_back()
            raise
        except Exception:
            self._roll_back()
            raise
        writes, checkpoints = self._write(batch)
        transaction = Transaction(batch, messages, writes.records, not abort, self.dlq_topic, self.acks_topic)
        if abort:
            self._roll_back()
            return transaction
        for record in writes.records:
            self._topics.setdefault((record.topic, record.partition), []).append(record)
        self._committed.update(transaction.offsets)
        if self.stores is not None:
            for partition, overlay in batch.overlays.items():
                self.stores.apply_committed(partition, overlay.changes, checkpoints.get(partition))
        for callback in batch.after_commit:
            callback()
        return transaction

    def punctuate(self, *, now_ms: int | None = None, caught_up: Iterable[int] | None = None, abort: bool = False) -> Transaction[StoreT]:
        """A punctuation with no records (timeouts, sweeps, GC) in a transaction of its own."""
        return self.process(punctuate=True, now_ms=now_ms, caught_up=caught_up, abort=abort)

    def _consumed(self, record: Record | Message | bytes) -> Message:
        """The record as the consumer hands it over, at its offset; the consumer's position
        moves past it."""
        if isinstance(record, bytes):
            record = Record(record)
        if isinstance(record, Message):
            at = (record.topic() or "", partition_of(record))
            offset = offset_of(record)
        else:
            at = (record.topic or self.input_topic, record.partition)
            offset = self._position.get(at, 0) if record.offset is None else record.offset
        if at[1] not in self.owned:
            raise ValueError(f"a record of {at[0]}[{at[1]}], a partition this driver does not own (owned: {self.owned})")
        self._position[at] = max(self._position.get(at, 0), offset + 1)
        if isinstance(record, Message):
            return record
        if record.timestamp_ms is None:
            timestamp = (TIMESTAMP_NOT_AVAILABLE, -1)
        else:
            kind = TIMESTAMP_LOG_APPEND_TIME if record.log_append_time else TIMESTAMP_CREATE_TIME
            timestamp = (kind, record.timestamp_ms)
        headers: list[tuple[str, str | bytes | None]] | None = None if record.headers is None else list(record.headers)
        return Message(
            topic=at[0], partition=at[1], offset=offset, key=record.key, value=record.value, headers=headers,
            timestamp=timestamp,
        )

    def _write(self, batch: Batch[StoreT]) -> tuple[_Writes, dict[int, int]]:
        """The transaction's records, in the loop's order, and each store's next checkpoint
        (the offset after its partition's last changelog record)."""
        writes = _Writes({at: len(records) for at, records in self._topics.items()})
        # A spout's records, each run of one topic and timeout as ingest writes them.
        for (topic, timeout_ms), run in groupby(batch.new_roots, key=lambda root: (root.topic, root.tree_timeout_ms)):
            inits = None if timeout_ms is None else spout.Inits(self.acks_topic, self.ack_partitions, timeout_ms)
            spout.produce_new_records(cast(TransactionalProducer, writes), topic, [root.record for root in run], inits)
        for output in batch.outputs:
            writes.produce(output.topic, output.value, output.key, output.partition, output.headers)
        checkpoints: dict[int, int] = {}
        if self.changelog_topic is not None:
            for partition, overlay in batch.overlays.items():
                for key, value in overlay.changes.items():
                    writes.produce(self.changelog_topic, value, key, partition)
                    checkpoints[partition] = writes.records[-1].offset + 1
        writes.flush()
        return writes, checkpoints

    def _roll_back(self) -> None:
        """What the loop does with an abandoned batch: the consumer seeks back to the committed
        offsets, the stores catch up with the changelog, the stage reloads what it caches."""
        self._position = dict(self._committed)
        if self.stores is not None:
            self.stores.catch_up()
        if self._on_rollback is not None:
            self._on_rollback()

    # -- ownership and state -----------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        """Take partitions: their stores are opened and restored from the changelog, then the
        stage's ``on_assign`` sees them."""
        added = [p for p in partitions if p not in self.owned]
        self.owned = sorted([*self.owned, *added])
        stores: dict[int, StoreT] = {}
        if self.stores is not None:
            self.stores.assign(added)
            stores = {partition: self.stores[partition] for partition in added}
        if self._on_assign is not None:
            self._on_assign(added, stores)

    def revoke(self, partitions: Iterable[int]) -> None:
        """Give partitions up: their stores are closed and dropped, then ``on_revoke``."""
        gone = [p for p in partitions if p in self.owned]
        self.owned = [p for p in self.owned if p not in gone]
        if self.stores is not None:
            self.stores.revoke(gone)
        if self._on_revoke is not None:
            self._on_revoke(gone)

    def restore(self, partitions: Iterable[int] | None = None) -> None:
        """A new owner of ``partitions`` (all owned ones by default): their stores are dropped
        and new ones restored from the changelog this driver's transactions committed, as after
        a crash or a rebalance. The consumer resumes at the committed offsets."""
        moved = list(self.owned if partitions is None else partitions)
        self.revoke(moved)
        self._position = dict(self._committed)
        self.assign(moved)

    def store(self, partition: int) -> StoreT:
        if self.stores is None:
            raise RuntimeError(f"stage {self.stage.name} was given no changelog, so it has no store")
        return self.stores[partition]

    def table(self, partition: int = 0) -> dict[bytes, bytes]:
        """A partition's committed state, as its store holds it."""
        return dict(self.store(partition).items())

    def changelog(self, partition: int = 0) -> list[Produced]:
        """The changelog records committed for an input partition, in order."""
        if self.changelog_topic is None:
            return []
        return list(self._topics.get((self.changelog_topic, partition), []))

    def topic(self, name: str, partition: int | None = None) -> list[Produced]:
        """The records committed to a topic (every partition, or one), in commit order."""
        return [
            record
            for (topic, at), records in self._topics.items()
            if topic == name and (partition is None or at == partition)
            for record in records
        ]

    @property
    def committed_offsets(self) -> dict[TopicAndPartition, int]:
        """The input positions committed so far: each partition's next offset."""
        return dict(self._committed)
