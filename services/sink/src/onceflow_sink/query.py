"""The Query service: read the result tables the sink keeps (in Redis or PostgreSQL).

A job's plain name reads the version the registry calls live, through its alias (``aliases.py``);
a version's name (``orders@2``) reads that version. Every reply says which table answered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from onceflow.admin import MAX_WORKERS, RESERVED_FOR_ADMIN, CallSlots
from onceflow.state.store import StoreUnavailable
from onceflow.topology import split
from onceflow.v1 import sink_pb2, sink_pb2_grpc

from onceflow.state.result_store import ResultStore

MAX_SCAN = 10_000
# How long one Scan call steps through the table at most, whatever deadline its client set: a
# page may come back short (even empty) with a token, and the client goes on from it.
SCAN_WORK_S = 0.5
# Query calls at once; the server's other threads stay free for health and Admin.
QUERY_CALLS = MAX_WORKERS - RESERVED_FOR_ADMIN


class QueryServicer(sink_pb2_grpc.QueryServicer):
    def __init__(self, tables: ResultStore) -> None:
        self._tables = tables
        self._slots = CallSlots(QUERY_CALLS)

    def Get(self, request: sink_pb2.GetRowRequest, context: grpc.ServicerContext) -> sink_pb2.GetRowReply:
        with self._slots.take(context, "Query/Get"), _unavailable(context):
            return self._get(request, context)

    def Scan(self, request: sink_pb2.ScanRowsRequest, context: grpc.ServicerContext) -> sink_pb2.ScanRowsReply:
        with self._slots.take(context, "Query/Scan"), _unavailable(context):
            return self._scan(request, context)

    def _get(self, request: sink_pb2.GetRowRequest, context: grpc.ServicerContext) -> sink_pb2.GetRowReply:
        if not request.job or not request.key:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job and key")
        _check_job(request.job, context)
        table = self._tables.resolve(request.job)
        value = self._tables.get(table, request.key)
        return sink_pb2.GetRowReply(found=value is not None, value=value or b"", table=table)

    def _scan(self, request: sink_pb2.ScanRowsRequest, context: grpc.ServicerContext) -> sink_pb2.ScanRowsReply:
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job")
        if request.limit > MAX_SCAN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: {request.limit}, at most {MAX_SCAN}")
        _check_job(request.job, context)
        try:
            page = self._tables.scan_page(
                request.job, request.prefix, request.limit or 100, request.page_token, deadline=_work_deadline(context)
            )
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        return sink_pb2.ScanRowsReply(
            rows=[sink_pb2.Row(key=k, value=v) for k, v in page.rows], next_page_token=page.token, table=page.table
        )


@contextmanager
def _unavailable(context: grpc.ServicerContext) -> Iterator[None]:
    """The store down or refusing: UNAVAILABLE with the reason (a client retries it), not UNKNOWN."""
    try:
        yield
    except StoreUnavailable as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


def _check_job(job: str, context: grpc.ServicerContext) -> None:
    """A job's name or a version's (``orders@2``); INVALID_ARGUMENT naming what is wrong."""
    try:
        split(job)
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def _work_deadline(context: grpc.ServicerContext) -> float:
    """When this call stops stepping: within SCAN_WORK_S, and in time to answer its client (half
    the time it has left, so the reply still arrives before the client gives up)."""
    budget = SCAN_WORK_S
    remaining = context.time_remaining()
    if remaining is not None:
        budget = min(budget, remaining / 2)
    return time.monotonic() + budget
