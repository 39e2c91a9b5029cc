"""The two hops of a compute worker, both stages of the shared transactional loop.

map (stateless, the engine): dedup.records -> one Arrow table -> the job -> for an aggregation,
    one partial aggregate per group key to compute.partials (keyed by job and group key, so the
    key's state has one owner whatever the input's key was); for a join, each side's rows to
    compute.partials keyed by join key; for a transform, result rows straight to compute.results. The input's tuple trees end here: from this transaction on, the
    record's effect is durable in Kafka, and every later hop is a transaction too.
merge (stateful, no engine): compute.partials -> merge into the key's state (changelog-backed)
    -> for each key whose row changed, ``-old`` then ``+new`` to compute.results. (Windowed
    aggregations: windowed.py; joins: joined.py.)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
from confluent_kafka import Message

from onceflow import faults
from onceflow.codec import now_ms
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import JoinRow, PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Aggregation, Job, Join, JSONValue, Transform, encode_json
from onceflow_compute.dataflow.watermarks import WatermarkTracker
from onceflow_compute.engines import BUCKET, KEY, ROW, SIDE, TIME, Engine, partial_columns
from onceflow_compute.eventtime import EventTimeGate
from onceflow_compute.frames import Frame, build_frame
from onceflow_compute.job_runner import JobFailed, JobRunner

log = logging.getLogger(__name__)


def state_key(job: str, key: str) -> bytes:
    return f"{job}\x00{key}".encode()


def result_change(job: str, key: str, op: ResultChange.Op.ValueType, row: dict[str, JSONValue]) -> bytes:
    return ResultChange(job=job, key=key, op=op, value=encode_json(row)).SerializeToString()


class MapStage:
    name = "compute"

    def __init__(
        self,
        job: Job,
        engine: Engine,
        partials_topic: str,
        results_topic: str,
        counts: stats.JobCounts,
        bisect_budget: int = 64,
        watermarks: WatermarkTracker | None = None,
        event_time: EventTimeGate | None = None,
    ) -> None:
        self.job = job
        self.event_time = event_time
        self.watermarks = watermarks or WatermarkTracker(bound_ms=5_000, idle_timeout_ms=30_000)
        self.engine = engine
        self.runner = JobRunner(job, engine, bisect_budget)
        self._partials_topic = partials_topic
        self._results_topic = results_topic
        self.counts = counts

    def process(self, batch: Batch) -> None:
        frame = build_frame(batch.records, self.job.schema)
        for record, envelope, reason in frame.rejected:
            batch.dead_letter(record, reason)
            if envelope is not None:
                batch.ack(envelope)  # dead-lettered is processed: the tree ends here
        late, marks = 0, {}
        if self.event_time is not None:
            frame, late, marks = self.event_time.split(frame, batch)
        job_seconds: float | None = None
        emitted = 0
        if frame.table.num_rows:
            faults.point("before_job")
            started = time.monotonic()
            outputs, failed = self.runner.run(frame.table)
            job_seconds = time.monotonic() - started
            faults.point("after_job")
            for index, error in sorted(failed.items()):
                batch.dead_letter(frame.records[index], f"job {self.job.name} failed on this record: {error}")
            emitted = self._emit(outputs, batch)
        if self.event_time is not None:
            self.event_time.emit_watermarks(batch, marks)
        for envelope in frame.envelopes:
            batch.ack(envelope)
        self._count_after_commit(batch, job_seconds, emitted, late)
        self._advance_watermarks_after_commit(batch, frame)

    def on_assign(self, partitions: list[int], stores: Mapping[int, object]) -> None:
        self.watermarks.assign(partitions, now_ms())

    def on_revoke(self, partitions: list[int]) -> None:
        self.watermarks.revoke(partitions)

    def _advance_watermarks_after_commit(self, batch: Batch, frame: Frame) -> None:
        # Only committed input moves event time: an aborted batch is read again.
        column = getattr(self.job, "time_column", "_event_time_ms")
        if frame.table.num_rows and column in frame.table.column_names:
            event_times = frame.table.column(column).to_pylist()
        else:
            event_times = [e.event_time_ms for e in frame.envelopes]
        # Only each partition's newest time matters to the tracker: one observation per partition.
        newest: dict[int, int] = {}
        for record, t in zip(frame.records, event_times, strict=True):
            if t is not None and t > newest.get(record.partition(), t - 1):
                newest[record.partition()] = t
        at = batch.now_ms

        def advance() -> None:
            for partition, event_time in newest.items():
                self.watermarks.observe(partition, event_time, at)

        batch.after_commit.append(advance)

    def _emit(self, outputs: list[pa.Table], batch: Batch) -> int:
        job = self.job
        if isinstance(job, Transform):
            emitted = 0
            for table in outputs:
                if job.key not in table.column_names:
                    raise JobFailed(f"job {job.name}: the transform's output has no key column {job.key!r}")
                for row in table.to_pylist():
                    key = str(row[job.key])
                    value = result_change(job.name, key, ResultChange.UPSERT, row)
                    batch.emit(self._results_topic, value, key=state_key(job.name, key))
                    emitted += 1
            return emitted
        if isinstance(job, Join):
            return self._emit_join_rows(job, outputs, batch)
        # Bisection may have split the batch: merge the parts' partials per key (and bucket) first.
        merged: dict[tuple[str, int], list[JSONValue]] = {}
        for table in outputs:
            for key, bucket, partials in partials_by_key(job, table):
                at = (key, bucket)
                merged[at] = job.merge(merged[at], partials) if at in merged else partials
        for (key, bucket), partials in merged.items():
            value = PartialAggregate(job=job.name, key=key, partials=encode_json(partials), bucket_ms=bucket)
            # Keyed by the group key alone: all of a key's windows have one owner (sessions merge).
            batch.emit(self._partials_topic, value.SerializeToString(), key=state_key(job.name, key))
        return len(merged)

    def _emit_join_rows(self, job: Join, outputs: list[pa.Table], batch: Batch) -> int:
        emitted = 0
        for table in outputs:
            columns = [table.column(name).to_pylist() for name in (SIDE, KEY, TIME, ROW)]
            for side, on, event_time, row in zip(*columns, strict=True):
                key = job.join_key(on, job.window_of(event_time))
                joined = JoinRow(side=side, row=row.encode(), event_time_ms=event_time)
                value = PartialAggregate(job=job.name, key=key, join_row=joined)
                batch.emit(self._partials_topic, value.SerializeToString(), key=state_key(job.name, key))
                emitted += 1
        return emitted

    def _count_after_commit(self, batch: Batch, job_seconds: float | None, emitted: int, late: int) -> None:
        records, dead = len(batch.records), batch.dead_letters

        def count() -> None:
            self.counts.batch_committed(records, job_seconds, dead, emitted if isinstance(self.job, Transform) else 0, late)
            if late:
                stats.LATE.labels(self.job.name).inc(late)
            if job_seconds is not None:
                stats.JOB_SECONDS.labels(self.job.name, self.engine.name).observe(job_seconds)
            if isinstance(self.job, Transform):
                stats.RESULTS.labels(self.job.name).inc(emitted)

        batch.after_commit.append(count)


def partials_by_key(job: Aggregation, table: pa.Table) -> list[tuple[str, int, list[JSONValue]]]:
    """(key, event-time bucket (0 unless windowed), partials) per row of an engine's output."""
    keys = table.column(KEY).to_pylist()
    buckets = table.column(BUCKET).to_pylist() if job.windowed else [0] * len(keys)
    columns = [table.column(name).to_pylist() for name in partial_columns(job)]
    out = []
    for row, (key, bucket) in enumerate(zip(keys, buckets, strict=True)):
        partials, at = [], 0
        for aggregate in job.aggregates:
            partials.append(aggregate.partial([columns[at + j][row] for j in range(aggregate.width)]))
            at += aggregate.width
        out.append((key, bucket, partials))
    return out


