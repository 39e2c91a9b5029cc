"""The merge hop of a join job: both sides' rows per join key in, joined rows (and their
retractions) out.

Each owned ``compute.partials.<job>`` partition has a :class:`StreamJoin` over the join keys it owns,
restored from the partition's store (``compute.changelog.<job>``: ``job\\x00<join key>`` -> both sides'
rows; a windowed join also keeps the source watermarks, as windowed.py does). Every row added
becomes result changes at once, in the batch's transaction, with the changed keys' rows. A
windowed join drops a window's rows once the partition's watermark passes the window's end plus
the allowed lateness: the event-time gate lets no later row of that window through. As in
windowed.py, the joins are a cache of committed state plus the open batch, reloaded from the
stores when a batch is abandoned.
"""

from __future__ import annotations

import json
import logging

from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import JoinRow, PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Join, JSONValue
from onceflow_compute.dataflow.joins import JoinChange, StreamJoin
from onceflow_compute.merge.event_time import KeyedEventTimeMerge

log = logging.getLogger(__name__)

OPS = {"+": ResultChange.UPSERT, "-": ResultChange.RETRACT}


class JoinMergeStage(KeyedEventTimeMerge[StreamJoin]):
    def __init__(self, job: Join, results_topic: str, counts: stats.JobCounts) -> None:
        super().__init__(job, results_topic, counts)
        self.job: Join = job

    def new_state(self) -> StreamJoin:
        return StreamJoin(self.job.how, self.job.retention_ms)

    def rows_in_state(self) -> int:
        return sum(join.rows_in_state() for join in self.states.values())

    # -- a batch -------------------------------------------------------------------------

    def take(self, partition: int, partial: PartialAggregate) -> tuple[dict[str, JSONValue], int]:
        if not partial.HasField("join_row") or partial.join_row.side not in (JoinRow.LEFT, JoinRow.RIGHT):
            raise ValueError(f"record for join key {partial.key!r} carries no join row")
        row = json.loads(partial.join_row.row)
        if not isinstance(row, dict):
            raise ValueError(f"join row for {partial.key!r} is not a JSON object: {row!r}")
        return row, partial.join_row.side

    def apply(self, batch: Batch[MemoryStore], partition: int, partial: PartialAggregate, taken: tuple[dict[str, JSONValue], int]) -> int:
        row, side = taken
        join = self.states[partition]
        add = join.add_left if side == JoinRow.LEFT else join.add_right
        changes = add(partial.key, row, partial.join_row.event_time_ms)
        for change in changes:
            self._emit(batch, partial.key, change)
        return len(changes)

    def _emit(self, batch: Batch[MemoryStore], join_key: str, change: JoinChange) -> None:
        window = self.job.window_of_key(join_key)
        result_key = self.job.result_key(change.left, change.right, window)
        self.emit_change(batch, result_key, OPS[change.op], self.job.row(change.left, change.right, window))

    def after_batch(self, batch: Batch[MemoryStore], partition: int, reported: set[int]) -> int:
        """Drop the windows the watermark has closed, then persist the changed keys."""
        watermark = self.sources.watermark(partition)
        if watermark is not None:
            self.states[partition].expire(watermark)
        self.persist(batch, partition, reported)
        return 0
