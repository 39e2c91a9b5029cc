"""Composition: settings -> group committer -> gRPC server (Ingest + Admin + health)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from onceflow import spout, streams, topology
from onceflow.admin import RESERVED_FOR_ADMIN, STREAM_THREADS, ServiceServer, StatusSnapshot
from onceflow.kafka.inspect import wait_partition_count
from onceflow.runner import EXIT_FAILED, Worker, run_loop_service
from onceflow.state.store import KeyValueStore
from onceflow.topology import Topic
from onceflow.trees import EventWatcher, InFlightTrees
from onceflow.txn import TransactionalLoop
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc

from onceflow_ingest.committer import Acking, GroupCommitter
from onceflow_ingest.config import IngestSettings
from onceflow_ingest.replay import OriginalFetcher, ReplayStage
from onceflow_ingest.servicer import IngestServicer

log = logging.getLogger(__name__)

class CommitterWorker:
    """Ingest's group committer as a worker of the lifecycle every service shares
    (`onceflow.runner`): it serves until stopped, then commits what is queued; it ends by
    itself if the committer dies (1) or is fenced (3), so a supervisor restarts ingest."""

    name = "ingest-committer"

    def __init__(self, committer: GroupCommitter, grace_s: float) -> None:
        self._committer = committer
        self._grace_s = grace_s
        self._stop = threading.Event()
        self.health_listener: Callable[[bool], None] = lambda _healthy: None

    def run(self) -> int:
        self._committer.start()
        try:
            while not self._stop.wait(0.2):
                if self._committer.died.is_set():
                    log.error("the committer died (see above); exiting so a supervisor restarts ingest")
                    return EXIT_FAILED
                if self._committer.fenced.is_set():
                    log.error("fenced by a newer instance; exiting")
                    return EXIT_FENCED
            return EXIT_OK
        finally:
            self._committer.close(self._grace_s)

    def stop(self) -> None:
        self._stop.set()


class IngestService:
    def __init__(self, settings: IngestSettings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._state = "RUNNING"
        common = settings.common
        ingest_topic = common.topic(Topic.INGEST_RECORDS)
        self.trees: InFlightTrees | None = None
        self.watcher: EventWatcher | None = None
        self.replayer: TransactionalLoop[KeyValueStore] | None = None
        self.replay_stage: ReplayStage | None = None
        acking = None
        if settings.acking:
            self.trees = InFlightTrees(settings.max_attempts if settings.replay else 1)
            acks_topic = common.topic(Topic.ACKER_ACKS)
            partitions = wait_partition_count(common, acks_topic, self._stop)
            acking = Acking(self.trees, spout.Inits(acks_topic, partitions, settings.tree_timeout_ms))
            self.watcher = EventWatcher(common, common.topic(Topic.ACKER_EVENTS), self.trees)
            self.replay_stage = ReplayStage(
                OriginalFetcher(common, ingest_topic), ingest_topic, common.topic(Topic.INGEST_DLQ),
                common.topic(Topic.ACKER_ACKS), settings.max_attempts, settings.tree_timeout_ms, replay=settings.replay,
            )
            self.replayer = TransactionalLoop.for_hop(
                topology.INGEST_REPLAYER, self.replay_stage, common=common, settings=settings.loop,
                instance=settings.instance,
            )
        self.committer = GroupCommitter(
            common,
            topic=ingest_topic,
            transactional_id=settings.transactional_id,
            max_pending=settings.max_pending,
            max_transaction_records=settings.max_transaction_records,
            linger_ms=settings.linger_ms,
            acking=acking,
        )
        self.servicer = IngestServicer(settings, self.committer, streams.directory(settings.common), settings.producers())
        self.server = ServiceServer.for_service(
            "ingest", settings, self,
            max_receive_bytes=settings.max_request_bytes,
            max_workers=settings.max_concurrent_calls + RESERVED_FOR_ADMIN,
            # IngestStream runs in the stream pool (admin/streams.py): room for every call slot
            # (the call limit, shared with Ingest, is what refuses streams), and for reflection.
            stream_threads=settings.max_concurrent_calls + STREAM_THREADS,
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
            gauges=self._gauges(),
        )

    def _gauges(self) -> dict[str, float]:
        gauges = {"pending": float(self.committer.pending), "max_pending": float(self.settings.max_pending)}
        if self.trees is not None and self.replay_stage is not None:
            gauges |= {
                "trees_in_flight": float(len(self.trees)),
                "trees_completed": float(self.trees.completed),
                "trees_failed": float(self.trees.failed),
                "trees_timed_out": float(self.replay_stage.timed_out),
                "replayed": float(self.replay_stage.replayed),
                "dead_lettered": float(self.replay_stage.dead_lettered),
            }
        return gauges

    def pause(self) -> str:
        self._state = "PAUSED"
        self.servicer.accepting.clear()
        if self.replayer is not None:
            self.replayer.pause()  # replays are records ingest writes too
        return self._state

    def resume(self) -> str:
        self._state = "RUNNING"
        self.servicer.accepting.set()
        if self.replayer is not None:
            self.replayer.resume()
        return self._state

    def drain(self, timeout_s: float) -> tuple[str, bool]:
        """Refuse calls and stop replaying; drained once every accepted record (every tree, with
        acking) is decided and the replayer has committed what it took."""
        self.pause()
        self._state = "DRAINED"
        deadline = time.monotonic() + timeout_s
        replayed = self.replayer is None or self.replayer.drain(timeout_s)
        while self.committer.pending and time.monotonic() < deadline:
            self._stop.wait(0.05)
        return self._state, replayed and self.committer.pending == 0

    # -- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """The shared lifecycle over the committer and (with acking) the replayer. On a stop,
        calls are refused and the running ones finish before the committer commits what is in
        flight and stops."""
        if self.watcher is not None:
            try:
                # From acker.events' ends as they are before the first record: every event of a
                # tree this instance starts lies past them.
                self.watcher.start()
            except KafkaException as exc:  # the broker did not answer within the watcher's wait
                log.error("cannot find where acker.events ends (%s); exiting so a new process tries again", exc)
                return EXIT_RESTART
        workers: list[Worker] = [CommitterWorker(self.committer, self.settings.shutdown_grace_s)]
        if self.replayer is not None:
            workers.append(self.replayer)  # serving without it would lose every failed tree's replay
        log.info(
            "ingest ready: writing %s as %s (acking %s)",
            self.settings.common.topic(Topic.INGEST_RECORDS), self.settings.transactional_id,
            "on" if self.settings.acking else "off",
        )
        try:
            code = run_loop_service(
                workers, self.server, self.settings.metrics_port, self.settings.host,
                grace_s=self.settings.shutdown_grace_s, calls_first=True,
            )
        finally:
            if self.watcher is not None:
                self.watcher.stop()
        log.info({
            EXIT_OK: "stopped cleanly", EXIT_FENCED: "stopped after being fenced", EXIT_RESTART: "stopped to be restarted",
        }.get(code, "stopped after a failure"))
        return code
