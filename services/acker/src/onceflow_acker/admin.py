"""The acker's own admin calls: GetTree, ListPending, Stats."""

from __future__ import annotations

import grpc

from onceflow.acks import root_key
from onceflow.codec import now_ms
from onceflow.state.stores import PartitionStores
from onceflow.v1 import acker_pb2, acker_pb2_grpc

from onceflow_acker.stage import AckerStats
from onceflow_acker.trees import Tree

MAX_LIST = 1000


def _info(root_id: int, tree: Tree, topic: str, now: int) -> acker_pb2.TreeInfo:
    return acker_pb2.TreeInfo(
        root_id=root_id,
        origin=acker_pb2.RecordRef(record_id=tree.record_id, topic=topic, partition=tree.origin_partition, offset=tree.origin_offset),
        attempt=tree.attempt,
        init_seen=tree.init_seen,
        failed=tree.failed,
        started_ms=tree.started_ms,
        deadline_ms=tree.deadline_ms,
        age_ms=now - tree.started_ms,
    )


class AckerAdminServicer(acker_pb2_grpc.AckerAdminServicer):
    """Reads the stores from the admin thread: each read is a snapshot of one store."""

    def __init__(self, stores: PartitionStores, stats: AckerStats, ingest_topic: str) -> None:
        self._stores = stores
        self._stats = stats
        self._topic = ingest_topic

    def _pending(self) -> list[tuple[int, Tree]]:
        return [
            (int.from_bytes(key, "big"), Tree.decode(value))
            for _partition, store in self._stores.items()
            for key, value in store.items()
        ]

    def GetTree(self, request: acker_pb2.GetTreeRequest, context: grpc.ServicerContext) -> acker_pb2.GetTreeReply:
        now = now_ms()
        which = request.WhichOneof("which")
        if which == "root_id":
            key = root_key(request.root_id)
            for _partition, store in self._stores.items():
                value = store.get(key)
                if value is not None:
                    return acker_pb2.GetTreeReply(trees=[_info(request.root_id, Tree.decode(value), self._topic, now)])
            return acker_pb2.GetTreeReply()
        if which == "record_id" and request.record_id:
            trees = [_info(r, t, self._topic, now) for r, t in self._pending() if t.record_id == request.record_id]
            return acker_pb2.GetTreeReply(trees=trees)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give root_id or a non-empty record_id")

    def ListPending(self, request: acker_pb2.ListPendingRequest, context: grpc.ServicerContext) -> acker_pb2.ListPendingReply:
        if request.limit > MAX_LIST:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: {request.limit}, at most {MAX_LIST}")
        if request.older_than_ms < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "older_than_ms: negative")
        now = now_ms()
        pending = self._pending()
        old = sorted(
            ((r, t) for r, t in pending if now - t.started_ms >= request.older_than_ms), key=lambda rt: rt[1].started_ms
        )
        limit = request.limit or 100
        return acker_pb2.ListPendingReply(
            trees=[_info(r, t, self._topic, now) for r, t in old[:limit]], total_pending=len(pending)
        )

    def Stats(self, request: acker_pb2.AckerStatsRequest, context: grpc.ServicerContext) -> acker_pb2.AckerStatsReply:
        p50, p99 = self._stats.latency_percentiles()
        return acker_pb2.AckerStatsReply(
            pending=sum(len(store) for _p, store in self._stores.items()),  # type: ignore[arg-type]
            completed=self._stats.completed,
            failed=self._stats.failed,
            timed_out=self._stats.timed_out,
            completed_per_second=self._stats.completed_per_second(),
            tree_latency_p50_ms=p50,
            tree_latency_p99_ms=p99,
            acks_processed=self._stats.acks,
        )
