"""Group commit: concurrent callers' records share one Kafka transaction, and every caller is
answered only after that transaction has committed (or has certainly not)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from onceflow import faults, metrics, spout
from onceflow.config import CommonSettings
from onceflow.spout import NewRecord
from onceflow.trees import InFlightTrees, Waiter
from onceflow.txn.batching import Batcher, BatchPolicy
from onceflow.txn.commit import commit, count_aborted
from onceflow.txn.errors import FencedError
from onceflow.txn.producer import TxnOutcome, open_producer


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Acking:
    """What the committer needs to start tuple trees: INITs go with the records."""

    trees: InFlightTrees
    inits: spout.Inits

_ABORT_RETRIES = 3
FENCE_WINDOW_S = 30.0


class Overloaded(Exception):
    """More records pending than max_pending allows."""


class NotCommitted(Exception):
    """The records were certainly not committed; the caller may retry them."""


class OutcomeUnknown(Exception):
    """The transaction's result is unknown; retrying with the same record_ids is safe because
    the dedup gate drops whatever landed twice."""


@dataclass(eq=False)
class Submission:
    records: list[NewRecord]
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
        linger_ms: int = 0,
        call_timeout_s: float = 30.0,
        acking: Acking | None = None,
    ) -> None:
        self._topic = topic
        self._acking = acking
        self._max_pending = max_pending
        self._queue: queue.Queue[Submission] = queue.Queue()
        # The shared batching policy; a call's records are never split over transactions.
        self._batcher: Batcher[Submission] = Batcher(
            BatchPolicy(max_items=max_transaction_records, first_wait_s=0.1, linger_s=linger_ms / 1000),
            self._take,
            size=lambda submission: len(submission.records),
        )
        self._pending = 0
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._closing = threading.Event()
        self.fenced = threading.Event()
        self.died = threading.Event()
        self._last_fence = float("-inf")
        self.stats = CommitterStats()
        self._producer = open_producer(common, transactional_id, call_timeout_s, stop=self._closing)
        self._thread = threading.Thread(target=self._run, name="ingest-committer", daemon=True)

    @property
    def pending(self) -> int:
        """Records not yet committed, or (with acking) trees not yet decided."""
        return len(self._acking.trees) if self._acking else self._pending

    def start(self) -> None:
        self._thread.start()

    def submit(self, records: list[NewRecord], block_s: float = 0.0, waiter: Waiter | None = None) -> Submission:
        """Queue records for the next transaction. Raises Overloaded when max_pending would be
        exceeded after waiting up to ``block_s`` for room."""
        if self._closing.is_set() or self.fenced.is_set():
            raise NotCommitted("ingest is shutting down")
        count = len(records)
        deadline = time.monotonic() + block_s
        with self._space:
            # An oversized call into an idle ingest goes through rather than never fitting.
            while self.pending + count > self._max_pending and self.pending > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Overloaded(f"{self.pending} records pending, max_pending is {self._max_pending}")
                # Trees complete without notifying: poll as well as wait.
                self._space.wait(min(remaining, 0.05))
            self._pending += count
            if self._acking is not None:
                self._acking.trees.add([(r.root_id, r.record_id.decode()) for r in records], waiter)
        metrics.PENDING.labels("ingest").set(self.pending)
        submission = Submission(records)
        self._queue.put(submission)
        return submission

    def close(self, timeout_s: float) -> None:
        """Commit everything queued, then stop."""
        self._closing.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:
            # Never leave a process that accepts calls but cannot commit: the service exits.
            log.exception("the committer thread died")
            self.died.set()
            self._fail_queued(NotCommitted("the ingest committer stopped"))
            raise

    def _serve(self) -> None:
        while True:
            group = self._batcher.gather()
            if not group:
                if self._closing.is_set():
                    return
                continue
            self._commit(group, sum(len(submission.records) for submission in group))
            if self.fenced.is_set():
                self._fail_queued(NotCommitted("this ingest instance was fenced by a newer one"))
                return

    def _take(self, limit: int, timeout_s: float) -> list[Submission]:
        """Up to ``limit`` records' worth of queued calls, waiting up to ``timeout_s`` for them
        (the batcher's `Take`). A call that crosses the limit still goes whole."""
        taken: list[Submission] = []
        count = 0
        deadline = time.monotonic() + timeout_s
        while count < limit:
            remaining = deadline - time.monotonic()
            try:
                submission = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            taken.append(submission)
            count += len(submission.records)
        return taken

    def _commit(self, group: list[Submission], count: int) -> None:
        started = time.monotonic()
        error: Exception | None = None
        for attempt in range(1, _ABORT_RETRIES + 1):
            try:
                result = commit(
                    "ingest", self._producer, self.stats, lambda: self._write(group),
                    after_commit=lambda: self._count_records(group),  # noqa: B023 - called at once
                )
            except FencedError as exc:
                error = self._after_fence(exc)
                break
            if result.committed:
                error = None
                break
            if result.outcome is TxnOutcome.UNKNOWN:
                log.warning("commit outcome unknown (%s); the producer was recreated", result.error)
                error = OutcomeUnknown(f"commit outcome unknown: {result.error}")
                break
            log.warning("transaction aborted (attempt %d): %s", attempt, result.error)
            error = NotCommitted(f"transaction aborted: {result.error}")
        commit_id = self.stats.committed
        if error is not None and self._acking is not None:
            # Not committed, or unknown: either way no event is to be expected for certain.
            self._acking.trees.forget([r.root_id for s in group for r in s.records])
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

    def _write(self, group: list[Submission]) -> None:
        """The body of one group commit's transaction."""
        producer = self._producer
        faults.point("before_produce")
        records = [record for submission in group for record in submission.records]
        spout.produce_new_records(producer, self._topic, records, self._acking.inits if self._acking else None)
        faults.point("after_produce", before_crash=producer.flush)

    def _count_records(self, group: list[Submission]) -> None:
        records = sum(len(submission.records) for submission in group)
        self.stats.records += records
        metrics.RECORDS_OUT.labels("ingest").inc(records)

    def _after_fence(self, exc: FencedError) -> Exception:
        """Ingest has no consumer group, so its transactional.id is its only fence, and the
        broker also fences a producer whose transaction it timed out (across a broker restart,
        say). So one fence recreates the producer; a second within FENCE_WINDOW_S means another
        live instance has this name, and this one stops (exit 3)."""
        now = time.monotonic()
        self._note_abort(str(exc))
        if now - self._last_fence < FENCE_WINDOW_S:
            log.error("fenced again within %.0fs: another instance owns %s; stopping: %s",
                      FENCE_WINDOW_S, self._producer.transactional_id, exc)
            self.fenced.set()
            return NotCommitted("this ingest instance was fenced by a newer one")
        self._last_fence = now
        log.warning("producer fenced (%s): recreating it; a broker restart can do this, a second "
                    "fence soon after would mean another instance with this name", exc)
        try:
            self._producer.recreate()
        except FencedError as fatal:
            log.error("cannot recreate the producer: %s", fatal)
            self.fenced.set()
            return NotCommitted("this ingest instance was fenced by a newer one")
        return OutcomeUnknown(f"transaction fenced, outcome unknown: {exc}")

    def _note_abort(self, message: str) -> None:
        count_aborted("ingest", self.stats, message)

    def _fail_queued(self, error: Exception) -> None:
        while True:
            try:
                submission = self._queue.get_nowait()
            except queue.Empty:
                return
            submission.error = error
            submission.done.set()
