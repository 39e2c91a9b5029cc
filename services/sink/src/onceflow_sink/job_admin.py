"""gRPC JobAdmin (proto/onceflow/v1/jobs.proto): a job's versions over the sink's port, as
`onceflow job status | promote | retire` do them (onceflow_sink.versions)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import grpc

from onceflow.config import CommonSettings
from onceflow.kafka.registry import ConcurrentChange, read_registry
from onceflow.topology import check_job_name, versioned
from onceflow.v1 import jobs_pb2, jobs_pb2_grpc
from onceflow.versions import JobRecord, Version

from onceflow_sink import versions
from onceflow.state.result_store import ResultStore

MAX_SAMPLE_S = 10.0
MAX_WAIT_S = 600.0



def version_info(job: str, version: Version) -> jobs_pb2.VersionInfo:
    return jobs_pb2.VersionInfo(
        version=version.version, name=versioned(job, version.version), state=version.state.value, module=version.module,
        start_from=version.start_from, partitions=version.partitions, deployed_ms=version.deployed_ms,
        fingerprint=version.fingerprint, note=version.note, kind=version.kind,
    )


def job_versions(record: JobRecord) -> jobs_pb2.JobVersions:
    return jobs_pb2.JobVersions(
        job=record.job, live=record.live,
        versions=[version_info(record.job, record.versions[v]) for v in sorted(record.versions)],
    )


class JobAdminServicer(jobs_pb2_grpc.JobAdminServicer):
    def __init__(self, common: CommonSettings, tables: ResultStore) -> None:
        self._common = common
        self._tables = tables

    def ListVersions(self, request: jobs_pb2.ListVersionsRequest, context: grpc.ServicerContext) -> jobs_pb2.ListVersionsReply:
        records = read_registry(self._common)
        return jobs_pb2.ListVersionsReply(jobs=[job_versions(records[job]) for job in sorted(records)])

    def VersionStatus(self, request: jobs_pb2.VersionStatusRequest, context: grpc.ServicerContext) -> jobs_pb2.VersionStatusReply:
        _check_job(request.job, context)
        if not 0 <= request.sample_s <= MAX_SAMPLE_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sample_s: {request.sample_s}, want 0 to {MAX_SAMPLE_S:g}")
        with _refusals(context):
            rows = versions.status(self._common, request.job, request.sample_s)
        return jobs_pb2.VersionStatusReply(versions=[
            jobs_pb2.VersionProgress(
                version=version_info(request.job, r.version), live=r.live, map_behind=r.map_behind.records,
                map_behind_exact=r.map_behind.exact, merge_behind=-1 if r.merge_behind is None else r.merge_behind.records,
                records_per_s=-1.0 if r.records_per_s is None else r.records_per_s, workers=r.group_members,
            )
            for r in rows
        ])

    def Promote(self, request: jobs_pb2.PromoteRequest, context: grpc.ServicerContext) -> jobs_pb2.PromoteReply:
        _check_job(request.job, context)
        if not 0 <= request.wait_s <= MAX_WAIT_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"wait_s: {request.wait_s}, want 0 to {MAX_WAIT_S:g}")
        # Within the caller's deadline, with time left to answer (grpc types it as float; None when unset).
        remaining: float | None = context.time_remaining()
        wait_s = min(request.wait_s, max(0.0, remaining - 5.0)) if remaining is not None else request.wait_s
        with _refusals(context):
            record = versions.promote(self._common, self._tables, request.job, request.version, request.force, wait_s)
        return jobs_pb2.PromoteReply(live=record.live_name)

    def Retire(self, request: jobs_pb2.RetireRequest, context: grpc.ServicerContext) -> jobs_pb2.RetireReply:
        _check_job(request.job, context)
        with _refusals(context):
            deleted = versions.retire(self._common, request.job, request.version)
        return jobs_pb2.RetireReply(deleted=deleted)


def _check_job(job: str, context: grpc.ServicerContext) -> None:
    try:
        check_job_name(job)
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"job: {exc}")


@contextmanager
def _refusals(context: grpc.ServicerContext) -> Iterator[None]:
    """A refusal as its precise status: nothing changed in any of them."""
    try:
        yield
    except versions.NoSuchJob as exc:
        _abort(context, grpc.StatusCode.NOT_FOUND, exc)
    except versions.JobCommandError as exc:
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, exc)
    except ConcurrentChange as exc:
        _abort(context, grpc.StatusCode.ABORTED, exc)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, exc: Exception) -> NoReturn:
    context.abort(code, str(exc))
    raise AssertionError("unreachable")  # abort raises


__all__ = ["JobAdminServicer", "version_info"]
