"""What every merge-hop stage shares (stage ``compute-merge``, stateful, no engine: a plain
aggregation's in aggregation.py, a windowed one's in windowed.py, a join's in joined.py): the
job, where its result changes go and how they are keyed, the anchors that carry each partial's
tuple trees on to the result changes (docs/decisions/0016), and counting them once committed."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Job, JSONValue
from onceflow_compute.merge.layout import StateLayout
from onceflow_compute.results import result_change, state_key

log = logging.getLogger(__name__)


class MergeHop:
    name = "compute-merge"

    def __init__(self, job: Job, results_topic: str, counts: stats.JobCounts) -> None:
        self.job = job
        self.results_topic = results_topic
        self.counts = counts
        # The state fingerprint: checked on assignment, written with the state (layout.py).
        self.layout = StateLayout(job)

    def on_assign(self, partitions: list[int], stores: Mapping[int, MemoryStore]) -> None:
        self.layout.on_assign(partitions, stores)

    def on_revoke(self, partitions: list[int]) -> None:
        self.layout.on_revoke(partitions)

    @staticmethod
    def consumed(batch: Batch[MemoryStore], partial: PartialAggregate) -> None:
        """Call once per decoded partial, before it can fail: merged or dead-lettered, its trees
        go on with this batch's result changes (or end here, if it emits none). An anchor this
        acker.acks cannot hold (written for more partitions than it has) is dropped, not the
        partial: its trees time out and their replays are settled at the gate."""
        if partial.HasField("anchor"):
            try:
                batch.consumed(partial.anchor)
            except ValueError as exc:
                log.warning("partial for %r: its anchor is ignored: %s", partial.key, exc)

    def emit_change(self, batch: Batch[MemoryStore], result_key: str, op: ResultChange.Op, row: dict[str, JSONValue]) -> None:
        # Keyed by the result row: compute.results is compacted per row (the sink rebuilds a table
        # from it), and a row's changes stay in order on one results partition.
        value = result_change(self.job.name, result_key, op, row, batch.anchor(), self.layout.fingerprint)
        batch.emit(self.results_topic, value, key=state_key(self.job.name, result_key))

    def count_after_commit(self, batch: Batch[MemoryStore], changes: int) -> None:
        def count() -> None:
            self.counts.results += changes
            stats.RESULTS.labels(self.job.name).inc(changes)

        batch.after_commit.append(count)
