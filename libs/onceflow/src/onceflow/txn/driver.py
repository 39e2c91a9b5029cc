"""The one consumer driver every consuming hop runs on.

The driver owns what is the same for every hop: the transactional producer and the consumer,
the subscription and its rebalance callbacks, polling, pause and drain, lag, group membership,
and the exit codes (fenced 3, stuck 4). What a hop does with a polled batch, and how it makes
that batch's effects and offsets durable together, is its commit strategy, one subclass each:

- `onceflow.txn.loop.TransactionalLoop`: outputs, changelog and offsets in one Kafka
  transaction (every hop but the sink);
- `onceflow_sink.worker.SinkWorker`: effects and offsets in Redis under a fenced token, dead
  letters and acks in Kafka transactions.

Where a hop reads, and where the positions it has read up to are kept, is its `Intake`: by
default a consumer group on the pipeline's cluster (`GroupIntake`); the Kafka source on another
cluster assigns that cluster's partitions itself and keeps their positions in a topic of the
pipeline's cluster (`onceflow.txn.external.ExternalIntake`).

A fix to the consume/commit cycle lands here once, and every hop gets it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from onceflow import metrics
from onceflow.config import CommonSettings, LoopSettings, heartbeat_interval_ms, takeover_order_problem
from onceflow.kafka import clients
from onceflow.kafka.inspect import wait_partition_count
from onceflow.topology import Topic
from onceflow.txn.batching import Batcher, BatchPolicy
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART, ConsumerStuck, FencedError
from onceflow.txn.membership import MembershipWatch, watch_membership
from onceflow.txn.offsets import committed_offsets
from onceflow.txn.producer import TransactionalProducer, open_producer

log = logging.getLogger(__name__)


class LoopState(str, enum.Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    HELD = "HELD"  # backpressure: a spout's trees in flight are at their cap
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


Rebalance = Callable[[Consumer, list[TopicPartition]], None]


class Intake(Protocol):
    """Where a hop reads and where its read positions commit. ``open`` runs after the hop's
    transactional producer is initialised (so after any zombie with its transactional.id is
    fenced), and hands partitions to the driver through ``on_assign``."""

    def open(self, overrides: dict[str, Any], on_assign: Rebalance, on_revoke: Rebalance) -> Consumer: ...

    def observe(self, consumer: Consumer) -> None:
        """Once per poll round: raise ConsumerStuck if the consumer cannot recover its partitions."""

    def send(self, producer: TransactionalProducer, consumer: Consumer, offsets: list[TopicPartition]) -> None:
        """Inside the open transaction: the positions after this batch commit with it."""

    def committed(
        self, consumer: Consumer, partitions: list[TopicPartition], stop: threading.Event
    ) -> list[TopicPartition] | None:
        """The committed positions of ``partitions`` (negative: none yet); None if stopped."""


class GroupIntake:
    """A consumer group on the pipeline's cluster: the group spreads the input's partitions over
    the instances, and the offsets go into the transaction with the group's metadata (KIP-447)."""

    def __init__(self, common: CommonSettings, group_id: str, topic: str, session_timeout_ms: int) -> None:
        self._common = common
        self._group_id = group_id
        self._topic = topic
        self._session_timeout_ms = session_timeout_ms
        self._membership: MembershipWatch | None = None

    def open(self, overrides: dict[str, Any], on_assign: Rebalance, on_revoke: Rebalance) -> Consumer:
        consumer = clients.consumer(
            self._common, self._group_id,
            **{
                "session.timeout.ms": self._session_timeout_ms,
                "heartbeat.interval.ms": heartbeat_interval_ms(self._session_timeout_ms),
                **overrides,
            },
        )
        consumer.subscribe([self._topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        self._membership = watch_membership(self._common, self._group_id)
        return consumer

    def observe(self, consumer: Consumer) -> None:
        if self._membership is not None:
            self._membership.observe(consumer)

    def send(self, producer: TransactionalProducer, consumer: Consumer, offsets: list[TopicPartition]) -> None:
        producer.send_offsets(offsets, consumer)

    def committed(
        self, consumer: Consumer, partitions: list[TopicPartition], stop: threading.Event
    ) -> list[TopicPartition] | None:
        return committed_offsets(consumer, partitions, stop)


class ConsumerDriver:
    """Subclasses give `handle` (a polled batch, possibly empty: commit it, or rewind, before
    returning) and may give the other hooks below; they reach the producer, the consumer and
    the rest through the public names of "for the commit strategy" below, nothing private."""

    def __init__(
        self,
        *,
        name: str,
        common: CommonSettings,
        settings: LoopSettings,
        input_topic: str,
        group_id: str,
        transactional_id: str,
        stats: LoopStats | None = None,
        intake: Intake | None = None,
    ) -> None:
        # The library's own guard; a service refuses these settings before it starts (service_main).
        problem = takeover_order_problem(common, settings)
        if problem:
            raise ValueError(problem)
        self.name = name
        self._common = common
        self.settings = settings
        self.input_topic = input_topic
        self.group_id = group_id
        self.transactional_id = transactional_id
        self.stats = stats if stats is not None else LoopStats()
        self.intake: Intake = intake or GroupIntake(common, group_id, input_topic, settings.session_timeout_ms)
        self.state = LoopState.STARTING
        self.stopping = threading.Event()
        self._pause_requested = False
        self._drain_requested = False
        self._drained = threading.Event()
        self._paused_now = False
        self._last_progress = 0.0
        self._producer: TransactionalProducer | None = None
        self._consumer: Consumer | None = None
        self.acks_topic = common.topic(Topic.ACKER_ACKS)
        self.ack_partitions = 1
        # False for a hop that acks nothing and whose producer's cluster may hold no acker.acks
        # (the Kafka output sink to another cluster): its start does not wait for that topic.
        self.acking = True
        self._batcher: Batcher[Message] = Batcher(
            BatchPolicy.of_loop(settings), lambda limit, timeout: self.consumer.consume(num_messages=limit, timeout=timeout)
        )
        self.stats.batch_bound = self._batcher.bound
        # Told False when the hop cannot make progress (stage failing, store unavailable), True
        # once it does again: gRPC health.
        self.health_listener: Callable[[bool], None] = lambda _healthy: None
        # Backpressure from downstream (a spout's trees in flight at their cap, Storm's
        # max.spout.pending): while it answers True the hop reads nothing, as if paused.
        self.held: Callable[[], bool] = lambda: False
        self._unavailable = 0  # consecutive failures of the store (store_unavailable)

    # -- control (any thread) --------------------------------------------------------------

    def stop(self) -> None:
        """Graceful: the current batch finishes and commits, then the hop leaves the group."""
        self.stopping.set()

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

    # -- for the commit strategy (a subclass) ----------------------------------------------

    @property
    def producer(self) -> TransactionalProducer:
        """The hop's producer, from `run` on."""
        if self._producer is None:
            raise RuntimeError(f"{self.name}: the producer is opened by run()")
        return self._producer

    @property
    def consumer(self) -> Consumer:
        """The hop's consumer, from `run` on."""
        if self._consumer is None:
            raise RuntimeError(f"{self.name}: the consumer is created by run()")
        return self._consumer

    @property
    def paused(self) -> bool:
        """Paused or drained right now: the assignment is paused, nothing is read."""
        return self._paused_now

    def backoff_s(self, failures: int) -> float:
        """The wait before retry ``failures`` (1, 2, ...): doubling, capped."""
        return min(self.settings.max_retry_backoff_s, self.settings.retry_backoff_s * 2.0 ** (failures - 1))

    def store_unavailable(self, exc: Exception) -> float:
        """The store (Redis) did not answer: unhealthy from the first failure in a row, which
        operators and probes see; returns how long to wait before the next try. Both commit
        strategies retry through this and `store_available`, each in its own way (the loop in
        place, after catching its stores up; the sink from what Redis last confirmed)."""
        self._unavailable += 1
        self.stats.last_error = f"store unavailable: {exc}"
        backoff = self.backoff_s(self._unavailable)
        log.warning("%s: store unavailable (%s); retrying in %.1fs", self.name, exc, backoff)
        if self._unavailable == 1:
            self.health_listener(False)
        return backoff

    def store_available(self) -> None:
        """The store answered: healthy again if it had not."""
        if self._unavailable:
            log.info("%s: store available again after %d tries", self.name, self._unavailable)
            self._unavailable = 0
            self.health_listener(True)

    def halve_batch_bound(self) -> None:
        """After a failed batch, with an adaptive bound: a smaller retry is cheaper to pick apart."""
        self._batcher.halve()
        self.stats.batch_bound = self._batcher.bound

    # -- hooks -----------------------------------------------------------------------------

    def consumer_overrides(self) -> dict[str, Any]:
        return {}

    def assigning(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Before the consumer takes the partitions: fetch their committed offsets, then restore
        their state, and set each partition's offset to the one fetched (docs/architecture.md,
        "Takeover order"). A partition left at OFFSET_INVALID is positioned by librdkafka later."""

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """After the consumer took them."""

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """No batch is open when this runs: callbacks only run inside poll."""

    def housekeeping(self) -> None:
        """Before each poll while not paused: audits of external state."""

    def handle(self, records: list[Message]) -> None:
        raise NotImplementedError

    # -- the driver (one thread) -----------------------------------------------------------

    def run(self) -> int:
        try:
            self._producer = open_producer(self._common, self.transactional_id, self.settings.commit_timeout_s, self.stopping)
        except FencedError as exc:
            log.error("%s: cannot start: %s", self.name, exc)
            return EXIT_FENCED
        if self.acking:
            self.ack_partitions = wait_partition_count(self._common, self.acks_topic, self.stopping)
            if self.ack_partitions == 0:
                return EXIT_OK  # stopped while waiting for the broker
        # End-of-partition events move the position past a final transaction marker, so
        # "position == high watermark" means read to the end (lag, sweeps).
        overrides = {"enable.partition.eof": True, **self.consumer_overrides()}
        try:
            self._consumer = self.intake.open(overrides, self._on_assign, self._on_revoke)
        except ConsumerStuck as exc:  # e.g. positions not readable (transactions open too long): retry anew
            self.stats.last_error = str(exc)
            log.error("%s: cannot start consuming: %s; exiting for a restart", self.name, exc)
            return EXIT_RESTART
        self.state = LoopState.RUNNING
        log.info("%s: consuming %s as %s", self.name, self.input_topic, self.transactional_id)
        try:
            while not self.stopping.is_set():
                self._apply_pause()
                if not self._paused_now:
                    self.housekeeping()
                records = self._poll()
                self.intake.observe(self._consumer)
                self.handle(records)
                if not records and self._drain_requested:
                    self._drained.set()
                self._sample_progress()
            self.state = LoopState.STOPPED
            return EXIT_OK
        except FencedError as exc:
            self.state = LoopState.FENCED
            self.stats.last_error = str(exc)
            log.error("%s: fenced, this instance is a zombie and stops: %s", self.name, exc)
            return EXIT_FENCED
        except ConsumerStuck as exc:  # raised in a rebalance callback or a rewind, out of poll
            self.state = LoopState.STOPPED
            self.stats.last_error = str(exc)
            log.error("%s: %s; exiting so that a new process takes over", self.name, exc)
            return EXIT_RESTART
        finally:
            self._close()

    def _poll(self) -> list[Message]:
        """One batch by the shared policy (`onceflow.txn.batching`): what is fetched at once,
        else a wait for a first record, then a short linger for more."""
        records = []
        for message in self._batcher.gather():
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume: %s", error)
        self._batcher.adapt(len(records))
        self.stats.batch_bound = self._batcher.bound
        return records

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("%s: assigned %s", self.name, [p.partition for p in partitions])
        self.assigning(consumer, partitions)
        consumer.assign(partitions)
        # A paused hop must not read its new partitions either; nor a stopping one, whose
        # assigning may have returned before their offsets were fetched or their state restored.
        if self._paused_now or self.stopping.is_set():
            consumer.pause(partitions)
        self.assigned(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("%s: revoked %s", self.name, [p.partition for p in partitions])
        self.revoked(partitions)

    def _apply_pause(self) -> None:
        assert self._consumer is not None
        requested = self._pause_requested or self._drain_requested
        held = not requested and self.held()
        want = requested or held
        self.state = (
            LoopState.DRAINED if self._drain_requested else LoopState.PAUSED if self._pause_requested
            else LoopState.HELD if held else LoopState.RUNNING
        )
        if want == self._paused_now:
            return
        assignment = self._consumer.assignment()
        if want:
            self._consumer.pause(assignment)
        else:
            self._consumer.resume(assignment)
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
            metrics.LAG.labels(self.name, str(tp.partition)).set(lag)
        self.stats.partitions = progress

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing after a fence may fail, nothing to save
                log.debug("consumer close failed", exc_info=True)
