"""Group commit: concurrent callers' records share one Kafka transaction, and every caller is
answered only after that transaction has committed (or has certainly not)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from onceflow import faults, metrics
from onceflow.config import CommonSettings
from onceflow.txn.errors import FencedError, IndefiniteOutcome
from onceflow.txn.producer import TransactionalProducer

log = logging.getLogger(__name__)

# (Kafka key = record_id, value = serialized Envelope)
KafkaRecord = tuple[bytes, bytes]

_ABORT_RETRIES = 3


class Overloaded(Exception):
    """More records pending than max_pending allows."""


class NotCommitted(Exception):
    """The records were certainly not committed; the caller may retry them."""


class OutcomeUnknown(Exception):
    """The transaction's result is unknown; retrying with the same record_ids is safe because
    the dedup gate drops whatever landed twice."""


@dataclass(eq=False)
class Submission:
    records: list[KafkaRecord]
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None
    commit_id: int = 0

    def wait(self, timeout_s: float) -> int:
        if not self.done.wait(timeout_s):
            raise OutcomeUnknown(f"no commit within {timeout_s:.0f}s")
        if self.error is not None:
            raise self.error
        return self.commit_id


@dataclass
class CommitterStats:
    committed: int = 0
    aborted: int = 0
    records: int = 0
    last_error: str = ""


class GroupCommitter:
    def __init__(
        self,
        common: CommonSettings,
        topic: str,
        transactional_id: str,
        max_pending: int,
        max_transaction_records: int,
        call_timeout_s: float = 30.0,
    ) -> None:
        self._topic = topic
        self._max_pending = max_pending
        self._max_txn = max_transaction_records
        self._queue: queue.Queue[Submission] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._closing = threading.Event()
        self.fenced = threading.Event()
        self.stats = CommitterStats()
        self._producer = TransactionalProducer(common, transactional_id, call_timeout_s, stop=self._closing)
        self._thread = threading.Thread(target=self._run, name="ingest-committer", daemon=True)

    @property
    def pending(self) -> int:
        return self._pending

    def start(self) -> None:
        self._thread.start()

    def submit(self, records: list[KafkaRecord], block_s: float = 0.0) -> Submission:
        """Queue records for the next transaction. Raises Overloaded when max_pending would be
        exceeded after waiting up to ``block_s`` for room."""
        if self._closing.is_set() or self.fenced.is_set():
            raise NotCommitted("ingest is shutting down")
        count = len(records)
        deadline = time.monotonic() + block_s
        with self._space:
            while self._pending + count > self._max_pending and self._pending > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Overloaded(f"{self._pending} records pending, max_pending is {self._max_pending}")
                self._space.wait(remaining)
            self._pending += count
        metrics.PENDING.labels("ingest").set(self._pending)
        submission = Submission(records)
        self._queue.put(submission)
        return submission

    def close(self, timeout_s: float) -> None:
        """Commit everything queued, then stop."""
        self._closing.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            group, count = [first], len(first.records)
            while count < self._max_txn:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                group.append(nxt)
                count += len(nxt.records)
            self._commit(group, count)
            if self.fenced.is_set():
                self._fail_queued(NotCommitted("this ingest instance was fenced by a newer one"))
                return

    def _commit(self, group: list[Submission], count: int) -> None:
        started = time.monotonic()
        error: Exception | None = None
        for attempt in range(1, _ABORT_RETRIES + 1):
            try:
                self._transact(group)
                error = None
                break
            except FencedError as exc:
                log.error("fenced: another instance owns %s; stopping: %s", self._producer.transactional_id, exc)
                self.fenced.set()
                error = NotCommitted("this ingest instance was fenced by a newer one")
                break
            except IndefiniteOutcome as exc:
                log.warning("commit outcome unknown (%s); recreating the producer", exc)
                self._note_abort(str(exc))
                self._producer.recreate()
                error = OutcomeUnknown(f"commit outcome unknown: {exc}")
                break
            except KafkaException as exc:
                log.warning("transaction aborted (attempt %d): %s", attempt, exc)
                self._note_abort(str(exc))
                self._producer.abort()
                error = NotCommitted(f"transaction aborted: {exc}")
        commit_id = self.stats.committed
        for submission in group:
            submission.error = error
            submission.commit_id = commit_id
            submission.done.set()
        with self._space:
            self._pending -= count
            self._space.notify_all()
        metrics.PENDING.labels("ingest").set(self._pending)
        if error is None:
            metrics.COMMIT_SECONDS.labels("ingest").observe(time.monotonic() - started)
            metrics.BATCH_RECORDS.labels("ingest").observe(count)

    def _transact(self, group: list[Submission]) -> None:
        producer = self._producer
        producer.begin()
        faults.point("before_produce")
        for submission in group:
            for key, value in submission.records:
                producer.produce(self._topic, value, key=key)
        faults.point("after_produce")
        producer.commit()
        faults.point("after_commit")
        records = sum(len(s.records) for s in group)
        self.stats.committed += 1
        self.stats.records += records
        metrics.TRANSACTIONS.labels("ingest", "committed").inc()
        metrics.RECORDS_OUT.labels("ingest").inc(records)

    def _note_abort(self, message: str) -> None:
        self.stats.aborted += 1
        self.stats.last_error = message
        metrics.TRANSACTIONS.labels("ingest", "aborted").inc()

    def _fail_queued(self, error: Exception) -> None:
        while True:
            try:
                submission = self._queue.get_nowait()
            except queue.Empty:
                return
            submission.error = error
            submission.done.set()