class MergeStage:
    name = "compute-merge"

    def __init__(self, job: Aggregation, results_topic: str, counts: stats.JobCounts) -> None:
        self.job = job
        self._results_topic = results_topic
        self.counts = counts

    def process(self, batch: Batch) -> None:
        job = self.job
        # Per (partition, key): the row as committed before this batch and the row now, so a key
        # gets one -old/+new per transaction however many partials of it the batch held.
        rows: dict[tuple[int, str], tuple[dict[str, JSONValue] | None, dict[str, JSONValue]]] = {}
        for record in batch.records:
            savepoint = batch.savepoint()
            try:
                partial = self._decode(record)
                if partial is None:
                    continue  # another job's partial
                key, values = partial
                state = batch.state(record.partition())
                skey = state_key(job.name, key)
                current = state.get(skey)
                current_partials = None if current is None else json.loads(current)
                merged = values if current_partials is None else job.merge(current_partials, values)
                new_row = job.row(key, merged)
                encode_json(new_row)  # a result() that raises or is not JSON is this partial's fault
                state.put(skey, encode_json(merged))
                seen = rows.get((record.partition(), key))
                old_row = seen[0] if seen else None if current_partials is None else job.row(key, current_partials)
                rows[(record.partition(), key)] = (old_row, new_row)
            except Exception as exc:  # noqa: BLE001 - one bad partial must not stop the stream
                batch.rollback_to(savepoint)
                batch.dead_letter(record, exc)
        changes = 0
        for (_partition, key), (old_row, new_row) in rows.items():
            if old_row == new_row:
                continue
            kafka_key = state_key(job.name, key)
            if old_row is not None:
                batch.emit(self._results_topic, result_change(job.name, key, ResultChange.RETRACT, old_row), key=kafka_key)
                changes += 1
            batch.emit(self._results_topic, result_change(job.name, key, ResultChange.UPSERT, new_row), key=kafka_key)
            changes += 1
        self._count_after_commit(batch, changes)

    def _decode(self, record: Message) -> tuple[str, list[JSONValue]] | None:
        partial = PartialAggregate.FromString(record.value() or b"")
        if partial.job != self.job.name:
            return None
        values = json.loads(partial.partials)
        if not isinstance(values, list) or len(values) != len(self.job.aggregates):
            raise ValueError(f"partials of {partial.key!r}: expected {len(self.job.aggregates)} values, got {values!r}")
        return partial.key, values

    def _count_after_commit(self, batch: Batch, changes: int) -> None:
        def count() -> None:
            self.counts.results += changes
            stats.RESULTS.labels(self.job.name).inc(changes)

        batch.after_commit.append(count)


def describe_aggregates(job: Aggregation) -> Sequence[str]:
    return [aggregate.describe() for aggregate in job.aggregates]

