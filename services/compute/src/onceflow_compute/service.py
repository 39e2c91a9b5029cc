"""Composition: settings -> the job and its engine (engine/) -> the map hop (map/) and, unless
the job is a transform, the merge hop (merge/) on the shared loop -> gRPC (Admin +
ComputeAdmin + health)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException

from onceflow import metrics, readers, streams, topology
from onceflow.admin import FixedControls, ServiceServer
from onceflow.admin.loop_controls import LoopControls
from onceflow.codec import now_ms
from onceflow.config import CommonSettings
from onceflow.kafka import inspect
from onceflow.kafka.topics import ensure_topics, job_specs
from onceflow.runner import on_stop_signals, run_loop_service
from onceflow.service_main import EXIT_USAGE
from onceflow.state.store import MemoryStore
from onceflow.state.stores import PartitionStores, memory_store
from onceflow.topology import Topic, job_topic, versioned
from onceflow.txn import TransactionalLoop
from onceflow.v1 import compute_pb2, compute_pb2_grpc

from onceflow_compute import jobs, lifecycle, stats
from onceflow_compute.admin import ComputeAdminServicer, state_keys
from onceflow_compute.api import Aggregation, Job, Join, Transform
from onceflow_compute.config import ComputeSettings, EngineName
from onceflow_compute.dataflow.watermarks import WatermarkTracker
from onceflow_compute.engine import Engine
from onceflow_compute.engine.pandas_engine import PandasEngine
from onceflow_compute.engine.shipping import modules_to_ship
from onceflow_compute.engine.spark import spark_engine
from onceflow_compute.fingerprint import Decision
from onceflow_compute.lifecycle import StateCheck
from onceflow_compute.map.eventtime import EventTimeGate
from onceflow_compute.map.stage import MapStage
from onceflow_compute.merge.aggregation import MergeStage
from onceflow_compute.merge.joined import JoinMergeStage
from onceflow_compute.merge.windowed import WindowedMergeStage

log = logging.getLogger(__name__)


def make_engine(settings: ComputeSettings, job: Job) -> Engine:
    """The job's name names the app; the module ONCEFLOW_COMPUTE_JOB names is shipped, with
    the modules of its user combiners."""
    if settings.engine is EngineName.PANDAS:
        return PandasEngine()
    return spark_engine(
        app_name=f"onceflow-compute-{job.name}-{settings.instance}",
        ship=modules_to_ship(settings.job, job),
        batch_timeout_s=settings.batch_timeout_s,
        settings=settings,
    )


def merge_stage_for(job: Aggregation | Join, results_topic: str, counts: stats.JobCounts) -> MergeStage | WindowedMergeStage | JoinMergeStage:
    if isinstance(job, Join):
        return JoinMergeStage(job, results_topic, counts)
    if job.windowed:
        return WindowedMergeStage(job, results_topic, counts)
    return MergeStage(job, results_topic, counts)


def load_deployed_job(settings: ComputeSettings) -> Job:
    """The job ONCEFLOW_COMPUTE_JOB names, under the name its version runs as (``orders@2``;
    version 0: its plain name)."""
    job = jobs.load_job(settings.job)
    return dataclasses.replace(job, name=versioned(job.name, settings.version)) if settings.version else job


def ensure_job_topics(common: CommonSettings, job: str, partitions: int = 0) -> None:
    """The job's own shuffle and state topics (docs/decisions/0018), as topics.toml declares
    them (or with ``partitions``: a rescaled version), so a new job needs no manual step.
    Retried while the broker is still starting, as the loops' clients would be."""
    while True:
        try:
            created = ensure_topics(common.kafka_bootstrap, common.topic_prefix, job_specs(job, partitions=partitions))
        except (KafkaException, TimeoutError) as exc:
            log.warning("creating the topics of job %s: %s; retrying", job, exc)
            time.sleep(1.0)
            continue
        if created:
            log.info("created %s", ", ".join(created))
        return


def find_stream(settings: ComputeSettings, job: Job) -> bool:
    """Whether the job's stream exists (created first if the operator asked for that: it never
    is by a misspelt name alone); asked again while the broker does not answer. Logs what the
    job will read before it reads it."""
    common = settings.common
    while True:
        try:
            if settings.create_stream and streams.create(common, job.stream, common.history_retention_ms):
                log.info("created stream %s (ONCEFLOW_COMPUTE_CREATE_STREAM)", streams.display(job.stream))
            if not streams.lookup(common, job.stream):
                return False
            log.info("job %s reads %s", job.name, streams.reading(common, job.stream, settings.group_id_of(topology.COMPUTE_MAP, job.name)))
            return True
        except (KafkaException, TimeoutError) as exc:
            log.warning("looking up stream %s: %s; retrying", streams.display(job.stream), exc)
            time.sleep(1.0)


