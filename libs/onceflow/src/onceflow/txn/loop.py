"""The transactional hop every stage but the sink runs (docs/architecture.md, "One
transactional hop"), on the shared consumer driver (``driver.py``):

poll a read_committed batch -> let the stage process it (pure: outputs and state overlay are
buffered) -> begin -> produce outputs and changelog -> the intake's positions (by default
send_offsets_to_transaction with the group metadata, KIP-447 fencing; for a source on another
cluster, records of a positions topic) -> commit -> apply the overlay to the stores.

No transaction is ever open while the consumer polls, and rebalance callbacks only run inside
poll. So when partitions are revoked there is never an open transaction to finish: the last
batch has committed or aborted by then, and revoking only drops the partitions' stores. When
partitions are assigned, their committed offsets are fetched first, then their stores restored,
and the consumer starts at the offsets fetched (the takeover order).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic

from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, KafkaError, Message, TopicPartition

from onceflow import faults, metrics, spout
from onceflow.config import CommonSettings, LoopSettings
from onceflow.kafka.records import offset_of, partition_of
from onceflow.state.store import StoreDiverged, StoreT, StoreUnavailable
from onceflow.state.stores import Changelog, PartitionStores
from onceflow.topology import Hop, job_topic
from onceflow.txn.batch import Batch, Stage
from onceflow.txn.commit import commit, count_aborted
from onceflow.txn.driver import ConsumerDriver, Intake
from onceflow.txn.producer import TxnOutcome

log = logging.getLogger(__name__)


class TransactionalLoop(ConsumerDriver, Generic[StoreT]):
    """The driver with a stage and Kafka transactions: outputs, changelog and offsets commit
    together, then the stores take the committed overlay. Generic in the store type its
    ``changelog`` makes, which its stage is handed (``Batch[StoreT]``, ``on_assign``)."""

    def __init__(
        self,
        *,
        stage: Stage[StoreT],
        common: CommonSettings,
        settings: LoopSettings,
        input_topic: str,
        group_id: str,
        transactional_id: str,
        dlq_topic: str,
        changelog: Changelog[StoreT] | None = None,
        intake: Intake | None = None,
    ) -> None:
        super().__init__(
            name=stage.name, common=common, settings=settings, input_topic=input_topic, group_id=group_id,
            transactional_id=transactional_id, intake=intake,
        )
        self.stage = stage
        self.dlq_topic = dlq_topic
        self.stores: PartitionStores[StoreT] | None = (
            PartitionStores(common, changelog.topic, changelog.store_factory, service=stage.name)
            if changelog is not None
            else None
        )
        # The stage's optional hooks (`Stage`), typed here once.
        self._punctuate: Callable[[Batch[StoreT]], None] | None = getattr(stage, "punctuate", None)
        self._assign_hook: Callable[[list[int], Mapping[int, StoreT]], None] | None = getattr(stage, "on_assign", None)
        self._revoke_hook: Callable[[list[int]], None] | None = getattr(stage, "on_revoke", None)
        self._rollback_hook: Callable[[], None] | None = getattr(stage, "on_rollback", None)
        self._next_punctuation = 0.0
        self._next_audit = 0.0

    @classmethod
    def for_hop(
        cls,
        hop: Hop,
        stage: Stage[StoreT],
        *,
        common: CommonSettings,
        settings: LoopSettings,
        instance: str,
        job: str = "",
        input_topic: str | None = None,
        store: Callable[[int], StoreT] | None = None,
        intake: Intake | None = None,
    ) -> TransactionalLoop[StoreT]:
        """The hop as `onceflow.topology` declares it: its input, dead letters, changelog,
        consumer group and transactional id (``instance``'s), for ``job`` where the hop is a
        job's. ``input_topic`` names what a hop reads when the topology cannot: a named
        stream's topic, the source's user topic. ``store`` is the store each owned partition
        gets; a hop that declares a changelog but is given none keeps no state (the map hop of
        a job without event time)."""
        prefix = common.topic_prefix
        if input_topic is None:
            if hop.input is None:
                raise ValueError(f"{hop.name} is a spout: name the topic it reads (input_topic)")
            input_topic = common.topic(job_topic(hop.input, job))
        changelog = (
            Changelog(common.topic(job_topic(hop.changelog, job)), store)
            if hop.changelog is not None and store is not None
            else None
        )
        return cls(
            stage=stage, common=common, settings=settings, input_topic=input_topic,
            group_id=hop.group_id(prefix, job), transactional_id=hop.transactional_id(prefix, instance, job),
            dlq_topic=common.topic(job_topic(hop.dlq, job)), changelog=changelog, intake=intake,
        )

    # -- the driver's hooks ----------------------------------------------------------------

    def consumer_overrides(self) -> dict[str, Any]:
        # The checker's proof that it sees aborted reads: never do this.
        return {"isolation.level": "read_uncommitted"} if faults.sabotaged("read_uncommitted") else {}

    def housekeeping(self) -> None:
        self._audit_stores()

    def handle(self, records: list[Message]) -> None:
        punctuate = self._punctuation_due()
        if records or punctuate:
            self._transact(records, punctuate)

    def _punctuation_due(self) -> bool:
        if self._punctuate is None or self.paused:
            return False
        now = time.monotonic()
        if now < self._next_punctuation:
            return False
        self._next_punctuation = now + self.settings.punctuate_ms / 1000
        return True

    def _transact(self, records: list[Message], punctuate: bool = False) -> None:
        started = time.monotonic()
        batch: Batch[StoreT] = Batch(records, self.stores, self.dlq_topic, self.stage.name, self.acks_topic, self.ack_partitions)
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
            diverged = self.stores
            assert diverged is not None  # only a store raises it
            self._note_failure(f"batch dropped: {exc}")
            self._guard_store(lambda: diverged.repair(exc))
            self._resync()
            return
        except Exception as exc:  # the stage failed on the whole batch: nothing was produced yet
            self._stage_failed(exc, len(records))
            return
        if not records and not batch.has_writes:
            # Nothing to commit, so nothing can fail to: settle whatever waits on this batch.
            for callback in batch.after_commit:
                callback()
            return
        changelog_offsets: dict[int, int] = {}
        sabotaged = bool(records) and faults.sabotaged("offsets_outside_txn")
        if sabotaged:  # the checker's proof that it can fail: never do this
            self.consumer.commit(offsets=self._next_offsets(records), asynchronous=False)
        result = commit(
            self.stage.name, self.producer, self.stats,
            write=lambda: self._write_batch(batch, changelog_offsets),
            positions=None if not records or sabotaged else lambda: self.intake.send(
                self.producer, self.consumer, self._next_offsets(records)
            ),
            after_commit=lambda: self._after_commit(batch, changelog_offsets),
        )
        if not result.committed:
            unknown = result.outcome is TxnOutcome.UNKNOWN
            self.stats.last_error = (
                f"indefinite transaction outcome, producer recreated: {result.error}" if unknown
                else f"transaction aborted: {result.error}"
            )
            log.warning("%s: %s", self.stage.name, self.stats.last_error)
            self._resync()
            return
        self._count_records(batch, len(records), started)
        if self.stats.stage_failures:
            log.info("%s: a batch committed again after %d failed attempts", self.stage.name, self.stats.stage_failures)
            self.stats.stage_failures = 0
            self.health_listener(True)

    def _caught_up(self) -> frozenset[int]:
        """Owned partitions not known to be behind: position at the high watermark of the last
        fetch, or not known yet (nothing consumed there since the assignment)."""
        consumer = self.consumer
        done = set()
        for tp in consumer.position(consumer.assignment()):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset < 0 or high < 0 or tp.offset >= high:
                done.add(tp.partition)
        return frozenset(done)

    def _audit_stores(self) -> None:
        """About once a second: is every store still what was written to it? (Redis can go back
        in time with no record arriving to notice.)"""
        if self.stores is None or self.paused:
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
        repairs = self.stores.repairs if self.stores is not None else 0
        while True:
            try:
                operation()
                break
            except StoreUnavailable as exc:
                if self.stopping.wait(self.store_unavailable(exc)):
                    return
                assert self.stores is not None
                operation = retry or self.stores.catch_up
        self.store_available()
        if self.stores is not None and self.stores.repairs > repairs:
            self.stats.last_error = f"store rebuilt from the changelog: {self.stores.last_repair}"

    def _stage_failed(self, exc: Exception, count: int) -> None:
        """Retry from the committed offsets after a backoff that doubles per consecutive
        failure; unhealthy meanwhile, so operators (and health probes) see it."""
        self.stats.stage_failures += 1
        failures = self.stats.stage_failures
        backoff = self.backoff_s(failures)
        log.exception(
            "%s: stage failed on a batch of %d (%d in a row); retrying from committed offsets in %.1fs",
            self.stage.name, count, failures, backoff,
        )
        self.stats.last_error = f"stage: {exc}"
        metrics.STAGE_FAILURES.labels(self.stage.name).inc()
        self.halve_batch_bound()
        if failures == 1:
            self.health_listener(False)
        self.stopping.wait(backoff)
        self._resync()

    def _after_commit(self, batch: Batch[StoreT], changelog_offsets: dict[int, int]) -> None:
        """The stores take the committed overlay, then whatever waits on the batch is settled."""
        if self.stores is not None:
            stores = self.stores
            for partition, overlay in batch.overlays.items():
                offset = changelog_offsets.get(partition)
                checkpoint = None if offset is None else offset + 1
                # Committed whatever happens here: a store that misses it is caught up later.
                self._guard_store(lambda: stores.apply_committed(partition, overlay.changes, checkpoint))  # noqa: B023
        for callback in batch.after_commit:
            callback()

    def _write_batch(self, batch: Batch[StoreT], changelog_offsets: dict[int, int]) -> None:
        """The writes of one transaction; fills ``changelog_offsets`` with the last changelog
        offset written per partition (delivery reports, served by the commit)."""
        producer = self.producer

        def track_changelog(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                partition = partition_of(msg)
                changelog_offsets[partition] = max(changelog_offsets.get(partition, -1), offset_of(msg))

        faults.point("before_produce")
        self._write_new_roots(batch)
        for out in batch.outputs:
            producer.produce(out.topic, out.value, out.key, out.partition, out.headers)
        if self.stores is not None:
            for partition, overlay in batch.overlays.items():
                for key, value in overlay.changes.items():
                    producer.produce(self.stores.changelog_topic, value, key, partition, on_delivery=track_changelog)
        faults.point("after_produce", before_crash=producer.flush)

    def _write_new_roots(self, batch: Batch[StoreT]) -> None:
        """A spout stage's records, each run of one topic and timeout as ingest writes them."""
        for (topic, timeout_ms), run in itertools.groupby(batch.new_roots, key=lambda r: (r.topic, r.tree_timeout_ms)):
            inits = None if timeout_ms is None else spout.Inits(self.acks_topic, self.ack_partitions, timeout_ms)
            spout.produce_new_records(self.producer, topic, [root.record for root in run], inits)

    @staticmethod
    def _next_offsets(records: list[Message]) -> list[TopicPartition]:
        nxt: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.topic() or "", partition_of(record))
            nxt[key] = max(nxt.get(key, 0), offset_of(record) + 1)
        return [TopicPartition(topic, partition, offset) for (topic, partition), offset in nxt.items()]

    def _count_records(self, batch: Batch[StoreT], count: int, started: float) -> None:
        produced = len(batch.outputs) + len(batch.new_roots) - batch.dead_letters
        self.stats.records_in += count
        self.stats.records_out += produced
        self.stats.dead_letters += batch.dead_letters
        name = self.stage.name
        metrics.RECORDS_IN.labels(name).inc(count)
        metrics.RECORDS_OUT.labels(name).inc(produced)
        metrics.DEAD_LETTERS.labels(name).inc(batch.dead_letters)
        metrics.BATCH_RECORDS.labels(name).observe(count)
        elapsed = time.monotonic() - started
        self.stats.batch_seconds.append(elapsed)
        metrics.COMMIT_SECONDS.labels(name).observe(elapsed)

    def _note_failure(self, message: str) -> None:
        count_aborted(self.stage.name, self.stats, message)
        log.warning("%s: %s", self.stage.name, message)

    def _resync(self) -> None:
        """Forget everything since the last commit: seek every owned partition back to its
        committed offset and catch the stores up with whatever the changelog committed."""
        consumer = self.consumer
        assignment = consumer.assignment()
        if assignment:
            committed = self.intake.committed(consumer, assignment, self.stopping)
            if committed is None:
                return  # stopping
            for tp in committed:
                if tp.offset < 0:
                    tp.offset = OFFSET_BEGINNING
                consumer.seek(tp)
        if self.stores is not None:
            self._guard_store(self.stores.catch_up)
        if self._rollback_hook is not None:
            self._rollback_hook()

    # -- rebalance (inside poll, so no transaction is open) ---------------------------------

    def assigning(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A new owner reads its input for a punctuation interval before it sweeps: a sweep
        # needs to know how far behind each partition is.
        self._next_punctuation = time.monotonic() + self.settings.punctuate_ms / 1000
        # Offsets first, then state (docs/architecture.md, "Takeover order"). The fetch asks for
        # stable offsets (read_committed: KIP-447's require_stable), so it waits while any
        # transaction holding offsets for these partitions is open: a previous owner's, also
        # one with another transactional id that nothing fences. Once it answers, everything
        # that committed those offsets has committed its changelog writes too, and the restore
        # below reads them. Restored first, a zombie could commit after the restore and before
        # librdkafka fetched the offsets: a store missing the changes of records the position
        # is already past.
        if not self._position_at_committed(consumer, partitions):
            return  # stopping: the driver pauses the partitions, the loop ends
        if self.stores is not None:
            before = self.stores.restored_records
            stores, owned = self.stores, [p.partition for p in partitions]
            assign = lambda: stores.assign(owned)  # noqa: E731 - retried whole: it is idempotent
            self._guard_store(assign, retry=assign)
            metrics.RESTORED.labels(self.stage.name).inc(self.stores.restored_records - before)

    def _position_at_committed(self, consumer: Consumer, partitions: list[TopicPartition]) -> bool:
        """Set each partition's offset to its committed one, fetched now (none yet: the start,
        as ``auto.offset.reset=earliest`` and a rewind do). Partitions the intake handed over
        with an offset already (the external intake reads its positions before it assigns)
        keep it. False if the hop is stopping."""
        unknown = [tp for tp in partitions if tp.offset == OFFSET_INVALID]
        if not unknown:
            return True
        log.info("%s: fetching the committed offsets of %s before restoring them", self.stage.name,
                 sorted(tp.partition for tp in unknown))
        committed = self.intake.committed(consumer, unknown, self.stopping)  # ConsumerStuck ends the process
        if committed is None:
            return False
        fetched = {(tp.topic, tp.partition): tp.offset for tp in committed}
        for tp in unknown:
            offset = fetched.get((tp.topic, tp.partition), OFFSET_INVALID)
            tp.offset = offset if offset >= 0 else OFFSET_BEGINNING
        return True

    def assigned(self, partitions: list[TopicPartition]) -> None:
        if self._assign_hook is not None:
            owned = [p.partition for p in partitions]
            stores = self.stores
            # A stop during a restore leaves partitions without a store: the loop ends anyway.
            restored = {} if stores is None else {partition: stores[partition] for partition in owned if partition in stores}
            self._assign_hook(owned, restored)

    def revoked(self, partitions: list[TopicPartition]) -> None:
        if self.stores is not None:
            self.stores.revoke(p.partition for p in partitions)
        if self._revoke_hook is not None:
            self._revoke_hook([p.partition for p in partitions])
