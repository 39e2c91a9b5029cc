"""The map hop (stage ``compute``, stateless, the engine): dedup.records -> one Arrow table
(onceflow_compute/frames.py) -> the job (onceflow_compute/engine/run.py) -> for an aggregation,
one partial aggregate per group key to compute.partials.<job> (keyed by job and group key, so the
key's state has one owner whatever the input's key was); for a join, each side's rows to
compute.partials.<job> keyed by join key; for a transform, result rows straight to compute.results. A
windowed job's records pass the event-time gate first (eventtime.py, beside this file). The
input's tuple trees continue as one group of this transaction (``Batch.anchor_roots``): every
output carries an anchor, and the trees complete once the sink has applied what came of them
(docs/decisions/0016). The merge hop: onceflow_compute/merge/.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import pyarrow as pa

from onceflow import faults
from onceflow.codec import now_ms
from onceflow.kafka.records import partition_of
from onceflow.state.store import MemoryStore
from onceflow.topology import split
from onceflow.txn.batch import Batch
from onceflow.v1.compute_pb2 import JoinRow, PartialAggregate
from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import stats
from onceflow_compute.api import Job, Join, Transform, encode_json
from onceflow_compute.dataflow.watermarks import WatermarkTracker
from onceflow_compute.engine import KEY, ROW, SIDE, TIME, Engine
from onceflow_compute.engine.run import run_job, transform_rows
from onceflow_compute.fingerprint import describe, fingerprint
from onceflow_compute.frames import Frame, build_frame
from onceflow_compute.map.eventtime import EventTimeGate, event_times
from onceflow_compute.merge.partials import merge_partials
from onceflow_compute.results import result_change, state_key

log = logging.getLogger(__name__)


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
        self.bisect_budget = bisect_budget
        # Once the job has worked on something in this process, a lone failing record is
        # poison; before that, it may as well be the job.
        self.job_has_worked = False
        self._partials_topic = partials_topic
        self._results_topic = results_topic
        self.counts = counts
        # The job's state fingerprint: the order its partials are in (merge/layout.py).
        self._layout = fingerprint(describe(job))

    def process(self, batch: Batch[MemoryStore]) -> None:
        # Letters and re-driven records name the job, not its version: a fix re-driven to
        # `usersum` reaches every version of it, one that reprocesses later included.
        base = split(self.job.name)[0]
        batch.job = base
        frame = build_frame(batch.records, self.job.schema, base, self.job.name)
        for other_jobs in frame.foreign:
            batch.pass_over(other_jobs)  # before any ack: this job is no part of these trees
        for record, envelope, reason in frame.rejected:
            batch.dead_letter(record, reason)
            if envelope is not None:
                batch.ack(envelope)  # dead-lettered is processed: the tree ends here
        # frame.passed_over: re-driven to another job of the stream (onceflow dlq redrive). Not
        # acked: the tree is that job's to finish, and a second ack of one edge would undo it (XOR).
        late = 0
        marks: dict[int, int] = {}
        if self.event_time is not None:
            frame, late, marks = self.event_time.split(frame, batch)
        # Before any output: the anchors name the partitions holding these roots.
        batch.anchor_roots(frame.envelopes)
        job_seconds: float | None = None
        emitted = 0
        if frame.table.num_rows:
            faults.point("before_job")
            started = time.monotonic()
            run = run_job(
                self.job, self.engine, frame.table, self.bisect_budget, lone_failure_is_poison=self.job_has_worked
            )
            self.job_has_worked = self.job_has_worked or len(run.failed) < frame.table.num_rows
            job_seconds = time.monotonic() - started
            faults.point("after_job")
            for index, error in sorted(run.failed.items()):
                batch.dead_letter(frame.records[index], f"job {self.job.name} failed on this record: {error}")
            emitted = self._emit(run.outputs, batch)
        if self.event_time is not None:
            self.event_time.emit_watermarks(batch, marks)
        self._count_after_commit(batch, job_seconds, emitted, late)
        self._advance_watermarks_after_commit(batch, frame)

    def on_assign(self, partitions: list[int], stores: Mapping[int, object]) -> None:
        self.watermarks.assign(partitions, now_ms())

    def on_revoke(self, partitions: list[int]) -> None:
        self.watermarks.revoke(partitions)

    def _advance_watermarks_after_commit(self, batch: Batch[MemoryStore], frame: Frame) -> None:
        # Only committed input moves event time: an aborted batch is read again.
        column = getattr(self.job, "time_column", "_event_time_ms")
        if frame.table.num_rows and column in frame.table.column_names:
            times = event_times(frame.table, column)
        else:
            times = [e.event_time_ms for e in frame.envelopes]
        # Only each partition's newest time matters to the tracker: one observation per partition.
        newest: dict[int, int] = {}
        for record, t in zip(frame.records, times, strict=True):
            if t is None:
                continue
            partition = partition_of(record)
            if t > newest.get(partition, t - 1):
                newest[partition] = t
        at = batch.now_ms

        def advance() -> None:
            for partition, event_time in newest.items():
                self.watermarks.observe(partition, event_time, at)

        batch.after_commit.append(advance)

    def _emit(self, outputs: list[pa.Table], batch: Batch[MemoryStore]) -> int:
        job = self.job
        if isinstance(job, Transform):
            emitted = 0
            for key, row in transform_rows(job, outputs):
                value = result_change(job.name, key, ResultChange.UPSERT, row, batch.anchor(), self._layout)
                batch.emit(self._results_topic, value, key=state_key(job.name, key))
                emitted += 1
            return emitted
        if isinstance(job, Join):
            return self._emit_join_rows(job, outputs, batch)
        # Bisection may have split the batch: merge the parts' partials per key (and bucket) first.
        merged = merge_partials(job, outputs)
        for (key, bucket), partials in merged.items():
            aggregate = PartialAggregate(
                job=job.name, key=key, partials=encode_json(partials), bucket_ms=bucket, anchor=batch.anchor(),
                layout=self._layout,
            )
            # Keyed by the group key alone: all of a key's windows have one owner (sessions merge).
            batch.emit(self._partials_topic, aggregate.SerializeToString(), key=state_key(job.name, key))
        return len(merged)

    def _emit_join_rows(self, job: Join, outputs: list[pa.Table], batch: Batch[MemoryStore]) -> int:
        emitted = 0
        for table in outputs:
            columns = [table.column(name).to_pylist() for name in (SIDE, KEY, TIME, ROW)]
            for side, on, event_time, row in zip(*columns, strict=True):
                key = job.join_key(on, job.window_of(event_time))
                joined = JoinRow(side=side, row=row.encode(), event_time_ms=event_time)
                value = PartialAggregate(job=job.name, key=key, join_row=joined, anchor=batch.anchor())
                batch.emit(self._partials_topic, value.SerializeToString(), key=state_key(job.name, key))
                emitted += 1
        return emitted

    def _count_after_commit(self, batch: Batch[MemoryStore], job_seconds: float | None, emitted: int, late: int) -> None:
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