def check_job_state(settings: ComputeSettings, job: Job) -> StateCheck | None:
    """Before anything is consumed: does the job's stored state fit the loaded job
    (docs/decisions/0023)? None for a transform (no state)."""
    if isinstance(job, Transform):
        return None
    check = lifecycle.check_state(settings.common, job)
    if check.refused:
        log.error("%s", check.reason())
    elif check.verdict.decision is Decision.CARRY_OVER:
        log.warning(
            "job %s: state written under another fingerprint carries over by name to %s (%s)",
            job.name, check.loaded, "; ".join(check.verdict.differences),
        )
    if check.unfingerprinted:
        log.warning(
            "job %s: partitions %s hold state written before fingerprints: taken as %s once, and it is written with them",
            job.name, list(check.unfingerprinted), check.loaded,
        )
    return check


def serve_refusal(settings: ComputeSettings, reason: str) -> int:
    """Stay up, NOT_SERVING, with the reason in Admin Status, until stopped: no loop, no
    engine, nothing consumed. Exiting instead would make a supervisor restart it in a loop."""
    server = ServiceServer.for_service("compute", settings, FixedControls("REFUSED", reason))
    stopped = threading.Event()
    on_stop_signals(stopped.set)
    metrics.serve(settings.metrics_port, settings.host)
    server.start()
    server.set_serving(False)
    stopped.wait()
    log.info("stopped while refusing to run its job")
    server.stop(1.0)
    return 0


@dataclass(frozen=True)
class JobTopics:
    """The topics a job's hops read and write (prefixed)."""

    input: str  # the job's stream: no other stream's records
    partials: str
    results: str
    late: str


def job_topics(common: CommonSettings, job: Job) -> JobTopics:
    return JobTopics(
        input=common.topic(streams.topic_of(job.stream)),
        partials=common.topic(job_topic(Topic.COMPUTE_PARTIALS, job.name)),
        results=common.topic(Topic.COMPUTE_RESULTS),
        late=common.topic(Topic.COMPUTE_LATE),
    )


def event_time_gate(settings: ComputeSettings, job: Job, topics: JobTopics) -> EventTimeGate | None:
    """A windowed job's map hop holds records back by event time (its watermark, late records
    aside); None for any other job."""
    if not isinstance(job, (Aggregation, Join)) or not job.windowed:
        return None
    common = settings.common
    return EventTimeGate(
        job,
        settings.watermark_bound_ms,
        topics.late,
        topics.partials,
        len(inspect.partitions_of(common, topics.partials)),
        len(inspect.partitions_of(common, topics.input)),
        common.event_time_max_ahead_ms,
    )


def map_hop(
    settings: ComputeSettings, job: Job, engine: Engine, topics: JobTopics, counts: stats.JobCounts,
) -> tuple[TransactionalLoop[MemoryStore], MapStage]:
    """The map hop: the job's stream through the engine into partials (a transform's rows
    straight into results)."""
    watermarks = WatermarkTracker(settings.watermark_bound_ms, settings.idle_timeout_ms)
    event_time = event_time_gate(settings, job, topics)
    map_stage = MapStage(
        job, engine, topics.partials, topics.results, counts, settings.bisect_budget, watermarks, event_time,
    )
    map_loop = TransactionalLoop.for_hop(
        topology.COMPUTE_MAP, map_stage, common=settings.common, settings=settings.map_loop, instance=settings.instance,
        job=job.name, input_topic=topics.input,
        # A windowed job's map hop (the one with an event-time gate) keeps each input
        # partition's newest event time.
        store=memory_store if event_time is not None else None,
    )
    return map_loop, map_stage


def merge_hop(
    settings: ComputeSettings, job: Aggregation | Join, topics: JobTopics, counts: stats.JobCounts,
) -> TransactionalLoop[MemoryStore]:
    """The merge hop: partials folded into the job's state, its rows into results."""
    return TransactionalLoop.for_hop(
        topology.COMPUTE_MERGE, merge_stage_for(job, topics.results, counts), common=settings.common,
        settings=settings.loop, instance=settings.instance, job=job.name, store=memory_store,
    )


@dataclass(frozen=True)
class RunningJob:
    """The parts of a built job that its admin RPCs and its gauges read."""

    job: Job
    counts: stats.JobCounts
    map_loop: TransactionalLoop[MemoryStore]
    watermarks: WatermarkTracker
    stores: PartitionStores[MemoryStore] | None  # the merge hop's: the job's state (none for a transform)

    def keys_in_state(self) -> int:
        return 0 if self.stores is None else sum(state_keys(self.job, store) for _p, store in self.stores.items())

    def watermark_or(self, missing: float) -> float:
        mark = self.watermarks.watermark(now_ms())
        return missing if mark is None else float(mark)

    def export_gauges(self) -> None:
        """Into the job's Prometheus gauges, read at each scrape."""
        name = self.job.name
        stats.BATCH_BOUND.labels(name).set_function(lambda: self.map_loop.stats.batch_bound)
        stats.KEYS.labels(name).set_function(self.keys_in_state)
        stats.WATERMARK.labels(name).set_function(lambda: self.watermark_or(math.nan))

    def gauges(self) -> dict[str, float]:
        """For Admin Status."""
        return {
            "batch_bound": float(self.map_loop.stats.batch_bound),
            "keys_in_state": float(self.keys_in_state()),
            "results": float(self.counts.results),
            "job_seconds_p99": self.counts.job_seconds(0.99),
            "watermark_ms": self.watermark_or(-1.0),
        }


