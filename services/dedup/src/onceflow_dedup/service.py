"""Composition: settings -> DedupGate on the shared loop, with a Redis-backed DedupStore per
owned partition -> gRPC (Admin + DedupAdmin + health)."""

from __future__ import annotations

import functools

from onceflow import streams, topology
from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.kafka.inspect import partitions_of
from onceflow.readers import ReaderDirectory
from onceflow.redis_client import connect
from onceflow.runner import run_loop_service
from onceflow.state.redis_store import RedisWatch
from onceflow.txn import TransactionalLoop
from onceflow.v1 import dedup_pb2, dedup_pb2_grpc

from onceflow_dedup import store as exact
from onceflow_dedup.admin import DedupAdminServicer
from onceflow_dedup.config import DedupSettings
from onceflow_dedup.gate import DedupGate


def build(settings: DedupSettings) -> tuple[TransactionalLoop[exact.DedupStore], ServiceServer]:
    common = settings.common
    client = connect(common.redis_url)
    client.ping()  # fail at startup, with the URL in the error, rather than at the first record
    spec = settings.spec
    watch = RedisWatch(client)
    # Read to its end before the first record: a job reading a stream gets its own ack edge.
    readers = ReaderDirectory(common).start()
    gate = DedupGate(
        common.topic_prefix, settings.ack_mode, settings.rekey, settings.gc_limit, streams.directory(common).exists,
        readers.readers_of,
    )
    loop = TransactionalLoop.for_hop(
        topology.DEDUP, gate, common=common, settings=settings.loop, instance=settings.instance,
        store=lambda partition: exact.DedupStore(
            client, common.topic_prefix, partition, spec, use_filters=settings.filters_enabled, watch=watch,
            wait_replicas=common.redis_wait_replicas, wait_timeout_ms=common.redis_wait_timeout_ms,
        ),
    )
    assert loop.stores is not None
    stores = loop.stores
    input_partitions = functools.cache(lambda: len(partitions_of(common, loop.input_topic)))
    admin = DedupAdminServicer(gate, stores, client, common.topic_prefix, spec, input_partitions)

    def gauges() -> dict[str, float]:
        owned = stores.items()
        return {
            "passed": float(gate.counts.passed),
            "dropped": float(gate.counts.dropped),
            "filter_buckets": float(sum(len(s.filters.buckets) for _p, s in owned)),
            # Partitions rebuilt from dedup.changelog after Redis lost or rolled back writes.
            "redis_repairs": float(stores.repairs),
            "redis_restarts_seen": float(watch.changes),
        }

    server = ServiceServer.for_service(
        "dedup", settings, LoopControls(loop, gauges),
        add_servicers=lambda server: dedup_pb2_grpc.add_DedupAdminServicer_to_server(admin, server),
        service_names=(dedup_pb2.DESCRIPTOR.services_by_name["DedupAdmin"].full_name,),
    )
    return loop, server


def run(settings: DedupSettings) -> int:
    loop, server = build(settings)
    return run_loop_service(loop, server, settings.metrics_port, settings.host)
