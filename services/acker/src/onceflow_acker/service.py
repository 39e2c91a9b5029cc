"""Composition: settings -> AckerStage on the shared loop -> gRPC (Admin + AckerAdmin + health)."""

from __future__ import annotations

from onceflow import topology
from onceflow.admin import ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.runner import run_loop_service
from onceflow.state.store import MemoryStore
from onceflow.state.stores import memory_store
from onceflow.topology import Topic
from onceflow.txn import TransactionalLoop
from onceflow.v1 import acker_pb2, acker_pb2_grpc

from onceflow_acker.admin import AckerAdminServicer, pending_trees
from onceflow_acker.config import AckerSettings
from onceflow_acker.stage import PENDING, AckerStage, AckerStats


def build(settings: AckerSettings) -> tuple[TransactionalLoop[MemoryStore], ServiceServer]:
    common = settings.common
    stats = AckerStats()
    ingest_topic = common.topic(Topic.INGEST_RECORDS)
    loop = TransactionalLoop.for_hop(
        topology.ACKER, AckerStage(common.topic(Topic.ACKER_EVENTS), ingest_topic, settings.default_timeout_ms, stats),
        common=common, settings=settings.loop, instance=settings.instance, store=memory_store,
    )
    assert loop.stores is not None
    stores = loop.stores
    admin = AckerAdminServicer(stores, stats, ingest_topic)

    def pending() -> float:
        return float(pending_trees(stores))

    PENDING.set_function(pending)
    server = ServiceServer.for_service(
        "acker", settings, LoopControls(loop, lambda: {"pending_trees": pending()}),
        add_servicers=lambda server: acker_pb2_grpc.add_AckerAdminServicer_to_server(admin, server),
        service_names=(acker_pb2.DESCRIPTOR.services_by_name["AckerAdmin"].full_name,),
    )
    return loop, server


def run(settings: AckerSettings) -> int:
    loop, server = build(settings)
    return run_loop_service(loop, server, settings.metrics_port, settings.host)
