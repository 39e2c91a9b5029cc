"""Composition: settings -> SinkWorker over Redis result tables -> gRPC (Admin + Query + health)."""

from __future__ import annotations

import logging

from onceflow import metrics
from onceflow.admin import ServerTLS, ServiceServer, StatusSnapshot, Tokens
from onceflow.redis_client import connect
from onceflow.runner import on_stop_signals
from onceflow.v1 import sink_pb2, sink_pb2_grpc

from onceflow_sink.config import SinkSettings
from onceflow_sink.query import QueryServicer
from onceflow_sink.tables import ResultTables
from onceflow_sink.worker import SinkWorker

log = logging.getLogger(__name__)


class SinkControls:
    """Admin for the sink. It applies each batch before polling the next, so nothing is in
    flight between polls: pause and drain only need to stop it polling."""

    def __init__(self, worker: SinkWorker) -> None:
        self._worker = worker

    def status(self) -> StatusSnapshot:
        stats = self._worker.stats
        return StatusSnapshot(
            state=self._worker.state,
            partitions=[(self._worker.topic, p, own.applied + 1, own.lag) for p, own in sorted(self._worker.owned.items())],
            transactions_committed=stats.transactions,
            transactions_aborted=stats.aborted,
            records_out=stats.applied,
            last_error=stats.last_error,
            gauges={
                "dead_letters": float(stats.dead_letters), "acks_lost": float(stats.acks_lost),
                # Partitions rebuilt from compute.results after Redis lost or rolled back writes.
                "redis_repairs": float(stats.redis_repairs),
                "redis_restarts_seen": float(self._worker.redis_restarts_seen),
            },
        )

    def pause(self) -> str:
        self._worker.pause_state = "PAUSED"
        self._worker.paused = True
        return "PAUSED"

    def resume(self) -> str:
        self._worker.paused = False
        return "RUNNING"

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        self._worker.pause_state = "DRAINED"
        self._worker.paused = True
        return "DRAINED", self._worker.wait_idle(timeout_s)


def run(settings: SinkSettings) -> int:
    common = settings.common
    client = connect(common.redis_url)
    client.ping()  # fail at startup, with the URL in the error, rather than at the first batch
    tables = ResultTables(client, common.topic_prefix, common.redis_wait_replicas, common.redis_wait_timeout_ms)
    worker = SinkWorker(common, settings.loop, tables, settings.group_id, settings.transactional_id, settings.acking)
    server = ServiceServer(
        service="sink",
        instance=settings.instance,
        host=settings.host,
        port=settings.port,
        controls=SinkControls(worker),
        tokens=Tokens.from_settings(common),
        add_servicers=lambda server: sink_pb2_grpc.add_QueryServicer_to_server(QueryServicer(tables), server),
        service_names=(sink_pb2.DESCRIPTOR.services_by_name["Query"].full_name,),
        tls=ServerTLS.from_settings(common),
    )
    worker.health_listener = server.set_serving
    on_stop_signals(worker.stop)
    metrics.serve(settings.metrics_port, settings.host)
    server.start()
    code = worker.run()
    log.info("sink ended (exit %d); stopping the gRPC server", code)
    server.stop(5.0)
    return code
