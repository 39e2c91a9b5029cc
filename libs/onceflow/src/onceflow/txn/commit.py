"""The one commit strategy every committer runs, the loop's, the sink's and ingest's group
committer's (Flink's TwoPhaseCommitSinkFunction template, Quix's Checkpoint): begin, write,
the positions (through the intake, so they commit with the writes), commit; then, once it
committed, what the committer does after (apply a state overlay, settle waiters) and the count.
Each committer keeps its own stats (what its Status reports); this counts into them and into
the `onceflow_transactions_total` metric the same way for all three."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from onceflow import faults, metrics
from onceflow.txn.producer import Transacted, TransactionalProducer


class TransactionStats(Protocol):
    committed: int
    aborted: int
    last_error: str


def count_committed(name: str, stats: TransactionStats) -> None:
    stats.committed += 1
    metrics.TRANSACTIONS.labels(name, "committed").inc()


def count_aborted(name: str, stats: TransactionStats, why: str) -> None:
    """A transaction that did not commit (aborted, or its outcome unknown), and why."""
    stats.aborted += 1
    stats.last_error = why
    metrics.TRANSACTIONS.labels(name, "aborted").inc()


def commit(
    name: str,
    producer: TransactionalProducer,
    stats: TransactionStats,
    write: Callable[[], None],
    *,
    positions: Callable[[], None] | None = None,
    after_commit: Callable[[], None] | None = None,
) -> Transacted[None]:
    """One transaction: ``write`` then ``positions`` inside it; committed, the `after_commit`
    fault point, ``after_commit``, and the count. Not committed (aborted, or its outcome unknown
    and the producer recreated): counted, with the reason in ``stats.last_error``, and returned
    for the committer to retry or rewind. Fenced is no outcome: `FencedError` propagates."""

    def body() -> None:
        write()
        if positions is not None:
            positions()

    result = producer.transact(body)
    if not result.committed:
        count_aborted(name, stats, f"transaction {result.outcome.value}: {result.error}")
        return result
    faults.point("after_commit")
    if after_commit is not None:
        after_commit()
    count_committed(name, stats)
    return result
