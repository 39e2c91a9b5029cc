"""The merge hop of a windowed job: partials per key and event-time bucket in, panes out.

Each owned ``compute.partials`` partition has a :class:`WindowedAggregation` over the keys it
owns, restored from the partition's store (``compute.changelog``: a key's panes, and the latest
watermark each ``dedup.records`` partition reported). The partition's watermark is the minimum
over every input partition once all have reported. After each batch the engine fires what is
due; the firings become result changes (retractions first) and the changed keys' panes go to
the changelog, all in the batch's transaction (the state's life cycle: event_merge.py).
"""

from __future__ import annotations

import json
import logging

from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, encode_json
from onceflow_compute.dataflow.panes import Firing, WindowedAggregation
from onceflow_compute.event_merge import KeyedEventTimeMerge
from onceflow_compute.stages import result_change, state_key

log = logging.getLogger(__name__)


def windowed_engine(job: Aggregation) -> WindowedAggregation:
    return WindowedAggregation(
        job.window,
        job.merge,
        job.window_row,
        trigger=job.trigger,
        accumulation=job.accumulation,
        allowed_lateness_ms=job.allowed_lateness_ms,
    )


def firing_changes(job: Aggregation, firing: Firing) -> list[tuple[str, ResultChange.Op.ValueType, dict]]:
    """A firing as result changes: (result key, op, row), retractions first."""
    changes: list[tuple[str, ResultChange.Op.ValueType, dict]] = [
        (job.result_key(firing.key, window), ResultChange.RETRACT, row) for window, row in firing.retractions
    ]
    changes.append((job.result_key(firing.key, firing.window, firing.index), ResultChange.UPSERT, firing.row))
    return changes


class WindowedMergeStage(KeyedEventTimeMerge[WindowedAggregation]):
    def __init__(self, job: Aggregation, results_topic: str, counts: stats.JobCounts) -> None:
        super().__init__(job, results_topic, counts)
        self.job: Aggregation = job

    def _new_state(self) -> WindowedAggregation:
        return windowed_engine(self.job)

    def _loaded(self, partition: int, engine: WindowedAggregation) -> None:
        engine.advance_watermark(self.sources.watermark(partition))

    def punctuate(self, batch: Batch) -> None:
        """Processing time passes while no partials arrive: early panes still fire every
        ``early_every_ms`` (the shared loop calls this every ``ONCEFLOW_LOOP_PUNCTUATE_MS``)."""
        if self.job.trigger.early_every_ms is None:
            return  # only early firings are due by processing time
        changes = sum(self._after_batch(batch, partition, set()) for partition in list(self._states))
        self._count_after_commit(batch, changes)

    def _take(self, partition: int, partial: PartialAggregate) -> None:
        values = json.loads(partial.partials)
        if not isinstance(values, list) or len(values) != len(self.job.aggregates):
            raise ValueError(f"partials of {partial.key!r}: expected {len(self.job.aggregates)} values, got {values!r}")
        encode_json(self.job.row(partial.key, values))  # a partial whose row cannot be built is poison
        engine = self._states[partition]
        if not engine.add(partial.key, partial.bucket_ms, values):
            # The map hop let it through at its partition's watermark and sends that watermark
            # after the batch's partials (EventTimeGate.emit_watermarks), so this partition's
            # watermark cannot be ahead of it here: only if the windows changed underneath.
            log.warning("%s: partial for %r at %d arrived after its windows expired", self.name, partial.key, partial.bucket_ms)

    def _after_batch(self, batch: Batch, partition: int, reported: set[int]) -> int:
        """Fire what is due, then persist the changed panes."""
        engine = self._states[partition]
        engine.advance_watermark(self.sources.watermark(partition))
        changes = 0
        for firing in engine.fire(batch.now_ms):
            for result_key, op, row in firing_changes(self.job, firing):
                # Keyed by the result row: compute.results is compacted per row (the sink rebuilds a
                # table from it), and a row's changes stay in order on one partition.
                kafka_key = state_key(self.job.name, result_key)
                batch.emit(self._results_topic, result_change(self.job.name, result_key, op, row), key=kafka_key)
                changes += 1
        self._persist(batch, partition, reported)
        return changes
