"""The sink's loop: compute.results (read_committed) -> a result store (Redis or PostgreSQL:
``onceflow.state.result_store``), exactly once per change. Redis is named below; PostgreSQL
answers the same contract.

Per partition batch:
1. poison records (undecodable, no job or key, unknown op) past the partition's DLQ mark go to
   sink.dlq in a Kafka transaction that also commits the batch's consumer offset, so a letter
   is written exactly once (after a crash, offsets below the committed one already have theirs);
2. the valid changes go to Redis in one fenced, offset-checked script call (``tables.py``);
3. the applied changes' anchors are acked in a second transaction: a tree completes once every
   change it contributed to is in Redis (docs/decisions/0016). An ack lost to a crash here is
   safe: the tree times out, ingest replays the record, and the dedup gate drops the copy.

A change of a retired job version (``orders@1``: ``aliases.py`` follows the registry) is not
applied, but its anchor is acked as if it were: the trees behind it end here all the same, and
its table is gone. A rebuild skips them too: it goes through the same batch code.

On assignment the partition's position comes from Redis (last applied offset + 1); Kafka's
committed offset only says which letters were already written.

Redis is a checked cache of compute.results. Each apply states the offset this owner last
applied, and about once a second an idle partition is checked the same way. When Redis holds
anything else (it lost or rolled back writes) the partition is rebuilt: a newer token, no
offset, and a replay of compute.results from its start, which rewrites exactly that
partition's rows. Redis down or refusing writes (MISCONF) makes the sink NOT_SERVING until it
answers again; nothing is skipped meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from prometheus_client import Counter

from onceflow import acks, faults, metrics, topology
from onceflow.codec import now_ms
from onceflow.config import CommonSettings, LoopSettings
from onceflow.kafka.records import offset_of, partition_of
from onceflow.state.store import StoreUnavailable
from onceflow.txn.commit import commit
from onceflow.txn.driver import ConsumerDriver, LoopStats
from onceflow.txn.errors import FencedError
from onceflow.txn.letter_log import LETTERS
from onceflow.txn.offsets import committed_offsets
from onceflow.txn.producer import TxnOutcome
from onceflow.v1.acker_pb2 import Anchor
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow.v1.results_pb2 import ResultChange

from onceflow.state.fencing import Outcome
from onceflow.state.result_store import Answer, Change, ResultStore

log = logging.getLogger(__name__)

_OPS = {ResultChange.UPSERT: "+", ResultChange.RETRACT: "-"}

RETIRED_CHANGES = Counter(
    "onceflow_sink_retired_changes_total", "Result changes of retired job versions, skipped (their anchors acked)"
)


@dataclass
class Ownership:
    token: int
    applied: int  # last offset applied to Redis, -1 for none
    letters_done: int  # offsets below this already have their dead letters
    # A rebuild replays offsets up to here: their acks were sent before.
    replay_until: int = -1
    rebuild_started: float = 0.0


@dataclass
class SinkStats(LoopStats):
    """The driver's counters (records_out: changes applied to Redis) and the sink's own."""

    acks_lost: int = 0
    store_repairs: int = 0
    retired_changes: int = 0  # changes of retired versions, skipped
    last_repair: str = ""


class SinkWorker(ConsumerDriver):
    """The driver with external offsets: a batch's effects and its offset go to Redis in one
    fenced script call; dead letters and acks go to Kafka in transactions of their own."""

    def __init__(
        self, common: CommonSettings, loop: LoopSettings, tables: ResultStore, instance: str,
        acking: bool, retired: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        """The sink hop as `topology.SINK` declares it, as ``instance``. ``retired``: the names
        of the job versions whose changes are skipped (``orders@1``)."""
        self.stats: SinkStats
        hop, prefix = topology.SINK, common.topic_prefix
        assert hop.input is not None
        super().__init__(
            name="sink", common=common, settings=loop, input_topic=common.topic(hop.input),
            group_id=hop.group_id(prefix), transactional_id=hop.transactional_id(prefix, instance), stats=SinkStats(),
        )
        self._tables = tables
        self._acking = acking
        self._retired = retired
        self.topic = self.input_topic
        self.dlq_topic = common.topic(hop.dlq)
        self.owned: dict[int, Ownership] = {}
        self._next_audit = 0.0

    # -- the driver's hooks ----------------------------------------------------------------

    def housekeeping(self) -> None:
        self._guarded(self._audit)

    def handle(self, records: list[Message]) -> None:
        batches: dict[int, list[Message]] = defaultdict(list)
        for record in records:
            batches[partition_of(record)].append(record)

        def apply() -> None:
            for partition, batch in batches.items():
                if partition in self.owned:  # not revoked by a rebalance during this poll
                    self._apply_batch(partition, batch)

        self._guarded(apply)

    def _guarded(self, operation: Callable[[], None]) -> None:
        try:
            operation()
        except StoreUnavailable as exc:
            self._store_unavailable(exc)
            return
        self.store_available()

    @property
    def store_restarts_seen(self) -> int:
        return self._tables.restarts_seen

    def _store_unavailable(self, exc: StoreUnavailable) -> None:
        """Back off, unhealthy, and take every partition again from what Redis last confirmed:
        whether the failed write landed is for the continuity check to say."""
        backoff = self.store_unavailable(exc)
        for partition in list(self.owned):
            self._rewind(partition)
        self.stopping.wait(backoff)

    def _audit(self) -> None:
        """About once a second, each owned partition: does Redis still hold what was applied?
        (It can go back in time with no record arriving to notice.)"""
        now = time.monotonic()
        if now < self._next_audit:
            return
        self._next_audit = now + 1.0
        self._tables.watch_identity()
        for partition, own in list(self.owned.items()):
            answer = self._tables.apply(partition, own.token, own.applied, None, ())
            self._check_answer(partition, answer, own.applied)

    def _check_answer(self, partition: int, answer: Answer, wanted: int) -> bool:
        """True if Redis holds ``wanted`` for this owner; else rebuild (or fence) and False."""
        own = self.owned[partition]
        if answer.outcome is Outcome.FENCED:
            raise FencedError(
                f"partition {partition}: {self._tables.name} refused the write, token {own.token} is stale "
                f"(newest {answer.newest_token}): another sink instance owns this partition now"
            )
        if answer.outcome is not Outcome.DIVERGED:
            return True
        if answer.newest_token == own.token and answer.stored == wanted:
            return True  # this very write landed before: its reply was lost and the client retried
        self._rebuild(
            partition,
            f"{self._tables.name} holds token {answer.newest_token}, offset {answer.stored}; "
            f"this owner wrote token {own.token}, offset {own.applied}",
        )
        return False

    def _rebuild(self, partition: int, reason: str) -> None:
        own = self.owned[partition]
        answer = self._tables.retake(partition, own.token)
        if answer.outcome is Outcome.FENCED:
            raise FencedError(f"partition {partition}: a newer sink instance owns it (token {answer.newest_token})")
        self._note(
            f"partition {partition} diverged ({reason}); replaying compute.results from its start to rebuild its rows"
        )
        own.replay_until = max(own.replay_until, own.applied)
        own.token, own.applied, own.rebuild_started = answer.newest_token, -1, time.monotonic()
        self.stats.store_repairs += 1
        self.stats.last_repair = f"partition {partition}: {reason}"
        metrics.STORE_REPAIRS.labels("sink").inc()
        self._rewind(partition)

    # -- one partition's batch ---------------------------------------------------------------

    def _apply_batch(self, partition: int, records: list[Message]) -> None:
        own = self.owned[partition]
        records = [r for r in records if offset_of(r) > own.applied]
        if not records:
            return
        started = time.monotonic()
        last = offset_of(records[-1])
        changes: list[Change] = []
        letters: list[tuple[Message, str]] = []
        anchors: list[Anchor] = []
        retired, skipped = self._retired(), 0
        for record in records:
            try:
                change = _decode(record.value())
            except ValueError as exc:
                if offset_of(record) >= own.letters_done:
                    letters.append((record, str(exc)))
                continue
            if change.job in retired:
                skipped += 1  # its table is gone; its anchor is acked below all the same
            else:
                applied = Change(_OPS[change.op], change.job, change.key, change.value, change.fingerprint)
                refusal = self._tables.refusal(applied)
                if refusal:  # the store cannot hold it (a key too long for its index): a letter, not a crash loop
                    if offset_of(record) >= own.letters_done:
                        letters.append((record, f"{self._tables.name} cannot hold this change: {refusal}"))
                else:
                    changes.append(applied)
            if change.HasField("anchor") and offset_of(record) > own.replay_until:
                anchors.append(change.anchor)
        if letters and not self._write_letters(partition, letters, last):
            return
        faults.point("before_apply")
        answer = self._tables.apply(partition, own.token, own.applied, last, changes)
        if not self._check_answer(partition, answer, last):
            return
        own.applied = last
        self.stats.records_out += len(changes)
        self.stats.retired_changes += skipped
        RETIRED_CHANGES.inc(skipped)
        self.stats.records_in += len(records)
        metrics.RECORDS_OUT.labels("sink").inc(len(changes))
        if own.rebuild_started and last >= own.replay_until:
            log.warning(
                "sink: partition %d rebuilt through offset %d in %.2fs",
                partition, last, time.monotonic() - own.rebuild_started,
            )
            own.rebuild_started = 0.0
        metrics.RECORDS_IN.labels("sink").inc(len(records))
        metrics.BATCH_RECORDS.labels("sink").observe(len(records))
        elapsed = time.monotonic() - started
        self.stats.batch_seconds.append(elapsed)
        metrics.COMMIT_SECONDS.labels("sink").observe(elapsed)
        faults.point("after_apply")
        if anchors and self._acking and not faults.sabotaged("sink_drops_acks"):
            self._send_acks(partition, anchors, last)

    def _write_letters(self, partition: int, letters: list[tuple[Message, str]], last: int) -> bool:
        """Dead letters and the batch's consumer offset in one transaction. False: not written
        (the partition is rewound to retry the batch)."""
        producer = self.producer

        def write() -> None:
            for record, reason in letters:
                letter = DeadLetter(
                    stage="sink", error_class="InvalidResultChange", message=reason, original=record.value() or b"",
                    source_topic=record.topic() or "", source_partition=partition, source_offset=record.offset(),
                    failed_at_ms=now_ms(),
                )
                producer.produce(self.dlq_topic, letter.SerializeToString(), key=record.key())

        result = commit("sink", producer, self.stats, write, positions=lambda: self._send_position(partition, last))
        if not result.committed:
            unknown = result.outcome is TxnOutcome.UNKNOWN
            self._note(f"dead letters: {'outcome unknown, producer recreated' if unknown else 'transaction aborted'} ({result.error})")
            self._rewind(partition, refresh_letters=unknown)
            return False
        faults.point("after_dead_letters")
        for record, reason in letters:
            LETTERS.note("sink", "InvalidResultChange", reason, f"{record.topic()}[{partition}]@{record.offset()}")
        self.owned[partition].letters_done = last + 1
        self.stats.dead_letters += len(letters)
        metrics.DEAD_LETTERS.labels("sink").inc(len(letters))
        return True

    def _send_acks(self, partition: int, anchors: list[Anchor], last: int) -> None:
        producer = self.producer
        buffer = acks.AckBuffer(self.ack_partitions)
        anchoring = acks.Anchoring(self.ack_partitions, "sink")
        for anchor in anchors:
            try:
                anchoring.consumed(anchor)
            except ValueError as exc:
                # The change is applied; its trees time out and their replays are settled.
                log.warning("sink: partition %d: an anchor is ignored: %s", partition, exc)
        anchoring.seal(buffer)  # no outputs: the groups' edges acked, nothing continues
        sealed = buffer.seal()
        if not sealed:
            return

        def write() -> None:
            for ack_partition, value in sealed:
                producer.produce(self.acks_topic, value, partition=ack_partition)

        result = commit("sink", producer, self.stats, write, positions=lambda: self._send_position(partition, last))
        if not result.committed:
            # Safe to lose (module docstring): the trees time out and the gate drops the replays.
            self.stats.acks_lost += len(anchors)
            self._note(f"acks not sent ({result.error}); their trees will time out and be replayed")

    def _send_position(self, partition: int, last: int) -> None:
        """Inside the transaction: the partition's consumer offset past ``last`` commits with it."""
        self.intake.send(self.producer, self.consumer, [TopicPartition(self.topic, partition, last + 1)])

    def _note(self, message: str) -> None:
        self.stats.last_error = message
        log.warning("sink: %s", message)

    def _rewind(self, partition: int, refresh_letters: bool = False) -> None:
        consumer = self.consumer
        own = self.owned[partition]
        if refresh_letters:
            committed = committed_offsets(consumer, [TopicPartition(self.topic, partition)], self.stopping)
            if committed is None:
                return  # stopping
            own.letters_done = max(own.letters_done, committed[0].offset)
        consumer.seek(TopicPartition(self.topic, partition, own.applied + 1 if own.applied >= 0 else OFFSET_BEGINNING))

    # -- rebalance (inside poll, between batches) ------------------------------------------

    def assigning(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = committed_offsets(consumer, partitions, self.stopping) if partitions else []
        if committed is None:
            return  # stopping
        for tp, kafka in zip(partitions, committed, strict=True):
            token, applied = self._take_ownership(tp.partition)
            self.owned[tp.partition] = Ownership(token, applied, letters_done=max(kafka.offset, 0))
            # Redis says what was applied; Kafka's committed offset is only a hint.
            tp.offset = applied + 1 if applied >= 0 else OFFSET_BEGINNING
            log.info("sink: partition %d: token %d, resuming after offset %d", tp.partition, token, applied)

    def _take_ownership(self, partition: int) -> tuple[int, int]:
        """Retried here, inside the rebalance callback, until Redis answers: an assignment
        half taken would leave the partition unread."""
        failures = 0
        while True:
            try:
                ownership = self._tables.take_ownership(partition)
            except StoreUnavailable as exc:
                failures += 1
                self._note(f"{self._tables.name} unavailable while taking partition {partition}: {exc}")
                self.health_listener(False)
                if self.stopping.wait(self.backoff_s(failures)):
                    return -1, -1
                continue
            if failures:
                self.health_listener(True)
            return ownership

    def revoked(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.owned.pop(tp.partition, None)


def _decode(value: bytes | None) -> ResultChange:
    """A valid change or ValueError with the reason (the dead letter's message)."""
    try:
        change = ResultChange.FromString(value or b"")
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError; any failure is poison
        raise ValueError(f"not a ResultChange: {exc}") from exc
    if not change.job or not change.key:
        raise ValueError("ResultChange without job or key")
    if change.op not in _OPS:
        raise ValueError(f"ResultChange with op {change.op}: want UPSERT or RETRACT")
    return change
