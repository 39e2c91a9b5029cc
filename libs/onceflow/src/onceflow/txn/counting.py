"""The bookkeeping of every committer's transactions, written once: the loop's, the sink's and
ingest's group committer's. Each keeps its own stats (what its Status reports); this counts
into them and into the `onceflow_transactions_total` metric the same way for all three."""

from __future__ import annotations

from typing import Protocol

from onceflow import metrics


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
