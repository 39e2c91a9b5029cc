"""The merge hop of a windowed job: partials per key and event-time bucket in, panes out.

Each owned ``compute.partials.<job>`` partition has a :class:`WindowedAggregation` over the keys it
owns, restored from the partition's store (``compute.changelog.<job>``: a key's panes, and the latest
watermark each ``dedup.records`` partition reported). The partition's watermark is the minimum
over every input partition once all have reported. After each batch the engine fires what is
due; the firings become result changes (retractions first) and the changed keys' panes go to
the changelog, all in the batch's transaction (the state's life cycle: event_time.py).
"""

from __future__ import annotations

import logging

from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, JSONValue, encode_json
from onceflow_compute.dataflow.panes import Firing, WindowedAggregation
from onceflow_compute.merge.event_time import KeyedEventTimeMerge

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


def firing_changes(job: Aggregation, firing: Firing) -> list[tuple[str, ResultChange.Op, dict[str, JSONValue]]]:
    """A firing as result changes: (result key, op, row), retractions first. Rows the job's
    ``having`` leaves out of the table were never upserted, so they are not retracted either."""
    changes: list[tuple[str, ResultChange.Op, dict[str, JSONValue]]] = [
        (job.result_key(firing.key, window), ResultChange.RETRACT, row) for window, row in firing.retractions if job.shown(row)
    ]
    if job.shown(firing.row):
        changes.append((job.result_key(firing.key, firing.window, firing.index), ResultChange.UPSERT, firing.row))
    return changes


class WindowedMergeStage(KeyedEventTimeMerge[WindowedAggregation]):
    def __init__(self, job: Aggregation, results_topic: str, counts: stats.JobCounts) -> None:
        super().__init__(job, results_topic, counts)
        self.job: Aggregation = job

    def new_state(self) -> WindowedAggregation:
        return windowed_engine(self.job)

    def loaded(self, partition: int, engine: WindowedAggregation) -> None:
        engine.advance_watermark(self.sources.watermark(partition))

    def punctuate(self, batch: Batch[MemoryStore]) -> None:
        """Processing time passes while no partials arrive: early panes still fire every
        ``early_every_ms`` (the shared loop calls this every ``ONCEFLOW_LOOP_PUNCTUATE_MS``)."""
        if self.job.trigger.early_every_ms is None:
            return  # only early firings are due by processing time
        changes = sum(self.after_batch(batch, partition, set()) for partition in list(self.states))
        self.count_after_commit(batch, changes)

    def take(self, partition: int, partial: PartialAggregate) -> None:
        values = self.layout.partials(partial)
        encode_json(self.job.row(partial.key, values))  # a partial whose row cannot be built is poison
        engine = self.states[partition]
        if not engine.add(partial.key, partial.bucket_ms, values):
            # The map hop let it through at its partition's watermark and sends that watermark
            # after the batch's partials (EventTimeGate.emit_watermarks), so this partition's
            # watermark cannot be ahead of it here: only if the windows changed underneath.
            log.warning("%s: partial for %r at %d arrived after its windows expired", self.name, partial.key, partial.bucket_ms)

    def after_batch(self, batch: Batch[MemoryStore], partition: int, reported: set[int]) -> int:
        """Fire what is due, then persist the changed panes."""
        engine = self.states[partition]
        engine.advance_watermark(self.sources.watermark(partition))
        changes = 0
        for firing in engine.fire(batch.now_ms):
            for result_key, op, row in firing_changes(self.job, firing):
                self.emit_change(batch, result_key, op, row)
                changes += 1
        self.persist(batch, partition, reported)
        return changes