def admin_server(
    settings: ComputeSettings, engine: Engine, loops: list[TransactionalLoop[MemoryStore]], running: RunningJob,
) -> ServiceServer:
    """Admin (over the loops), ComputeAdmin and health; the job's gauges exported."""
    admin = ComputeAdminServicer(
        running.job,
        engine.name,
        running.counts,
        loops,
        running.stores,
        (settings.min_batch_records, settings.max_batch_records),
        running.watermarks,
    )
    running.export_gauges()
    return ServiceServer.for_service(
        "compute", settings, LoopControls(loops, running.gauges),
        add_servicers=lambda server: compute_pb2_grpc.add_ComputeAdminServicer_to_server(admin, server),
        service_names=(compute_pb2.DESCRIPTOR.services_by_name["ComputeAdmin"].full_name,),
    )


def build(
    settings: ComputeSettings, job: Job | None = None
) -> tuple[list[TransactionalLoop[MemoryStore]], ServiceServer, Engine]:
    job = job or load_deployed_job(settings)  # a bad job name fails here, before Spark starts
    topics = job_topics(settings.common, job)
    if not isinstance(job, Transform):
        ensure_job_topics(settings.common, job.name, settings.partitions)
    engine = make_engine(settings, job)
    counts = stats.JobCounts()
    map_loop, map_stage = map_hop(settings, job, engine, topics, counts)
    merge_loop = None if isinstance(job, Transform) else merge_hop(settings, job, topics, counts)
    loops = [map_loop] if merge_loop is None else [map_loop, merge_loop]
    stores = None if merge_loop is None else merge_loop.stores
    running = RunningJob(job, counts, map_loop, map_stage.watermarks, stores)
    return loops, admin_server(settings, engine, loops, running), engine


def run(settings: ComputeSettings) -> int:
    try:
        job = load_deployed_job(settings)
    except jobs.NoSuchJob as exc:
        # A setting that names nothing: refused at start like any invalid setting (exit 2, which
        # supervise does not restart), so `tilt ci` and a deploy fail at once, naming it.
        log.error("invalid settings: ONCEFLOW_COMPUTE_JOB: %s", exc)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything on import
        # Code that exists but fails: up and NOT_SERVING with the reason, not a crash that a
        # platform restarts in a loop; a fixed module deployed replaces the worker.
        reason = f"job module {settings.job!r} does not load: {type(exc).__name__}: {exc}"
        log.error("%s", reason, exc_info=not isinstance(exc, ValueError))
        return serve_refusal(settings, reason)
    if not find_stream(settings, job):
        log.error("invalid settings: job %s reads %s", job.name, streams.missing_stream(job.stream))
        return EXIT_USAGE
    if not isinstance(job, Transform):
        ensure_job_topics(settings.common, job.name, settings.partitions)
    check = check_job_state(settings, job)
    if check is not None and check.refused:
        return serve_refusal(settings, check.reason())
    loops, server, engine = build(settings, job)
    registered = register_reader(settings, job)
    code = 1
    try:
        code = run_loop_service(loops, server, settings.metrics_port, settings.host)
        return code
    finally:
        engine.close()
        if registered and code == 0:
            unregister_reader(settings, job)


def register_reader(settings: ComputeSettings, job: Job) -> bool:
    """Say that this worker reads the job's stream (docs/decisions/0028): the gate gives the job
    an ack edge of its own in each record it passes from now on. A failure leaves the trees of a
    stream read by several jobs to end late, never the records: logged, not fatal."""
    try:
        readers.register(settings.common, job.stream, job.name, settings.instance)
    except Exception as exc:  # noqa: BLE001 - the broker's answer, whatever it is, is only logged
        log.warning("could not say that job %s reads stream %s (%s): its records' trees may end late",
                    job.name, streams.display(job.stream), exc)
        return False
    return True


def unregister_reader(settings: ComputeSettings, job: Job) -> None:
    """A clean stop: the job's trees stop waiting on this worker. Not on a fenced or failed exit,
    where a replacement or a restart reads on under the same instance."""
    try:
        readers.unregister(settings.common, job.stream, job.name, settings.instance)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not remove job %s from stream %s's readers (%s): `onceflow stream readers --forget %s`",
                    job.name, streams.display(job.stream), exc, job.name)
