"""ComputeAdmin: ListJobs, GetState, Stats."""

from __future__ import annotations

import json
import grpc
import pyarrow as pa

from onceflow.codec import now_ms
from onceflow.state.store import MemoryStore
from onceflow.state.stores import PartitionStores
from onceflow.txn import TransactionalLoop
from onceflow.v1 import compute_pb2, compute_pb2_grpc

from onceflow_compute import jobs
from onceflow_compute.api import Aggregation, Job, Join, Transform
from onceflow_compute.dataflow.windows import Window
from onceflow_compute.lifecycle import fingerprint_key
from onceflow_compute.results import state_key
from onceflow_compute.stats import JobCounts
from onceflow_compute.dataflow.watermarks import WatermarkTracker


def job_info(job: Job, running: bool) -> compute_pb2.JobInfo:
    return compute_pb2.JobInfo(
        name=job.name,
        kind=job.kind,
        input_schema=_schema_text(job.schema),
        key=job.key,
        aggregates=[aggregate.describe() for aggregate in job.aggregates] if isinstance(job, Aggregation) else [],
        running=running,
    )


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)


def state_keys(job: Job, store: MemoryStore) -> int:
    """A store's entries but the reserved fingerprint key (lifecycle.py)."""
    return len(store) - (store.get(fingerprint_key(job.name)) is not None)


class ComputeAdminServicer(compute_pb2_grpc.ComputeAdminServicer):
    def __init__(
        self,
        job: Job,
        engine: str,
        counts: JobCounts,
        loops: list[TransactionalLoop[MemoryStore]],
        stores: PartitionStores[MemoryStore] | None,
        bounds: tuple[int, int],
        watermarks: WatermarkTracker,
    ) -> None:
        self._job = job
        self._engine = engine
        self._counts = counts
        self._loops = loops  # the map hop first
        self._stores = stores
        self._bounds = bounds
        self._watermarks = watermarks

    def ListJobs(self, request: compute_pb2.ListJobsRequest, context: grpc.ServicerContext) -> compute_pb2.ListJobsReply:
        infos = [job_info(self._job, running=True)]
        for name in jobs.builtin_names():
            if name == self._job.name:
                continue
            try:
                infos.append(job_info(jobs.load_job(name), running=False))
            except ValueError:
                continue
        return compute_pb2.ListJobsReply(jobs=infos)

    def GetState(self, request: compute_pb2.GetStateRequest, context: grpc.ServicerContext) -> compute_pb2.GetStateReply:
        if not request.key:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "key: required")
        job_name = request.job or self._job.name
        if job_name != self._job.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_name!r}: this worker runs {self._job.name!r}")
        if isinstance(self._job, Transform) or self._stores is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_name!r} is a stateless transform")
        assert not isinstance(self._job, Transform) and self._stores is not None
        skey = state_key(job_name, request.key)
        found = next(((p, v) for p, store in self._stores.items() if (v := store.get(skey)) is not None), None)
        if found is None:
            # Not in this worker's partitions: another worker of the job may own the key.
            return compute_pb2.GetStateReply(found=False, partition=-1, owned=False)
        partition, value = found
        partials = json.loads(value)
        if isinstance(self._job, Join):
            # A join key's state is its rows: {"left": [[event time, row], ...], "right": [...]}.
            row = json.dumps(partials, sort_keys=True)
        elif self._job.windowed:
            # The key's panes: [start, end, partials, last emitted row, ...] per open window.
            rows = {
                self._job.result_key(request.key, Window(start, end)): self._job.window_row(request.key, Window(start, end), acc)
                for start, end, acc, *_rest in partials
                if acc is not None
            }
            row = json.dumps(rows, sort_keys=True)
        else:
            row = json.dumps(self._job.row(request.key, partials), sort_keys=True)
        return compute_pb2.GetStateReply(
            found=True, row=row, partials=value.decode(), partition=partition, owned=True
        )

    def Stats(self, request: compute_pb2.ComputeStatsRequest, context: grpc.ServicerContext) -> compute_pb2.ComputeStatsReply:
        counts = self._counts
        batches_per_s, records_per_s = counts.rates()
        loop_stats = self._loops[0].stats
        every = [loop.stats for loop in self._loops]
        now = now_ms()
        watermark = self._watermarks.watermark(now)
        partitions = [
            compute_pb2.PartitionWatermark(
                partition=p, watermark_ms=-1 if mark is None else mark, idle=self._watermarks.is_idle(p, now)
            )
            for p, mark in self._watermarks.partitions().items()
        ]
        keys = 0
        if self._stores is not None:
            keys = sum(state_keys(self._job, store) for _p, store in self._stores.items())
        return compute_pb2.ComputeStatsReply(
            job=self._job.name,
            engine=self._engine,
            batch_size=loop_stats.batch_bound,
            min_batch_size=self._bounds[0],
            max_batch_size=self._bounds[1],
            batches_per_second=batches_per_s,
            records_per_second=records_per_s,
            job_seconds_p50=counts.job_seconds(0.5),
            job_seconds_p99=counts.job_seconds(0.99),
            records_in=counts.records_in,
            dead_letters=counts.dead_letters,
            late_records=counts.late,
            results=counts.results,
            keys_in_state=keys,
            healthy=all(s.stage_failures == 0 for s in every),
            last_error="; ".join(s.last_error for s in every if s.last_error),
            watermark_ms=-1 if watermark is None else watermark,
            watermark_bound_ms=self._watermarks.bound_ms,
            partition_watermarks=partitions,
        )
