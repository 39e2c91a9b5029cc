"""Composition: settings -> group committer -> gRPC server (Ingest + Admin + health)."""

from __future__ import annotations

import logging
import signal
import threading

from onceflow import metrics
from onceflow.admin import ServiceServer, StatusSnapshot
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc

from onceflow_ingest.committer import GroupCommitter
from onceflow_ingest.config import IngestSettings
from onceflow_ingest.servicer import IngestServicer

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FENCED = 3


class IngestService:
    def __init__(self, settings: IngestSettings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._state = "RUNNING"
        self.committer = GroupCommitter(
            settings.common,
            topic=settings.common.topic("ingest.records"),
            transactional_id=settings.transactional_id,
            max_pending=settings.max_pending,
            max_transaction_records=settings.max_transaction_records,
        )
        self.servicer = IngestServicer(settings, self.committer)
        self.server = ServiceServer(
            service="ingest",
            instance=settings.instance,
            host=settings.host,
            port=settings.port,
            controls=self,
            admin_token=settings.common.admin_token,
            add_servicers=lambda server: ingest_pb2_grpc.add_IngestServicer_to_server(self.servicer, server),
            service_names=(ingest_pb2.DESCRIPTOR.services_by_name["Ingest"].full_name,),
        )

    # -- AdminControls -----------------------------------------------------------------------

    def status(self) -> StatusSnapshot:
        stats = self.committer.stats
        return StatusSnapshot(
            state=self._state,
            transactions_committed=stats.committed,
            transactions_aborted=stats.aborted,
            records_in=self.servicer.accepted,
            records_out=stats.records,
            last_error=stats.last_error,
            gauges={"pending": float(self.committer.pending), "max_pending": float(self.settings.max_pending)},
        )

    def pause(self) -> str:
        self._state = "PAUSED"
        self.servicer.accepting.clear()
        return self._state

    def resume(self) -> str:
        self._state = "RUNNING"
        self.servicer.accepting.set()
        return self._state

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        self.pause()
        self._state = "DRAINED"
        deadline = threading.Event()
        waited = 0.0
        while self.committer.pending and waited < timeout_s:
            deadline.wait(0.05)
            waited += 0.05
        return self._state, self.committer.pending == 0

    # -- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        metrics.serve(self.settings.metrics_port, self.settings.host)
        self.committer.start()
        self.server.start()
        log.info("ingest ready: writing %s as %s", self.settings.common.topic("ingest.records"), self.settings.transactional_id)
        while not self._stop.wait(0.2):
            if self.committer.fenced.is_set():
                log.error("fenced by a newer instance; exiting")
                self.server.stop(0)
                return EXIT_FENCED
        log.info("shutting down: refusing new calls, committing what is in flight")
        self.server.stop(self.settings.shutdown_grace_s)
        self.committer.close(self.settings.shutdown_grace_s)
        log.info("stopped cleanly")
        return EXIT_OK
