"""What a stage sees of one transaction: its input records, the outputs it emits and the state
it writes. A stage never talks to Kafka; the loop turns all of this into one transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol

from confluent_kafka import Message

from onceflow import acks
from onceflow.codec import now_ms
from onceflow.spout import NewRecord
from onceflow.state.overlay import StateTransaction
from onceflow.state.store import StoreT
from onceflow.state.stores import PartitionStores
from onceflow.txn.letter_log import LETTERS
from onceflow.v1.acker_pb2 import Anchor, RecordRef
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Output:
    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: list[tuple[str, bytes]] | None = None


@dataclass(slots=True)
class NewRoot:
    """A record that starts a tree (``Batch.emit_new``); ``tree_timeout_ms`` None: acking off."""

    topic: str
    record: NewRecord
    tree_timeout_ms: int | None


@dataclass(slots=True)
class Savepoint:
    outputs: int
    acks: int
    new_roots: int
    anchors: int
    state: dict[int, int] = field(default_factory=dict)


class Batch(Generic[StoreT]):
    """Generic in the hop's store type: ``state(p).store`` is the stage's own store."""

    def __init__(
        self,
        records: list[Message],
        stores: PartitionStores[StoreT] | None,
        dlq_topic: str,
        stage: str,
        acks_topic: str = "",
        ack_partitions: int = 1,
    ) -> None:
        self.records = records
        self.now_ms = now_ms()
        # The compute job whose records these are, when a stage serves one (its letters name it).
        self.job = ""
        LETTERS.flush_if_due()
        self._acks_topic = acks_topic
        self._acks = acks.AckBuffer(ack_partitions)
        self._anchoring = acks.Anchoring(ack_partitions, stage)
        self._foreign_roots: set[int] = set()  # pass_over
        self.outputs: list[Output] = []
        self.new_roots: list[NewRoot] = []
        self.dead_letters = 0
        # Run by the loop once this batch's transaction has committed (and never otherwise).
        self.after_commit: list[Callable[[], None]] = []
        self._stores = stores
        self._overlays: dict[int, StateTransaction[StoreT]] = {}
        self._dlq_topic = dlq_topic
        self._stage = stage
        self._caught_up: frozenset[int] | None = None

    def emit(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.outputs.append(Output(topic, value, key, partition, headers))

    def state(self, partition: int) -> StateTransaction[StoreT]:
        """The transactional view of the store of an input partition this worker owns."""
        if self._stores is None:
            raise RuntimeError(f"stage {self._stage} declared no changelog, so it has no state")
        overlay = self._overlays.get(partition)
        if overlay is None:
            overlay = self._overlays[partition] = StateTransaction(self._stores[partition])
        return overlay

    @property
    def overlays(self) -> dict[int, StateTransaction[StoreT]]:
        return self._overlays

    @property
    def owned_partitions(self) -> list[int]:
        return [] if self._stores is None else self._stores.partitions

    @property
    def caught_up(self) -> frozenset[int]:
        """The owned input partitions this worker has read to the end of, as far as its
        consumer knows (the loop sets it for a punctuation; unset: all of them). A sweep may
        judge a lagging partition by how far it was read rather than by the clock."""
        return frozenset(self.owned_partitions) if self._caught_up is None else self._caught_up

    @caught_up.setter
    def caught_up(self, partitions: frozenset[int]) -> None:
        self._caught_up = partitions

    @property
    def has_writes(self) -> bool:
        written = self.outputs or self.new_roots or self._acks or self._anchoring.has_members
        return bool(written) or any(o.changes for o in self._overlays.values())

    def pass_over(self, envelope: Envelope) -> None:
        """This stage reads ``envelope`` but is no part of its tree (a job that started reading
        its stream after it passed the gate: docs/decisions/0028): no ack of it, and no anchor
        of its root, is ever sent from this transaction."""
        self._foreign_roots.add(envelope.root_id)

    def ack(self, envelope: Envelope, children: Iterable[int] = ()) -> None:
        """Tell the acker this stage processed ``envelope`` and emitted ``children`` (edge ids)."""
        if envelope.root_id in self._foreign_roots:
            return
        xor_value = envelope.edge_id
        for child in children:
            xor_value ^= child
        self._acks.add_ack(envelope.root_id, xor_value, self._stage, now_ms())

    def anchor_roots(self, envelopes: Iterable[Envelope]) -> None:
        """These inputs' trees continue in the outputs anchored by ``anchor``, or end with this
        transaction if it anchors none (``acks.Anchoring``): in place of ``ack`` for each."""
        self._anchoring.roots(e for e in envelopes if e.root_id not in self._foreign_roots)

    def consumed(self, anchor: Anchor) -> None:
        """An anchored input was consumed (processed or dead-lettered): its edge is acked, and
        the outputs anchored by ``anchor`` continue its group."""
        self._anchoring.consumed(anchor)

    def anchor(self) -> Anchor | None:
        """The anchor an output carries so that the trees behind this transaction end only
        once it is consumed; None when nothing read here is tracked."""
        return self._anchoring.anchor()

    def fail(self, envelope: Envelope, reason: str) -> None:
        """End ``envelope``'s tree as FAILED: the stage forwards nothing of it, so ingest may
        tell a waiting caller it took no effect (ABORTED). A record that may have effects
        elsewhere is dead-lettered instead."""
        self._acks.add(acks.fail(envelope.root_id, self._stage, reason))

    def init_tree(self, root_id: int, edges: Iterable[int], origin: RecordRef, attempt: int, timeout_ms: int) -> None:
        """Start a tree (the spout's INIT): only ingest and its replayer do this."""
        self._acks.add(acks.init(root_id, edges, origin, attempt, timeout_ms))

    def emit_new(self, topic: str, record: NewRecord, tree_timeout_ms: int | None) -> None:
        """A spout's record (the Kafka source's): written as ingest writes it, with its INIT
        naming where it landed when ``tree_timeout_ms`` is set (``onceflow.spout``)."""
        self.new_roots.append(NewRoot(topic, record, tree_timeout_ms))

    def seal(self) -> None:
        """Turn the buffered acker messages into one AckerBatch output per acker.acks
        partition. The loop calls this once the stage is done with the batch."""
        self._anchoring.seal(self._acks)
        for partition, value in self._acks.seal():
            self.emit(self._acks_topic, value, partition=partition)

    def savepoint(self) -> Savepoint:
        state = {p: o.savepoint() for p, o in self._overlays.items()}
        return Savepoint(len(self.outputs), len(self._acks), len(self.new_roots), len(self._anchoring), state)

    def rollback_to(self, savepoint: Savepoint) -> None:
        del self.outputs[savepoint.outputs :]
        del self.new_roots[savepoint.new_roots :]
        self._acks.truncate(savepoint.acks)
        self._anchoring.truncate(savepoint.anchors)
        for partition, overlay in self._overlays.items():
            overlay.rollback_to(savepoint.state.get(partition, 0))

    def dead_letter(
        self, record: Message, error: BaseException | str, original: bytes | None = None, topic: str | None = None
    ) -> None:
        """Send a poison record to the stage's DLQ, in this transaction, with the reason.
        ``original`` narrows it to the bad part of a record that carries several items;
        ``topic`` sends the letter elsewhere (a late record to ``compute.late``), uncounted."""
        error_class = type(error).__name__ if isinstance(error, BaseException) else "Rejected"
        letter = DeadLetter(
            stage=self._stage,
            error_class=error_class,
            message=str(error),
            original=record.value() or b"" if original is None else original,
            source_topic=record.topic() or "",
            source_partition=record.partition() or 0,
            source_offset=record.offset() or 0,
            failed_at_ms=now_ms(),
            job=self.job,
        )
        where = f"{record.topic()}[{record.partition()}]@{record.offset()}"
        if topic is None:
            LETTERS.note(self._stage, error_class, letter.message, where)
        else:  # late records are expected in event-time jobs: counted, not warned about
            log.debug("dead letter from %s: %s: %s", where, error_class, error)
        self.emit(topic or self._dlq_topic, letter.SerializeToString(), key=record.key())
        if topic is None:
            self.dead_letters += 1


class Stage(Protocol[StoreT]):
    """The pure part of a service: turns a batch of input records into outputs and state.
    Generic in its hop's store type (a stateless stage may say `KeyValueStore`).

    A stage may also define (the loop calls those it has, never with a transaction open but
    for ``punctuate``):

    - ``punctuate(batch: Batch[StoreT])``: every ``ONCEFLOW_LOOP_PUNCTUATE_MS`` of processing
      time, inside a transaction, even when no records arrived (timeouts, sweeps);
    - ``on_assign(partitions: list[int], stores: Mapping[int, StoreT])``: from the rebalance
      callback, with the newly owned partitions and their stores, restored from the changelog
      (empty for a hop without one). A store stays its partition's until ``on_revoke``, also
      through a rebuild, so a stage may keep it;
    - ``on_revoke(partitions: list[int])``: after the loop dropped the partitions' stores;
    - ``on_rollback()``: after a batch was abandoned (aborted, or the stage failed), once the
      stores hold only committed state again, so a stage that caches state in memory reloads it.
    """

    name: str

    def process(self, batch: Batch[StoreT]) -> None: ...


class RecordStage(Generic[StoreT]):
    """A stage that handles records one at a time. A record that raises is rolled back alone
    and goes to the DLQ; the rest of the batch commits."""

    name = "stage"

    def process(self, batch: Batch[StoreT]) -> None:
        for record in batch.records:
            savepoint = batch.savepoint()
            try:
                self.process_record(record, batch)
            except Exception as exc:  # noqa: BLE001 - one bad record must not stop the stream
                batch.rollback_to(savepoint)
                batch.dead_letter(record, exc)

    def process_record(self, record: Message, batch: Batch[StoreT]) -> None:
        raise NotImplementedError
