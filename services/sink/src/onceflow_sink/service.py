"""Composition: settings -> SinkWorker (the shared driver, offsets in Redis) over the result
tables -> gRPC (Admin + Query + JobAdmin + health), run by the lifecycle every consuming service shares;
beside the loop, the RegistryFollower (jobs.registry -> the aliases Query reads through, and the
retired versions the worker skips), started before it and stopped after it."""

from __future__ import annotations

import grpc

from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.config import CommonSettings
from onceflow.redis_client import connect
from onceflow.runner import run_loop_service
from onceflow.v1 import jobs_pb2, jobs_pb2_grpc, sink_pb2, sink_pb2_grpc

from onceflow_sink.aliases import RegistryFollower
from onceflow_sink.config import SinkSettings
from onceflow_sink.job_admin import JobAdminServicer
from onceflow_sink.query import QueryServicer
from onceflow_sink.tables import ResultTables
from onceflow_sink.worker import SinkWorker

def gauges(worker: SinkWorker, follower: RegistryFollower) -> dict[str, float]:
    stats = worker.stats
    return {
        "dead_letters": float(stats.dead_letters), "acks_lost": float(stats.acks_lost),
        # Partitions rebuilt from compute.results after Redis lost or rolled back writes.
        "redis_repairs": float(stats.redis_repairs),
        "redis_restarts_seen": float(worker.redis_restarts_seen),
        # Changes of retired job versions, skipped; the jobs.registry offset the aliases follow.
        "retired_changes": float(stats.retired_changes),
        "registry_offset": float(follower.offset),
    }


def add_servicers(server: grpc.Server, common: CommonSettings, tables: ResultTables) -> None:
    sink_pb2_grpc.add_QueryServicer_to_server(QueryServicer(tables), server)
    jobs_pb2_grpc.add_JobAdminServicer_to_server(JobAdminServicer(common, tables), server)


def build(settings: SinkSettings) -> tuple[SinkWorker, ServiceServer, RegistryFollower]:
    common = settings.common
    client = connect(common.redis_url)
    client.ping()  # fail at startup, with the URL in the error, rather than at the first batch
    tables = ResultTables(client, common.topic_prefix, common.redis_wait_replicas, common.redis_wait_timeout_ms)
    follower = RegistryFollower(common, tables)
    worker = SinkWorker(common, settings.loop, tables, settings.instance, settings.acking, retired=follower.retired)
    server = ServiceServer.for_service(
        "sink", settings, LoopControls(worker, lambda: gauges(worker, follower)),
        add_servicers=lambda server: add_servicers(server, common, tables),
        service_names=(
            sink_pb2.DESCRIPTOR.services_by_name["Query"].full_name, jobs_pb2.DESCRIPTOR.services_by_name["JobAdmin"].full_name,
        ),
    )
    return worker, server, follower


def run(settings: SinkSettings) -> int:
    worker, server, follower = build(settings)
    follower.start()
    # A start that replays compute.results (a new Redis, a rebuild) then skips retired versions
    # from its first batch rather than rebuild their tables for the follower to drop.
    follower.wait_ready()
    try:
        return run_loop_service(worker, server, settings.metrics_port, settings.host)
    finally:
        follower.stop()
