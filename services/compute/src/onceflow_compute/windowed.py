"""The merge hop of a windowed job: partials per key and event-time bucket in, panes out.

Each owned ``compute.partials`` partition has a :class:`WindowedAggregation` over the keys it
owns, restored from the partition's store (``compute.changelog``: a key's panes, and the latest
watermark each ``dedup.records`` partition reported). The partition's watermark is the minimum
over every input partition once all have reported. After each batch the engine fires what is
due; the firings become result changes (retractions first) and the changed keys' panes go to
the changelog, all in the batch's transaction. The engine is a cache of committed state plus
the open batch: when a batch is abandoned, :meth:`on_rollback` reloads it from the stores.
"""

from __future__ import annotations

import json
import logging

from onceflow.state.stores import PartitionStores
from onceflow.state.overlay import StateTransaction
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import PartialAggregate, SourceWatermark
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, encode_json
from onceflow_compute.dataflow.panes import Firing, WindowedAggregation
from onceflow_compute.stages import result_change, state_key

log = logging.getLogger(__name__)


class SourceWatermarks:
    """What each merge partition knows of event time: the latest watermark every
    ``dedup.records`` partition reported to it, and how many there are. Kept in the partition's
    store under ``job\x01<source partition>`` next to the job's state."""

    def __init__(self, job: str) -> None:
        self._prefix = f"{job}\x01".encode()
        self._marks: dict[int, dict[int, int]] = {}
        self._count: dict[int, int] = {}

    def forget(self, partition: int) -> None:
        self._marks.pop(partition, None)
        self._count.pop(partition, None)

    def restore(self, partition: int, key: bytes, value: bytes) -> bool:
        """Take one stored entry if it is a source watermark."""
        if not key.startswith(self._prefix):
            return False
        mark, count = json.loads(value)
        self._marks.setdefault(partition, {})[int(key[len(self._prefix) :])] = mark
        self._count[partition] = count
        return True

    def note(self, partition: int, mark: SourceWatermark, reported: set[int]) -> None:
        marks = self._marks.setdefault(partition, {})
        if mark.watermark_ms > marks.get(mark.partition, mark.watermark_ms - 1):
            marks[mark.partition] = mark.watermark_ms
            self._count[partition] = mark.partitions
            reported.add(mark.partition)

    def watermark(self, partition: int) -> int | None:
        """The minimum over every dedup.records partition, once each has reported."""
        marks = self._marks.get(partition, {})
        count = self._count.get(partition, 0)
        if not count or len(marks) < count:
            return None
        return min(marks.values())

    def persist(self, state: StateTransaction, partition: int, reported: set[int]) -> None:
        count = self._count.get(partition, 0)
        for source in reported:
            state.put(self._prefix + str(source).encode(), encode_json([self._marks[partition][source], count]))


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


class WindowedMergeStage:
    name = "compute-merge"

    def __init__(self, job: Aggregation, results_topic: str, counts: stats.JobCounts) -> None:
        self.job = job
        self._results_topic = results_topic
        self.counts = counts
        # The merge loop's stores, set once the loop exists (the loop restores them on assign).
        self.stores: PartitionStores | None = None
        self._engines: dict[int, WindowedAggregation] = {}
        self.sources = SourceWatermarks(job.name)
        self._pane_prefix = f"{job.name}\x00".encode()

    # -- state ---------------------------------------------------------------------------

    def on_assign(self, partitions: list[int]) -> None:
        for partition in partitions:
            self._load(partition)

    def on_revoke(self, partitions: list[int]) -> None:
        for partition in partitions:
            self._engines.pop(partition, None)
            self.sources.forget(partition)

    def on_rollback(self) -> None:
        for partition in list(self._engines):
            self._load(partition)

    def _load(self, partition: int) -> None:
        assert self.stores is not None
        engine = windowed_engine(self.job)
        self.sources.forget(partition)
        for key, value in self.stores[partition].items():
            if key.startswith(self._pane_prefix):
                engine.restore(key[len(self._pane_prefix) :].decode(), json.loads(value))
            else:
                self.sources.restore(partition, key, value)
        engine.changed_keys.clear()
        self._engines[partition] = engine
        engine.advance_watermark(self.sources.watermark(partition))

    def watermarks(self) -> dict[int, int | None]:
        return {p: self.sources.watermark(p) for p in sorted(self._engines)}

    # -- a batch -------------------------------------------------------------------------

    def process(self, batch: Batch) -> None:
        touched: dict[int, set[int]] = {}
        for record in batch.records:
            partition = record.partition()
            reported = touched.setdefault(partition, set())
            try:
                partial = PartialAggregate.FromString(record.value() or b"")
                if partial.job != self.job.name:
                    continue  # another job's partial
                if partial.HasField("watermark"):
                    self.sources.note(partition, partial.watermark, reported)
                else:
                    self._add(partition, partial)
            except Exception as exc:  # noqa: BLE001 - one bad partial must not stop the stream
                batch.dead_letter(record, exc)
        changes = 0
        for partition, reported in touched.items():
            changes += self._fire(batch, partition, reported)
        self._count_after_commit(batch, changes)

    def _add(self, partition: int, partial: PartialAggregate) -> None:
        values = json.loads(partial.partials)
        if not isinstance(values, list) or len(values) != len(self.job.aggregates):
            raise ValueError(f"partials of {partial.key!r}: expected {len(self.job.aggregates)} values, got {values!r}")
        encode_json(self.job.row(partial.key, values))  # a partial whose row cannot be built is poison
        engine = self._engines[partition]
        if not engine.add(partial.key, partial.bucket_ms, values):
            # The map hop let it through at its partition's watermark; this partition's watermark
            # cannot be ahead of that, so this only happens if the windows changed underneath.
            log.warning("%s: partial for %r at %d arrived after its windows expired", self.name, partial.key, partial.bucket_ms)

    def _fire(self, batch: Batch, partition: int, reported: set[int]) -> int:
        engine = self._engines[partition]
        engine.advance_watermark(self.sources.watermark(partition))
        changes = 0
        for firing in engine.fire(batch.now_ms):
            kafka_key = state_key(self.job.name, firing.key)
            for result_key, op, row in firing_changes(self.job, firing):
                batch.emit(self._results_topic, result_change(self.job.name, result_key, op, row), key=kafka_key)
                changes += 1
        state = batch.state(partition)
        for key in engine.changed_keys:
            snapshot = engine.snapshot(key)
            skey = state_key(self.job.name, key)
            if snapshot is None:
                state.delete(skey)
            else:
                state.put(skey, encode_json(snapshot))
        engine.changed_keys.clear()
        self.sources.persist(state, partition, reported)
        return changes

    def _count_after_commit(self, batch: Batch, changes: int) -> None:
        def count() -> None:
            self.counts.results += changes
            stats.RESULTS.labels(self.job.name).inc(changes)

        batch.after_commit.append(count)
