"""The gate's own admin calls: Check, Stats, Forget (token-protected)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import grpc
import redis

from onceflow import streams
from onceflow.state.stores import PartitionStores
from onceflow.v1 import dedup_pb2, dedup_pb2_grpc

from onceflow_dedup import store as exact
from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.gate import DedupGate, ForgetRequest

MAX_RECORD_ID_BYTES = 256
FORGET_TIMEOUT_S = 30.0


def _identity(request: dedup_pb2.CheckRequest | dedup_pb2.ForgetRequest, context: grpc.ServicerContext) -> str:
    """What the gate files the record under: its record_id within its stream."""
    record_id = request.record_id
    if not record_id:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "record_id: empty")
    size = len(record_id.encode())
    if size > MAX_RECORD_ID_BYTES:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record_id: {size} bytes, the limit is {MAX_RECORD_ID_BYTES}")
    try:
        streams.check_stream_name(request.stream)
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"stream: {exc}")
    return streams.identity(request.stream, record_id, producer=request.producer)


class DedupAdminServicer(dedup_pb2_grpc.DedupAdminServicer):
    """Check reads Redis directly (any partition); Stats reads the gate's committed counts;
    Forget is a request to the loop, answered once its tombstone has committed."""

    def __init__(
        self,
        gate: DedupGate,
        stores: PartitionStores[exact.DedupStore],
        client: redis.Redis,
        topic_prefix: str,
        spec: BucketSpec,
        input_partitions: Callable[[], int],
    ) -> None:
        self._gate = gate
        self._stores = stores
        self._redis = client
        self._prefix = topic_prefix
        self._spec = spec
        self._input_partitions = input_partitions

    def Check(self, request: dedup_pb2.CheckRequest, context: grpc.ServicerContext) -> dedup_pb2.CheckReply:
        identity = _identity(request, context)
        found = exact.lookup(self._redis, self._prefix, range(self._input_partitions()), identity)
        if found is None:
            return dedup_pb2.CheckReply(seen=False, partition=-1)
        partition, bucket = found
        owned = dict(self._stores.items()).get(partition)
        return dedup_pb2.CheckReply(
            seen=True,
            bucket_start_ms=bucket,
            expires_at_ms=bucket + self._spec.horizon_ms + self._spec.bucket_ms,
            partition=partition,
            owned=owned is not None,
            filter_maybe=owned is not None and owned.might_contain(identity),
        )

    def Stats(self, request: dedup_pb2.DedupStatsRequest, context: grpc.ServicerContext) -> dedup_pb2.DedupStatsReply:
        counts = self._gate.counts
        owned = self._stores.items()
        return dedup_pb2.DedupStatsReply(
            passed=counts.passed,
            dropped=counts.dropped,
            fast_path=counts.fast_path,
            store_reads=counts.store_reads,
            false_positives=counts.false_positives,
            fast_path_ratio=counts.fast_path / counts.passed if counts.passed else 0.0,
            measured_false_positive_rate=counts.false_positives / counts.passed if counts.passed else 0.0,
            configured_false_positive_rate=self._spec.false_positive_rate,
            buckets=sum(len(s.filters.buckets) for _p, s in owned),
            filter_memory_bytes=sum(s.filters.memory_bytes for _p, s in owned),
            ids_in_store=sum(len(s) for _p, s in owned),
            expired_ids=counts.expired_ids,
            dead_letters=counts.dead_letters,
            forgotten=counts.forgotten,
            partitions=[p for p, _s in owned],
            replays_refused=counts.replays_refused,
            clock_ahead_ms=self._gate.skew.ahead_ms,
            clock_behind_ms=self._gate.skew.behind_ms,
        )

    def Forget(self, request: dedup_pb2.ForgetRequest, context: grpc.ServicerContext) -> dedup_pb2.ForgetReply:
        identity = _identity(request, context)
        found = exact.lookup(self._redis, self._prefix, range(self._input_partitions()), identity)
        if found is None:
            return dedup_pb2.ForgetReply(forgotten=False, partition=-1)
        partition, _bucket = found
        if partition not in self._stores:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"record_id is in partition {partition}, which another dedup instance owns: ask that one",
            )
        forget = ForgetRequest(identity)
        self._gate.forget_requests.put(forget)
        try:
            forgotten, where = forget.done.result(timeout=FORGET_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the tombstone did not commit within {FORGET_TIMEOUT_S:.0f}s (paused or failing gate?); "
                "Forget is idempotent, retry it",
            )
        return dedup_pb2.ForgetReply(forgotten=forgotten, partition=where)
