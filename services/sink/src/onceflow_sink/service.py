"""Composition: settings -> SinkWorker (the shared driver, offsets in the store) over the result
tables (Redis or PostgreSQL, ``stores.py``) -> gRPC (Admin + Query + JobAdmin + health), run by the lifecycle every consuming service shares;
beside the loop, the RegistryFollower (jobs.registry -> the aliases Query reads through, and the
retired versions the worker skips), started before it and stopped after it."""

from __future__ import annotations

import logging

import grpc

from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.config import CommonSettings
from onceflow.runner import run_loop_service
from onceflow.service_main import EXIT_USAGE
from onceflow.state.result_store import ResultStore, StoreRefused
from onceflow.v1 import jobs_pb2, jobs_pb2_grpc, sink_pb2, sink_pb2_grpc

from onceflow_sink.aliases import RegistryFollower
from onceflow_sink.config import SinkSettings
from onceflow_sink.job_admin import JobAdminServicer
from onceflow_sink.query import QueryServicer
from onceflow_sink.stores import open_store
from onceflow_sink.worker import SinkWorker

log = logging.getLogger(__name__)


def gauges(worker: SinkWorker, follower: RegistryFollower) -> dict[str, float]:
    stats = worker.stats
    return {
        "dead_letters": float(stats.dead_letters), "acks_lost": float(stats.acks_lost),
        # Partitions rebuilt from compute.results after the store lost or rolled back writes.
        "store_repairs": float(stats.store_repairs),
        "store_restarts_seen": float(worker.store_restarts_seen),
        # Changes of retired job versions, skipped; the jobs.registry offset the aliases follow.
        "retired_changes": float(stats.retired_changes),
        "registry_offset": float(follower.offset),
    }


def add_servicers(server: grpc.Server, common: CommonSettings, tables: ResultStore) -> None:
    sink_pb2_grpc.add_QueryServicer_to_server(QueryServicer(tables), server)
    jobs_pb2_grpc.add_JobAdminServicer_to_server(JobAdminServicer(common, tables), server)


def build(settings: SinkSettings) -> tuple[SinkWorker, ServiceServer, RegistryFollower]:
    common = settings.common
    tables = open_store(common, settings.store, check=True)
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
    try:
        worker, server, follower = build(settings)
    except StoreRefused as exc:
        log.error("sink: not started: %s", exc)
        return EXIT_USAGE
    follower.start()
    # A start that replays compute.results (a new Redis, a rebuild) then skips retired versions
    # from its first batch rather than rebuild their tables for the follower to drop.
    follower.wait_ready()
    try:
        return run_loop_service(worker, server, settings.metrics_port, settings.host)
    finally:
        follower.stop()
