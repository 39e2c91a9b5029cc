"""A transactional producer that speaks in the three error classes.

Every service that writes onceflow topics goes through this class, so what "retriable",
"abortable", "fenced" and "indefinite" mean is decided once. ``open_producer`` picks it, or its
at-least-once twin when ``ONCEFLOW_PROCESSING_GUARANTEE=at_least_once`` (the mode ``onceflow
bench`` compares exactly-once against).
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from onceflow import faults
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.txn.errors import EXIT_RESTART, FencedError, IndefiniteOutcome, TxnErrorClass, classify, kafka_error

log = logging.getLogger(__name__)

_RETRIES = 5
DeliveryCallback = Callable[[KafkaError | None, Message], None]


def _reraise(exc: BaseException) -> None:
    raise exc


_HUNG_AFTER_S = 10.0
T = TypeVar("T")


class TxnOutcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"  # nothing of it is visible; the producer is ready for the next one
    UNKNOWN = "unknown"  # it may or may not have committed; the producer was recreated


@dataclass(frozen=True)
class Transacted(Generic[T]):
    """What ``TransactionalProducer.transact`` did: the body's value once committed, else the
    error that ended the transaction. Fenced is not an outcome: ``FencedError`` propagates."""

    outcome: TxnOutcome
    value: T | None = None
    error: Exception | None = None

    @property
    def committed(self) -> bool:
        return self.outcome is TxnOutcome.COMMITTED


class CallWatchdog:
    """Ends the process (exit 4, for a restart) when one producer call outlives ``limit_s``.

    librdkafka can block in ``send_offsets_to_transaction`` forever, ignoring its timeout, when
    the group coordinator's broker goes away mid-call (librdkafka #5511, #5456). On one broker
    ``metadata.recovery.strategy=none`` avoids it; on a 3-broker cluster it was caught again
    (py-spy: the gate's main thread in send_offsets, minutes after the coordinator's node
    restarted). Nothing in the process can interrupt the call, and waiting holds its partitions
    forever; exiting is a crash like kill -9, which the protocol is proven against: the next
    instance's init_transactions fences and settles the stuck transaction."""

    def __init__(self, name: str, exit_code: int = EXIT_RESTART) -> None:
        self._name = name
        self._exit_code = exit_code
        self._limit_s: float | None = None
        self._spent_s = 0.0
        self._what = ""
        threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True).start()

    @contextmanager
    def guard(self, what: str, limit_s: float) -> Iterator[None]:
        self._what, self._spent_s, self._limit_s = what, 0.0, limit_s
        try:
            yield
        finally:
            self._limit_s = None

    def _watch(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            # Time the process ran, not time it was stopped: a SIGSTOPped instance (a zombie)
            # resumes inside its call, and must meet its fence there rather than exit here.
            step, last = min(now - last, 1.5), now
            if self._limit_s is None:
                continue
            self._spent_s += step
            if self._spent_s > self._limit_s:
                self.give_up(f"a Kafka producer call ({self._what}) is stuck past its timeout")

    def give_up(self, why: str) -> NoReturn:
        """Exit for a restart, now: from the watchdog's thread, or from a caller that saw the
        producer will not recover in this process."""
        log.critical("%s: %s; exiting %d for a restart", self._name, why, self._exit_code)
        logging.shutdown()
        os._exit(self._exit_code)


# How long a timed-out commit or abort is resumed before the process gives up and exits for a
# restart. Three resumes: a broker restart is over in well under a minute, and a call still
# hanging after that is a client that will not recover (CI: resumed for 180 s, broker back after
# 18 s).
_RESUME_S = 90.0


def _timed_out(exc: BaseException) -> bool:
    """A call that timed out (librdkafka: retry it to resume), directly or behind the
    IndefiniteOutcome ``_call`` made of it. Not a transaction whose records timed out: librdkafka
    says so with the same _TIMED_OUT code ("20 message(s) timed out on ..."; message.timeout.ms
    defaults to transaction.timeout.ms, so a broker away longer fails the records in flight), but
    the transaction requires an abort and every later commit returns that error again at once:
    "resumed", it spun for all of _RESUME_S, then exited 4 (a broker restart: 776,000 resumes)."""
    for error in (exc, exc.__cause__):
        err = kafka_error(error) if isinstance(error, KafkaException) else None
        if err is not None and err.txn_requires_abort():
            return False
        if err is not None and err.code() == KafkaError._TIMED_OUT or "retry call to resume" in str(error or ""):
            return True
    return False


class TransactionalProducer:
    def __init__(
        self,
        common: CommonSettings,
        transactional_id: str,
        call_timeout_s: float = 30.0,
        stop: threading.Event | None = None,
        **overrides: Any,
    ) -> None:
        self._common = common
        self.transactional_id = transactional_id
        self._timeout = call_timeout_s
        self._stop = stop or threading.Event()
        self._overrides = overrides
        self.recreated = 0
        self._watchdog = CallWatchdog(transactional_id)
        self._producer = self._init()

    def _init(self) -> Producer:
        """init_transactions fences every older producer with our transactional.id and resolves
        its open transaction. Retried while the broker is unreachable, on the same producer:
        librdkafka resumes a timed-out init_transactions when it is called again, and destroying
        a producer whose init is still in flight aborted a whole service once (librdkafka 2.16:
        rd_kafka_enq_once_del_source_return assertion, ingest during a broker restart)."""
        producer = clients.transactional_producer(self._common, self.transactional_id, **self._overrides)
        while True:
            try:
                producer.init_transactions(self._timeout)
                return producer
            except KafkaException as exc:
                if classify(exc) is TxnErrorClass.FATAL:
                    raise FencedError(str(exc)) from exc
                err = kafka_error(exc)
                if err is not None and not err.retriable() and err.code() != KafkaError._TIMED_OUT:
                    # Not resumable: start over with a new producer (nothing is in flight on this one).
                    producer = clients.transactional_producer(self._common, self.transactional_id, **self._overrides)
                log.warning("init_transactions(%s): %s; retrying", self.transactional_id, exc)
                if self._stop.wait(1.0):
                    raise FencedError("stopped before the producer could initialise") from exc

    def recreate(self) -> None:
        """After an indefinite commit/abort. librdkafka has no client side of KIP-890: a late
        EndTxn could land on our next transaction, so never retry blindly; a new producer bumps
        the epoch and the coordinator settles the old transaction first."""
        self.recreated += 1
        self._producer = self._init()

    def transact(self, body: Callable[[], T]) -> Transacted[T]:
        """begin, ``body`` (produce, send offsets), commit: the one place that decides what a
        failed transaction means. An abortable error aborts (ABORTED); an unknown outcome
        recreates the producer, whose epoch bump settles the old transaction (UNKNOWN); a fence
        raises FencedError. Callers only choose what to do next (retry, rewind, tell a client)."""
        try:
            self.begin()
            value = body()
            self.commit()
        except IndefiniteOutcome as exc:
            self.recreate()
            return Transacted(TxnOutcome.UNKNOWN, error=exc)
        except KafkaException as exc:
            self.abort()
            return Transacted(TxnOutcome.ABORTED, error=exc)
        return Transacted(TxnOutcome.COMMITTED, value)

    def begin(self) -> None:
        self._call(self._producer.begin_transaction)

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        while True:
            try:
                # The per-record hot path: call librdkafka directly, classify only on error.
                self._producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let deliveries drain, then go on
                self._producer.poll(0.1)
            except KafkaException as exc:
                self._call(functools.partial(_reraise, exc))

    def flush(self) -> None:
        """Deliver everything produced so far (inside the transaction); abortable if it cannot."""
        remaining = self._call(lambda: self._producer.flush(self._timeout))
        if remaining:
            raise self.abortable(f"{remaining} messages not delivered within {self._timeout}s")

    @staticmethod
    def abortable(reason: str) -> KafkaException:
        return KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, reason, txn_requires_abort=True))

    def send_offsets(self, offsets: list[TopicPartition], consumer: Consumer) -> None:
        """The consumer's next positions, committed with the transaction (KIP-447: the group
        metadata fences a zombie that lost the partitions)."""
        metadata = consumer.consumer_group_metadata()
        self._call(lambda: self._producer.send_offsets_to_transaction(offsets, metadata, self._timeout), retry=True)

    def commit(self) -> None:
        self._until_answered("commit_transaction", lambda: self._producer.commit_transaction(self._timeout))
        self._producer.poll(0)  # serve delivery reports now: they carry offsets callers track

    def abort(self) -> None:
        """Abort; if that fails outright, recreate the producer (which aborts for us)."""
        try:
            self._until_answered("abort_transaction", lambda: self._producer.abort_transaction(self._timeout))
        except (IndefiniteOutcome, KafkaException) as exc:
            log.warning("abort failed (%s); recreating the producer", exc)
            self.recreate()

    def _until_answered(self, what: str, call: Callable[[], Any]) -> Any:
        """A call that ends a transaction (commit, abort), made again while it times out, for up
        to _RESUME_S: librdkafka then resumes the same EndTxn ("retry call to resume"), so the
        answer, when it comes, is this transaction's. The producer is never replaced while such a
        call is in flight: destroying it then aborted whole services with a librdkafka 2.16
        assertion (rd_kafka_enq_once_del_source_return) across broker restarts, first from a
        replaced abort, then from a commit whose timeout was taken as an unknown outcome. A call
        that outlasts the resumes is a client stuck on a coordinator it will not find again
        (librdkafka #5511): the process exits for a restart, a crash the protocol is proven
        against, and the next instance's init_transactions settles the transaction. Anything but
        a timeout (or a timeout while stopping) is raised as ``_call`` translated it."""
        deadline = time.monotonic() + _RESUME_S
        while True:
            try:
                return self._call(call, retry=True, indefinite_on_retriable=True)
            except (IndefiniteOutcome, KafkaException) as exc:
                if not _timed_out(exc) or self._stop.is_set():
                    raise
                if time.monotonic() >= deadline:
                    self._watchdog.give_up(f"{what} still unanswered after {_RESUME_S:.0f} s ({exc})")
                log.warning("%s timed out (%s); resuming it", what, exc)

    def _call(self, call: Callable[[], Any], retry: bool = False, indefinite_on_retriable: bool = False) -> Any:
        """Run one producer call, retrying retriable errors, and translate the rest:
        FencedError (fatal), IndefiniteOutcome (unknown result) or KafkaException (abortable).
        ``indefinite_on_retriable`` marks the calls that end a transaction (commit, abort):
        only their timeouts leave the outcome unknown. Any other call times out before EndTxn
        is sent, so the transaction can still be aborted."""
        resumed = False
        for attempt in range(1, _RETRIES + 1):
            try:
                # Each call is bounded by its own timeout; 10 s past it means librdkafka hung (a
                # controller kill on the cluster cost 121 s to recover with twice the timeout + 15).
                with self._watchdog.guard(getattr(call, "__qualname__", "call"), self._timeout + _HUNG_AFTER_S):
                    return call()
            except KafkaException as exc:
                kind = classify(exc)
                if kind is TxnErrorClass.FATAL:
                    raise FencedError(str(exc)) from exc
                err = kafka_error(exc)
                timed_out = err is not None and err.code() == KafkaError._TIMED_OUT
                if err is not None and timed_out and retry and not resumed and err.retriable():
                    # librdkafka resumes a timed-out call when it is made again. A process that
                    # was frozen mid-call (a zombie: SIGSTOP, a long pause) times out the moment
                    # it resumes; asking again lets the broker say "fenced" before anything
                    # would recreate the producer and, with it, fence its own replacement.
                    resumed = True
                    log.warning("timed out (%s); resuming the call once", exc)
                    continue
                if timed_out and not indefinite_on_retriable:
                    raise  # abortable: no EndTxn was sent
                if kind is TxnErrorClass.INDEFINITE:
                    raise IndefiniteOutcome(str(exc)) from exc
                if kind is TxnErrorClass.RETRIABLE and retry and attempt < _RETRIES:
                    log.warning("retriable error (attempt %d): %s", attempt, exc)
                    time.sleep(0.2 * attempt)
                    continue
                if kind is TxnErrorClass.RETRIABLE and indefinite_on_retriable:
                    raise IndefiniteOutcome(str(exc)) from exc
                raise
        raise AssertionError("unreachable")


