"""The Query service: read the result tables the sink keeps in Redis."""

from __future__ import annotations

import grpc

from onceflow.v1 import sink_pb2, sink_pb2_grpc

from onceflow_sink.tables import ResultTables

MAX_SCAN = 10_000


class QueryServicer(sink_pb2_grpc.QueryServicer):
    def __init__(self, tables: ResultTables) -> None:
        self._tables = tables

    def Get(self, request: sink_pb2.GetRowRequest, context: grpc.ServicerContext) -> sink_pb2.GetRowReply:
        if not request.job or not request.key:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job and key")
        value = self._tables.get(request.job, request.key)
        return sink_pb2.GetRowReply(found=value is not None, value=value or b"")

    def Scan(self, request: sink_pb2.ScanRowsRequest, context: grpc.ServicerContext) -> sink_pb2.ScanRowsReply:
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give job")
        if request.limit > MAX_SCAN:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: {request.limit}, at most {MAX_SCAN}")
        try:
            rows, token = self._tables.scan(request.job, request.prefix, request.limit or 100, request.page_token)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"page_token: {exc}")
        return sink_pb2.ScanRowsReply(rows=[sink_pb2.Row(key=k, value=v) for k, v in rows], next_page_token=token)

