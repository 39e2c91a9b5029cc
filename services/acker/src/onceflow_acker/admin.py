"""The acker's own admin calls: GetTree, ListPending, Stats."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from onceflow.acks import root_key
from onceflow.codec import now_ms
from onceflow.state.store import MemoryStore
from onceflow.state.stores import PartitionStores
from onceflow.v1 import acker_pb2, acker_pb2_grpc

from onceflow_acker.stage import AckerStats
from onceflow_acker.trees import Tree, is_group

MAX_LIST = 1000
MAX_RECORD_ID_BYTES = 256  # ingest refuses longer record_ids (docs/services/ingest.md)
# How old a ListPending / GetTree(record_id) answer may be: one decode of every pending tree
# per interval, however many calls arrive.
VIEW_TTL_S = 1.0


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


def pending_trees(stores: PartitionStores[MemoryStore]) -> int:
    """Trees waiting for acks, groups not counted."""
    return sum(1 for _p, store in stores.items() for _key, value in store.items() if not is_group(value))


@dataclass(frozen=True)
class PendingView:
    """Every pending tree, decoded once: oldest first, and by record_id."""

    oldest_first: list[tuple[int, Tree]]
    by_record: dict[str, list[tuple[int, Tree]]]
    taken_ms: int


class AckerAdminServicer(acker_pb2_grpc.AckerAdminServicer):
    """Reads the stores from the admin thread: each read is a snapshot of one store.

    ``GetTree(record_id)`` and ``ListPending`` need every pending tree decoded. They share one
    view, rebuilt at most every ``view_ttl_s``, so a flood of calls costs one decode of the
    stores per interval, not one per call; the answers are at most that old."""

    def __init__(
        self, stores: PartitionStores[MemoryStore], stats: AckerStats, ingest_topic: str,
        view_ttl_s: float = VIEW_TTL_S, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stores = stores
        self._stats = stats
        self._topic = ingest_topic
        self._view_ttl_s = view_ttl_s
        self._clock = clock
        self._view: PendingView | None = None
        self._view_expires = 0.0
        self._view_lock = threading.Lock()  # concurrent callers wait for one rebuild

    def _pending(self) -> PendingView:
        with self._view_lock:
            if self._view is None or self._clock() >= self._view_expires:
                trees = [
                    (int.from_bytes(key, "big"), Tree.decode(value))
                    for _partition, store in self._stores.items()
                    for key, value in store.items()
                    if not is_group(value)
                ]
                trees.sort(key=lambda rt: rt[1].started_ms)
                by_record: dict[str, list[tuple[int, Tree]]] = {}
                for root, tree in trees:
                    by_record.setdefault(tree.record_id, []).append((root, tree))
                self._view = PendingView(trees, by_record, now_ms())
                self._view_expires = self._clock() + self._view_ttl_s
            return self._view

    def GetTree(self, request: acker_pb2.GetTreeRequest, context: grpc.ServicerContext) -> acker_pb2.GetTreeReply:
        now = now_ms()
        which = request.WhichOneof("which")
        if which == "root_id":
            key = root_key(request.root_id)
            for _partition, store in self._stores.items():
                value = store.get(key)
                if value is not None and not is_group(value):
                    return acker_pb2.GetTreeReply(trees=[_info(request.root_id, Tree.decode(value), self._topic, now)])
            return acker_pb2.GetTreeReply()
        if which == "record_id" and request.record_id:
            if len(request.record_id.encode()) > MAX_RECORD_ID_BYTES:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"record_id: {len(request.record_id.encode())} bytes, the limit is {MAX_RECORD_ID_BYTES}",
                )
            found = self._pending().by_record.get(request.record_id, [])
            return acker_pb2.GetTreeReply(trees=[_info(r, t, self._topic, now) for r, t in found[:MAX_LIST]])
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "give root_id or a non-empty record_id")

    def ListPending(self, request: acker_pb2.ListPendingRequest, context: grpc.ServicerContext) -> acker_pb2.ListPendingReply:
        if request.limit > MAX_LIST:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit: {request.limit}, at most {MAX_LIST}")
        if request.older_than_ms < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "older_than_ms: negative")
        now = now_ms()
        view = self._pending()
        # Oldest first, so the trees old enough are a prefix: stop at the first younger one.
        limit = request.limit or 100
        old = list(itertools.islice(
            itertools.takewhile(lambda rt: now - rt[1].started_ms >= request.older_than_ms, view.oldest_first), limit,
        ))
        return acker_pb2.ListPendingReply(
            trees=[_info(r, t, self._topic, now) for r, t in old], total_pending=len(view.oldest_first)
        )

    def Stats(self, request: acker_pb2.AckerStatsRequest, context: grpc.ServicerContext) -> acker_pb2.AckerStatsReply:
        p50, p99 = self._stats.latency_percentiles()
        return acker_pb2.AckerStatsReply(
            pending=pending_trees(self._stores),
            completed=self._stats.completed,
            failed=self._stats.failed,
            timed_out=self._stats.timed_out,
            completed_per_second=self._stats.completed_per_second(),
            tree_latency_p50_ms=p50,
            tree_latency_p99_ms=p99,
            acks_processed=self._stats.acks,
        )