class AtLeastOnceProducer(TransactionalProducer):
    """The same calls without a transaction: outputs are flushed before the consumer's offsets
    are committed, so a crash re-delivers a batch (duplicates downstream) but never skips one.
    A record the broker refused (too large, say) fails the flush, as it would fail a
    transaction's commit: the batch is then processed again rather than its offsets committed.
    Nothing is fenced and nothing can be aborted: an "aborted" batch is simply processed again."""

    def _init(self) -> Producer:
        self._undelivered: KafkaError | None = None
        return clients.idempotent_producer(self._common, **self._overrides)

    def begin(self) -> None:
        self._undelivered = None

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        if on_delivery is None:
            super().produce(topic, value, key, partition, headers, self._note_delivery)
            return

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self._note_delivery(err, msg)
            on_delivery(err, msg)

        super().produce(topic, value, key, partition, headers, delivered)

    def _note_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._undelivered = err

    def flush(self) -> None:
        super().flush()
        if self._undelivered is not None:
            raise self.abortable(f"a record was not delivered: {self._undelivered}")

    def send_offsets(self, offsets: list[TopicPartition], consumer: Consumer) -> None:
        self.flush()
        # Asynchronous, as Kafka Streams' at-least-once commits: a lost commit only re-delivers.
        consumer.commit(offsets=offsets, asynchronous=True)

    def commit(self) -> None:
        self.flush()

    def abort(self) -> None:
        self._undelivered = None


def open_producer(
    common: CommonSettings, transactional_id: str, call_timeout_s: float = 30.0, stop: threading.Event | None = None
) -> TransactionalProducer:
    """The producer for ``common.processing_guarantee``."""
    faults.refuse_weaker_guarantee(common.processing_guarantee)
    kind = AtLeastOnceProducer if common.processing_guarantee == "at_least_once" else TransactionalProducer
    return kind(common, transactional_id, call_timeout_s, stop=stop)
