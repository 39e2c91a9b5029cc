"""The Query service: read the result tables the sink keeps in Redis."""

from __future__ import annotations

import time

import grpc

from onceflow.admin import MAX_WORKERS, RESERVED_FOR_ADMIN, CallSlots
from onceflow.v1 import sink_pb2, sink_pb2_grpc

from onceflow_sink.tables import ResultTables

MAX_SCAN = 10_000
# How long one Scan call steps through the table at most, whatever deadline its client set: a
# page may come back short (even empty) with a token, and the client goes on from it.
SCAN_WORK_S = 0.5
# Query calls at once; the server's other threads stay free for health and Admin.
QUERY_CALLS = MAX_WORKERS - RESERVED_FOR_ADMIN


class QueryServicer(sink_pb2_grpc.QueryServicer):
    def __init__(self, tables: ResultTables) -> None:
        self._tables = tables
        self._slots = CallSlots(QUERY_CALLS)

    def Get(self, request: sink_pb2.GetRowRequest, context: grpc.ServicerContext) -> sink_pb2.GetRowReply:
        with self._slots.take(context, "Query/Get"):
            return self._get(request, context)

    def Scan(self, request: sink_pb2.ScanRowsRequest, context: grpc.ServicerContext) -> sink_pb2.ScanRowsReply:
        with self._slots.take(context, "Query/Scan"):
            return self._scan(request, context)

    def _get(self, request: sink_pb2.GetRowRequest, context: grpc.ServicerContext) -> sink_pb2.GetRowReply:
        if not request.job or not request.key:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job and key")
        value = self._tables.get(request.job, request.key)
        return sink_pb2.GetRowReply(found=value is not None, value=value or b"")

    def _scan(self, request: sink_pb2.ScanRowsRequest, context: grpc.ServicerContext) -> sink_pb2.ScanRowsReply:
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job")
        if request.limit > MAX_SCAN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: {request.limit}, at most {MAX_SCAN}")
        try:
            rows, token = self._tables.scan(
                request.job, request.prefix, request.limit or 100, request.page_token, deadline=_work_deadline(context)
            )
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        return sink_pb2.ScanRowsReply(rows=[sink_pb2.Row(key=k, value=v) for k, v in rows], next_page_token=token)



def _work_deadline(context: grpc.ServicerContext) -> float:
    """When this call stops stepping: within SCAN_WORK_S, and in time to answer its client (half
    the time it has left, so the reply still arrives before the client gives up)."""
    budget = SCAN_WORK_S
    remaining = context.time_remaining()
    if remaining is not None:
        budget = min(budget, remaining / 2)
    return time.monotonic() + budget
