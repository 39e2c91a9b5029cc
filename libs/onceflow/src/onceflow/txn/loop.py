"""The one transactional hop every stage runs (docs/architecture.md, "One transactional hop").

poll a read_committed batch -> let the stage process it (pure: outputs and state overlay are
buffered) -> begin -> produce outputs and changelog -> send_offsets_to_transaction with the
group metadata (KIP-447 fencing) -> commit -> apply the overlay to the stores.

No transaction is ever open while the consumer polls, and rebalance callbacks only run inside
poll. So when partitions are revoked there is never an open transaction to finish: the last
batch has committed or aborted by then, and revoking only drops the partitions' stores.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from onceflow import faults, metrics
from onceflow.config import CommonSettings, LoopSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import wait_partition_count
from onceflow.state.store import KeyValueStore, MemoryStore, StoreDiverged, StoreUnavailable
from onceflow.state.stores import PartitionStores
from onceflow.topology import Topic
from onceflow.txn.batch import Batch, Stage
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART, ConsumerStuck, FencedError
from onceflow.txn.membership import watch_membership
from onceflow.txn.offsets import committed_offsets
from onceflow.txn.producer import TransactionalProducer, TxnOutcome, open_producer

log = logging.getLogger(__name__)


class LoopState(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    DRAINED = "DRAINED"
    STOPPED = "STOPPED"
    FENCED = "FENCED"


@dataclass
class PartitionProgress:
    topic: str
    partition: int
    position: int
    lag: int


@dataclass
class LoopStats:
    committed: int = 0
    aborted: int = 0
    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0
    last_error: str = ""
    # Consecutive batches the stage failed on as a whole (0 = healthy).
    stage_failures: int = 0
    batch_bound: int = 0
    # Seconds from poll return to commit, of the last committed transactions (benches, Stats).
    batch_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    partitions: list[PartitionProgress] = field(default_factory=list)


class TransactionalLoop:
    def __init__(
        self,
        *,
        stage: Stage,
        common: CommonSettings,
        settings: LoopSettings,
        input_topic: str,
        group_id: str,
        transactional_id: str,
        dlq_topic: str,
        changelog_topic: str | None = None,
        store_factory: Callable[[int], KeyValueStore] = lambda _partition: MemoryStore(),
    ) -> None:
        self.stage = stage
        self._common = common
        self._settings = settings
        self.input_topic = input_topic
        self.group_id = group_id
        self.transactional_id = transactional_id
        self._dlq_topic = dlq_topic
        self.stores = (
            PartitionStores(common, changelog_topic, store_factory, service=stage.name) if changelog_topic else None
        )
        self.stats = LoopStats()
        self.state = LoopState.STARTING
        self._stop = threading.Event()
        self._pause_requested = False
        self._drain_requested = False
        self._drained = threading.Event()
        self._producer: TransactionalProducer | None = None
        self._consumer: Consumer | None = None
        self._paused_now = False
        self._last_progress = 0.0
        self._acks_topic = common.topic(Topic.ACKER_ACKS)
        self._ack_partitions = 1
        self._punctuate: Callable[[Batch], None] | None = getattr(stage, "punctuate", None)
        self._next_punctuation = 0.0
        self._next_audit = 0.0
        self._batch_bound = settings.min_batch_records or settings.max_batch_records
        self.stats.batch_bound = self._batch_bound
        # Called with False when the stage starts failing whole batches, True once one commits.
        self.health_listener: Callable[[bool], None] = lambda _healthy: None

    # -- control (any thread) --------------------------------------------------------------

    def stop(self) -> None:
        """Graceful: the current batch finishes and commits, then the loop leaves the group."""
        self._stop.set()

    def pause(self) -> None:
        self._pause_requested = True

    def resume(self) -> None:
        self._pause_requested = False
        self._drain_requested = False
        self._drained.clear()

    def drain(self, timeout_s: float) -> bool:
        """Stop taking batches; True once everything taken has committed."""
        self._drain_requested = True
        return self._drained.wait(timeout_s)

    # -- the loop (one thread) -------------------------------------------------------------

    def run(self) -> int:
        try:
            self._producer = open_producer(self._common, self.transactional_id, self._settings.commit_timeout_s, self._stop)
        except FencedError as exc:
            log.error("%s: cannot start: %s", self.stage.name, exc)
            return EXIT_FENCED
        self._ack_partitions = wait_partition_count(self._common, self._acks_topic, self._stop)
        if self._ack_partitions == 0:
            return EXIT_OK  # stopped while waiting for the broker
        self._consumer = clients.consumer(
            self._common,
            self.group_id,
            **{"session.timeout.ms": self._settings.session_timeout_ms},
            # End-of-partition events move the position past a final transaction marker, so
            # "position == high watermark" means read to the end (lag, sweeps).
            **{"enable.partition.eof": True},
            # The checker's proof that it sees aborted reads: never do this.
            **({"isolation.level": "read_uncommitted"} if faults.sabotaged("read_uncommitted") else {}),
        )
        self._consumer.subscribe(
            [self.input_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        membership = watch_membership(self._common, self.group_id)
        self.state = LoopState.RUNNING
        log.info("%s: consuming %s as %s", self.stage.name, self.input_topic, self.transactional_id)
        try:
            while not self._stop.is_set():
                self._apply_pause()
                self._audit_stores()
                records = self._poll()
                membership.observe(self._consumer)
                punctuate = self._punctuation_due()
                if records or punctuate:
                    self._transact(records, punctuate)
                if not records and self._drain_requested:
                    self._drained.set()
                self._sample_progress()
            self.state = LoopState.STOPPED
            return EXIT_OK
        except FencedError as exc:
            self.state = LoopState.FENCED
            self.stats.last_error = str(exc)
            log.error("%s: fenced, this instance is a zombie and stops: %s", self.stage.name, exc)
            return EXIT_FENCED
        except ConsumerStuck as exc:
            self.state = LoopState.STOPPED
            self.stats.last_error = str(exc)
            log.error("%s: %s; exiting so that a new process takes over", self.stage.name, exc)
            return EXIT_RESTART
        finally:
            self._close()

    def _poll(self) -> list[Message]:
        assert self._consumer is not None
        messages = self._consumer.consume(num_messages=self._batch_bound, timeout=self._settings.max_batch_ms / 1000)
        records = []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume: %s", error)
        self._adapt_batch_bound(len(records))
        return records

    def _adapt_batch_bound(self, polled: int) -> None:
        """Grow under load (a full batch: more was waiting), shrink when idle, so a stage with a
        fixed cost per batch (a Spark job) amortises it at high rates and stays prompt at low."""
        low, high = self._settings.min_batch_records, self._settings.max_batch_records
        if not low:
            return
        if polled >= self._batch_bound:
            self._batch_bound = min(high, self._batch_bound * 2)
        elif polled < self._batch_bound // 4:
            self._batch_bound = max(low, self._batch_bound // 2)
        self.stats.batch_bound = self._batch_bound

    def _punctuation_due(self) -> bool:
        if self._punctuate is None or self._paused_now:
            return False
        now = time.monotonic()
        if now < self._next_punctuation:
            return False
        self._next_punctuation = now + self._settings.punctuate_ms / 1000
        return True

    def _transact(self, records: list[Message], punctuate: bool = False) -> None:
        started = time.monotonic()
        batch = Batch(records, self.stores, self._dlq_topic, self.stage.name, self._acks_topic, self._ack_partitions)
        try:
            if records:
                self.stage.process(batch)
            if punctuate and self._punctuate is not None:
                batch.caught_up = self._caught_up()
                self._punctuate(batch)
            batch.seal()
        except StoreDiverged as exc:
            # A read found the store behind what was written to it: nothing this batch decided
            # can stand. Rebuild that store, then take the batch again from committed offsets.
            assert self.stores is not None
            self._note_failure(f"batch dropped: {exc}")
            self._guard_store(lambda: self.stores.repair(exc))  # type: ignore[union-attr]
            self._resync()
            return
        except Exception as exc:  # the stage failed on the whole batch: nothing was produced yet
            self._stage_failed(exc, len(records))
            return
        assert self._producer is not None
        if not records and not batch.has_writes:
            # Nothing to commit, so nothing can fail to: settle whatever waits on this batch.
            for callback in batch.after_commit:
                callback()
            return
        changelog_offsets: dict[int, int] = {}
        result = self._producer.transact(lambda: self._write_batch(batch, records, changelog_offsets))
        if not result.committed:
            if result.outcome is TxnOutcome.UNKNOWN:
                self._note_failure(f"indefinite transaction outcome, producer recreated: {result.error}")
            else:
                self._note_failure(f"transaction aborted: {result.error}")
            self._resync()
            return
        faults.point("after_commit")
        if self.stores is not None:
            stores = self.stores
            for partition, overlay in batch.overlays.items():
                offset = changelog_offsets.get(partition)
                checkpoint = None if offset is None else offset + 1
                # Committed whatever happens here: a store that misses it is caught up later.
                self._guard_store(lambda: stores.apply_committed(partition, overlay.changes, checkpoint))  # noqa: B023
        for callback in batch.after_commit:
            callback()
        self._count_commit(batch, len(records), started)
        if self.stats.stage_failures:
            log.info("%s: a batch committed again after %d failed attempts", self.stage.name, self.stats.stage_failures)
            self.stats.stage_failures = 0
            self.health_listener(True)

    def _caught_up(self) -> frozenset[int]:
        """Owned partitions not known to be behind: position at the high watermark of the last
        fetch, or not known yet (nothing consumed there since the assignment)."""
        assert self._consumer is not None
        done = set()
        for tp in self._consumer.position(self._consumer.assignment()):
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset < 0 or high < 0 or tp.offset >= high:
                done.add(tp.partition)
        return frozenset(done)

    def _audit_stores(self) -> None:
        """About once a second: is every store still what was written to it? (Redis can go back
        in time with no record arriving to notice.)"""
        if self.stores is None or self._paused_now:
            return
        now = time.monotonic()
        if now < self._next_audit:
            return
        self._next_audit = now + 1.0
        stores = self.stores
        self._guard_store(stores.audit)

    def _guard_store(self, operation: Callable[[], None], retry: Callable[[], None] | None = None) -> None:
        """Run a store operation, retrying with a doubling backoff while the store is unavailable
        (Redis down, MISCONF); the service is unhealthy meanwhile. Each retry first catches the
        stores up, whose continuity check decides whether the failed write landed."""
        failures = 0
        repairs = self.stores.repairs if self.stores is not None else 0
        while True:
            try:
                operation()
                break
            except StoreUnavailable as exc:
                failures += 1
                self.stats.last_error = f"store unavailable: {exc}"
                backoff = min(self._settings.max_retry_backoff_s, self._settings.retry_backoff_s * 2 ** (failures - 1))
                log.warning("%s: store unavailable (%s); retrying in %.1fs", self.stage.name, exc, backoff)
                if failures == 1:
                    self.health_listener(False)
                if self._stop.wait(backoff):
                    return
                assert self.stores is not None
                operation = retry or self.stores.catch_up
        if failures:
            log.info("%s: store available again after %d tries", self.stage.name, failures)
            self.health_listener(True)
        if self.stores is not None and self.stores.repairs > repairs:
            self.stats.last_error = f"store rebuilt from the changelog: {self.stores.last_repair}"

    def _stage_failed(self, exc: Exception, count: int) -> None:
        """Retry from the committed offsets after a backoff that doubles per consecutive
        failure; unhealthy meanwhile, so operators (and health probes) see it."""
        self.stats.stage_failures += 1
        failures = self.stats.stage_failures
        backoff = min(self._settings.max_retry_backoff_s, self._settings.retry_backoff_s * 2 ** (failures - 1))
        log.exception(
            "%s: stage failed on a batch of %d (%d in a row); retrying from committed offsets in %.1fs",
            self.stage.name, count, failures, backoff,
        )
        self.stats.last_error = f"stage: {exc}"
        metrics.STAGE_FAILURES.labels(self.stage.name).inc()
        if self._settings.min_batch_records:  # a smaller retry is cheaper to pick apart
            self._batch_bound = max(self._settings.min_batch_records, self._batch_bound // 2)
            self.stats.batch_bound = self._batch_bound
        if failures == 1:
            self.health_listener(False)
        self._stop.wait(backoff)
        self._resync()

    def _write_batch(self, batch: Batch, records: list[Message], changelog_offsets: dict[int, int]) -> None:
        """The body of one transaction; fills ``changelog_offsets`` with the last changelog
        offset written per partition (delivery reports, served by the commit)."""
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None

        def track_changelog(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                changelog_offsets[msg.partition()] = max(changelog_offsets.get(msg.partition(), -1), msg.offset())

        sabotaged = bool(records) and faults.sabotaged("offsets_outside_txn")
        if sabotaged:  # the checker's proof that it can fail: never do this
            consumer.commit(offsets=self._next_offsets(records), asynchronous=False)
        faults.point("before_produce")
        for out in batch.outputs:
            producer.produce(out.topic, out.value, out.key, out.partition, out.headers)
        if self.stores is not None:
            for partition, overlay in batch.overlays.items():
                for key, value in overlay.changes.items():
                    producer.produce(self.stores.changelog_topic, value, key, partition, on_delivery=track_changelog)
        faults.point("after_produce", before_crash=producer.flush)
        if records and not sabotaged:
            producer.send_offsets(self._next_offsets(records), consumer)

    @staticmethod
    def _next_offsets(records: list[Message]) -> list[TopicPartition]:
        nxt: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.topic(), record.partition())
            nxt[key] = max(nxt.get(key, 0), record.offset() + 1)
        return [TopicPartition(topic, partition, offset) for (topic, partition), offset in nxt.items()]

    def _count_commit(self, batch: Batch, count: int, started: float) -> None:
        produced = len(batch.outputs) - batch.dead_letters
        self.stats.committed += 1
        self.stats.records_in += count
        self.stats.records_out += produced
        self.stats.dead_letters += batch.dead_letters
        name = self.stage.name
        metrics.TRANSACTIONS.labels(name, "committed").inc()
        metrics.RECORDS_IN.labels(name).inc(count)
        metrics.RECORDS_OUT.labels(name).inc(produced)
        metrics.DEAD_LETTERS.labels(name).inc(batch.dead_letters)
        metrics.BATCH_RECORDS.labels(name).observe(count)
        elapsed = time.monotonic() - started
        self.stats.batch_seconds.append(elapsed)
        metrics.COMMIT_SECONDS.labels(name).observe(elapsed)

    def _note_failure(self, message: str) -> None:
        self.stats.aborted += 1
        self.stats.last_error = message
        metrics.TRANSACTIONS.labels(self.stage.name, "aborted").inc()
        log.warning("%s: %s", self.stage.name, message)

    def _resync(self) -> None:
        """Forget everything since the last commit: seek every owned partition back to its
        committed offset and catch the stores up with whatever the changelog committed."""
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        if assignment:
            committed = committed_offsets(self._consumer, assignment, self._stop)
            if committed is None:
                return  # stopping
            for tp in committed:
                if tp.offset < 0:
                    tp.offset = OFFSET_BEGINNING
                self._consumer.seek(tp)
        if self.stores is not None:
            self._guard_store(self.stores.catch_up)
        if on_rollback := getattr(self.stage, "on_rollback", None):
            on_rollback()

    # -- rebalance ---------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("%s: assigned %s", self.stage.name, [p.partition for p in partitions])
        # A new owner reads its input for a punctuation interval before it sweeps: a sweep
        # needs to know how far behind each partition is.
        self._next_punctuation = time.monotonic() + self._settings.punctuate_ms / 1000
        if self.stores is not None:
            before = self.stores.restored_records
            stores, owned = self.stores, [p.partition for p in partitions]
            assign = lambda: stores.assign(owned)  # noqa: E731 - retried whole: it is idempotent
            self._guard_store(assign, retry=assign)
            metrics.RESTORED.labels(self.stage.name).inc(self.stores.restored_records - before)
        consumer.assign(partitions)
        if self._paused_now:
            consumer.pause(partitions)
        if on_assign := getattr(self.stage, "on_assign", None):
            on_assign([p.partition for p in partitions])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("%s: revoked %s", self.stage.name, [p.partition for p in partitions])
        if self.stores is not None:
            self.stores.revoke(p.partition for p in partitions)
        if on_revoke := getattr(self.stage, "on_revoke", None):
            on_revoke([p.partition for p in partitions])

    def _apply_pause(self) -> None:
        assert self._consumer is not None
        want = self._pause_requested or self._drain_requested
        if want == self._paused_now:
            return
        assignment = self._consumer.assignment()
        if want:
            self._consumer.pause(assignment)
            self.state = LoopState.DRAINED if self._drain_requested else LoopState.PAUSED
        else:
            self._consumer.resume(assignment)
            self.state = LoopState.RUNNING
        self._paused_now = want

    def _sample_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < 2.0 or self._consumer is None:
            return
        self._last_progress = now
        progress = []
        for tp in self._consumer.position(self._consumer.assignment()):
            # Cached: the high watermark of the last fetch. A ListOffsets request here would
            # queue behind the consumer's long-poll fetch on the same connection.
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            position = max(tp.offset, 0)
            lag = max(0, high - position) if high >= 0 else 0
            progress.append(PartitionProgress(tp.topic, tp.partition, position, lag))
            metrics.LAG.labels(self.stage.name, str(tp.partition)).set(lag)
        self.stats.partitions = progress

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing after a fence may fail, nothing to save
                log.debug("consumer close failed", exc_info=True)
