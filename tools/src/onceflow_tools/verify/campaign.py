"""One verify campaign: the whole pipeline on a fresh topic prefix, a generated workload pushed
through ingest by retrying clients, a fault schedule running while they send, then the checker.

Two workloads, each with a job whose every row shows a lost or doubled record:
- ``nexmark`` (persons, auctions, bids, out of order), job ``auctionbids``: a count and sum per
  auction, so every bid must count exactly once in its auction's row in Redis;
- ``keyed-count`` (``{"user", "amount"}`` keyed by user), job ``usersum``: count, total and
  extremes per user.

With ``source`` (``onceflow verify --source``) the workload enters through the Kafka source
instead: produced once each into a user topic of the run, copied by the source service under its
default record ids (``source_mode``); the checker then expects those ids.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.config import CommonSettings
from onceflow.faults import ALLOW_ENV, SABOTAGE_ENV, VERIFY_SABOTAGES
from onceflow.redis_client import connect, delete_prefix
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.infra import stack
from onceflow_tools.infra.kafka import cluster as kafka_cluster
from onceflow_tools.infra.topics import delete_topics, provision
from onceflow_tools.verify import spark_faults
from onceflow_tools.verify.check import Verdict, check, undrained
from onceflow_tools.verify.kafka_output import check_output_topic, kafka_output_behind
from onceflow_tools.verify.kafka_faults import CLUSTER_KINDS
from onceflow_tools.verify.schedule import KINDS, POSTGRES_KINDS, SOURCE_KINDS, FaultSchedule, available_kinds
from onceflow_tools.verify.source_mode import SourceTopic
from onceflow_tools.verify.spark_faults import SPARK_KINDS
from onceflow_tools.verify.supervisor import SERVICES, WITH_KAFKA_OUTPUT, WITH_SOURCE, Supervisor
from onceflow_tools.workloads import ResultTable, auctionbids, nexmark, usersum
from onceflow_tools.workloads.senders import Senders

log = logging.getLogger(__name__)

# Short, so a paused member leaves the group soon and a zombie's replacement takes over quickly.
SESSION_TIMEOUT_MS = 6_000
WORKLOADS = ("nexmark", "keyed-count")
SINKS = ("redis", "postgres", "kafka")
# Batches sent again after each fault, and once more at the end, from those acknowledged before.
LATE_BATCHES_PER_FAULT = 5
LATE_BATCHES_AT_END = 20
# What the gate's and the sink's logs say when they start rebuilding a partition from Kafka.
REPAIR_LOGGED = re.compile(r"rebuilding it from the changelog|replaying compute.results from its start")


@dataclass
class CampaignOptions:
    records: int = 0  # 0: rate × duration
    rate: int = 300  # records/s the clients offer
    duration_s: float = 120.0  # how long faults are injected (the clients' sending time at ``rate``)
    faults: tuple[str, ...] = ()  # (): every kind the stack can take (available_kinds)
    fault_every_s: float = 10.0
    resend_ratio: float = 0.05  # share of batches a client sends twice (a lost reply)
    # Earlier batches sent again after each fault and at the end: a dedup id lost with Redis
    # shows only when its record comes again. They also re-deliver what a broken build lost,
    # so a test of the offsets check turns them off.
    late_resends: bool = True
    clients: int = 4
    batch: int = 100
    max_delay_ms: int = 2_000
    seed: int = 1
    settle_s: float = 300.0  # after the clients finish: how long the sink may take to converge
    sabotage: str = ""  # comma-separated faults.VERIFY_SABOTAGES: a deliberately broken pipeline (tests of the checker)
    keep: bool = False
    workload: str = "nexmark"
    users: int = 1_000  # keyed-count: distinct keys
    # The workload produced into a user topic and copied in by the Kafka source (source_mode);
    # re-sends do not exist there (the same payload produced again is a new record), so
    # resend_ratio and late_resends are off.
    source: bool = False
    # Where the results go, comma-separated: redis or postgres (the store of the sink's tables;
    # postgres enables the PostgreSQL faults), and kafka (the job's table also written to an
    # output topic by a second sink, checked too). "kafka" alone keeps the tables in Redis.
    sink: str = "redis"

    def __post_init__(self) -> None:
        if self.source:
            self.resend_ratio, self.late_resends = 0.0, False
        if not self.records:
            self.records = int(self.rate * self.duration_s)
        if self.records < 1 or self.rate < 1 or self.clients < 1 or self.batch < 1 or self.fault_every_s <= 0:
            raise ValueError("records, rate, clients, batch and fault-every must be positive")
        if not 0.0 <= self.resend_ratio <= 1.0:
            raise ValueError(f"resend ratio must be in [0, 1], got {self.resend_ratio}")
        sinks = {part.strip() for part in self.sink.split(",") if part.strip()}
        if not sinks or sinks - set(SINKS):
            raise ValueError(f"unknown sink {self.sink!r}; known: {', '.join(SINKS)} (kafka may join either store: postgres,kafka)")
        if {"redis", "postgres"} <= sinks:
            raise ValueError("the sink keeps its tables in one store: redis or postgres")
        self.sink = ",".join(sorted(sinks))
        if not self.faults:
            self.faults = available_kinds(source=self.source, sink_store=self.sink_store)
        needs_source = sorted(set(self.faults) & set(SOURCE_KINDS)) if not self.source else []
        if needs_source:
            raise ValueError(f"{', '.join(needs_source)} needs the Kafka source: --source")
        if "redis-failover" in self.faults and "redis-failover" not in available_kinds():
            raise ValueError(
                "redis-failover needs the Sentinel topology: ONCEFLOW_REDIS_TOPOLOGY=sentinel and "
                "ONCEFLOW_REDIS_URL=redis+sentinel://127.0.0.1:<sentinel port>/onceflow/0 (docs/redis.md)"
            )
        unknown = set(self.faults) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        needs_postgres = sorted(set(self.faults) & set(POSTGRES_KINDS)) if self.sink_store != "postgres" else []
        if needs_postgres:
            raise ValueError(f"{', '.join(needs_postgres)} need the sink's tables in PostgreSQL: --sink postgres")
        needs_cluster = sorted(set(self.faults) & set(CLUSTER_KINDS) - set(available_kinds()))
        if needs_cluster:
            raise ValueError(f"{', '.join(needs_cluster)} need a 3-node Kafka cluster: --brokers 3 (docs/architecture.md, 'On a Kafka cluster')")
        needs_spark = sorted(set(self.faults) & set(SPARK_KINDS) - set(available_kinds()))
        if needs_spark:
            raise ValueError(f"{', '.join(needs_spark)} need compute on a Spark cluster: --spark standalone (docs/services/compute.md, 'Running on a cluster')")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")
        if self.users < 1:
            raise ValueError("users must be positive")
        unknown = {s for s in self.sabotage.split(",") if s} - set(VERIFY_SABOTAGES)
        if unknown:
            raise ValueError(f"unknown sabotage {sorted(unknown)}; known: {', '.join(VERIFY_SABOTAGES)}")

    @property
    def sink_store(self) -> str:
        """The store the sink service keeps the tables in (the Kafka output sink runs beside it)."""
        return "postgres" if "postgres" in self.sink.split(",") else "redis"

    @property
    def kafka_output(self) -> bool:
        return "kafka" in self.sink.split(",")

    @property
    def focus(self) -> tuple[str, ...]:
        """The services under test beyond the default pipeline: the first kill -9 and zombie hit them."""
        return (*(("sink",) if self.sink_store == "postgres" else ()), *(("sink_kafka",) if self.kafka_output else ()))


@dataclass(frozen=True)
class Workload:
    """What the clients send, the job that runs on it, and its answers computed without the
    pipeline (the batch answer, itself checked against a plain fold)."""

    records: list[IngestRecord]
    compute_settings: dict[str, str]
    batch_answer: Callable[[], ResultTable]
    fold_answer: Callable[[], ResultTable]
    sink_table: Callable[[str], ResultTable]


def workload(options: CampaignOptions) -> Workload:
    run_id = f"verify{options.seed}"
    if options.workload == "keyed-count":
        keyed = list(usersum.records(options.records, options.users, run_id, options.seed))
        return Workload(
            usersum.ingest_records(keyed), {"JOB": usersum.JOB},
            lambda: usersum.batch_answer(keyed), lambda: usersum.fold_answer(keyed), usersum.sink_table,
        )
    config = nexmark.NexmarkConfig(
        events=options.records, rate=max(options.rate, 1), max_delay_ms=options.max_delay_ms, seed=options.seed
    )
    arrivals = nexmark.arrival_order(config)
    return Workload(
        nexmark.ingest_records(arrivals, run_id),
        {"JOB": auctionbids.JOB, "WATERMARK_BOUND_MS": str(options.max_delay_ms)},
        lambda: auctionbids.batch_answer(arrivals), lambda: auctionbids.fold_answer(arrivals), auctionbids.sink_table,
    )


@dataclass
class Progress:
    """What the campaign reports while it runs (the CLI renders it)."""

    phase: str = "starting"
    sent: int = 0
    total: int = 0
    notes: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)


def run(options: CampaignOptions, on_progress: Callable[[Progress], None] = lambda _p: None) -> Verdict:
    progress = Progress(total=options.records)

    def note(text: str) -> None:
        log.info("verify: %s", text)
        progress.notes.append(text)
        on_progress(progress)

    stack.up(postgres=options.sink_store == "postgres")
    prefix = f"verify{int(time.time())}s{options.seed}."
    # The campaign arms services to crash at chosen points (ONCEFLOW_FAULT): allowed here.
    env = {"ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS), ALLOW_ENV: "1"}
    nodes = kafka_cluster()
    if len(nodes) > 1 and "ONCEFLOW_KAFKA_BOOTSTRAP" not in os.environ:
        # Every node: a client must still find the cluster while the first one is down.
        env["ONCEFLOW_KAFKA_BOOTSTRAP"] = ",".join(node.bootstrap for node in nodes)
    common = CommonSettings(topic_prefix=prefix, kafka_bootstrap=env.get("ONCEFLOW_KAFKA_BOOTSTRAP", CommonSettings().kafka_bootstrap))
    provision(common.kafka_bootstrap, prefix=prefix)
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-verify-"))
    note(f"topics {prefix!r} on {len(nodes)} broker(s); service logs in {log_dir}")
    if options.sabotage:
        env |= {SABOTAGE_ENV: options.sabotage}
        note(f"[red]sabotaged build[/]: {options.sabotage}")
    load = workload(options)
    compute_settings = dict(load.compute_settings)
    if spark_faults.available():
        compute_settings |= spark_faults.compute_settings()
        note(f"compute on the Spark cluster at {compute_settings['SPARK_MASTER']}")
    settings = {"compute": compute_settings, "sink": {"STORE": options.sink_store}}
    if options.sink_store == "postgres":
        note(f"the sink keeps the tables in PostgreSQL ({_postgres_address(common)})")
    source = None
    if options.source:
        # Before the source starts: it refuses a topic that does not exist.
        source = SourceTopic(common, load.records, options.rate)
        # No ID_FIELD: the default record ids, kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>.
        settings["source"] = {"TOPIC": source.name, "ID_FIELD": ""}
        note(f"the workload goes through the Kafka source: produced into {source.name}, copied by a sixth service; "
             "no client re-sends or late re-sends (a record produced again is a new record)")
    services = WITH_SOURCE if source else SERVICES
    if options.kafka_output:
        if source is not None:
            raise ValueError("--sink kafka and --source: one extra service at a time")
        settings["sink_kafka"] = {"JOB": load.compute_settings["JOB"], "TOPIC": output_topic(prefix, load.compute_settings["JOB"])}
        services = WITH_KAFKA_OUTPUT
        note(f"the job's table is also written to the output topic {settings['sink_kafka']['TOPIC']} by a second sink")
    supervisor = Supervisor(prefix, log_dir, settings=settings, env=env, services=services)
    try:
        progress.phase = "starting services"
        on_progress(progress)
        supervisor.start_all()
        return Campaign(options, load, common, supervisor, progress, note, on_progress, source).run()
    finally:
        supervisor.stop_all()
        if source is not None:
            source.close()
        if not options.keep:
            delete_topics(common.kafka_bootstrap, prefix=prefix)
            delete_prefix(connect(common.redis_url), prefix)
            if options.sink_store == "postgres":
                drop_schema(common)


def output_topic(prefix: str, job: str) -> str:
    """The run's Kafka output topic (under its prefix, so it goes with the run's topics)."""
    return f"{prefix}results.{job}"


def _postgres_address(common: CommonSettings) -> str:
    return common.postgres_url.rsplit("@", 1)[-1]


def drop_schema(common: CommonSettings) -> None:
    """The run's tables in PostgreSQL (its schema), as its Redis keys are deleted."""
    from onceflow_sink.postgres import PostgresTables  # psycopg only when the run used it

    store = PostgresTables.connect(common.postgres_url, common.topic_prefix)
    try:
        store.drop_schema()
    finally:
        store.close()


def _batch_answer(load: Workload, note: Callable[[str], None]) -> ResultTable:
    """The reference answer (Spark over the workload as one bounded input). Its JVM can fail to
    start on a loaded machine (pyspark's JAVA_GATEWAY_EXITED, seen once in a suite run): that is
    the checker's tool failing, not the pipeline, so it gets one more try."""
    try:
        return load.batch_answer()
    except Exception as exc:  # noqa: BLE001 - retried once, then raised as it is
        note(f"the batch answer failed ({exc}); computing it again")
        return load.batch_answer()


def _sink_rows(
    load: Workload, supervisor: Supervisor, refresh: Callable[[], None], until: Callable[[ResultTable], bool], deadline: float,
) -> ResultTable:
    """The sink's table, read through Query until ``until`` holds or the deadline passes."""
    rows: ResultTable = {}
    while True:
        refresh()
        try:
            rows = load.sink_table(supervisor.address("sink"))
            if until(rows):
                return rows
        except Exception as exc:  # noqa: BLE001 - a sink restarting right now
            log.info("sink not answering yet: %s", exc)
        if time.monotonic() >= deadline:
            return rows
        time.sleep(2.0)


def _repairs_logged(log_dir: Path) -> int:
    """Partition stores the services rebuilt from Kafka, counted from every instance's log (an
    instance killed since took its counters with it)."""
    return sum(
        len(REPAIR_LOGGED.findall(path.read_text(errors="replace"))) for path in log_dir.glob("*.log")
    )


class Campaign:
    """One campaign on started services, phase by phase: the workload sent while faults are
    injected, the pipeline left to settle and drain, then every topic checked."""

    def __init__(
        self,
        options: CampaignOptions,
        load: Workload,
        common: CommonSettings,
        supervisor: Supervisor,
        progress: Progress,
        note: Callable[[str], None],
        on_progress: Callable[[Progress], None],
        source: SourceTopic | None = None,
    ) -> None:
        self.options, self.load, self.common, self.supervisor = options, load, common, supervisor
        self.progress, self.note, self.on_progress, self.source = progress, note, on_progress, source
        self.job = load.compute_settings["JOB"]
        # The input: clients through ingest, or (--source) a producer into the user topic. Only
        # one of them sends; the other is never started.
        self.senders = Senders(
            supervisor.address("ingest"), load.records, options.batch, options.clients, options.resend_ratio, options.seed,
            options.rate,
        )
        self.sending: Senders | SourceTopic = source or self.senders
        self.schedule = FaultSchedule(
            supervisor, options.faults, options.fault_every_s, options.seed, takeover_s=SESSION_TIMEOUT_MS / 1000 + 2,
            on_fault=self._after_fault, source=source, sink_store=options.sink_store, focus=options.focus,
        )

    def run(self) -> Verdict:
        batch_answer = self._batch_answer_meanwhile()
        self._send_with_faults()
        self._resend_earlier_batches()
        injected = self._injected()
        self.note(f"faults injected: {injected}")
        # What the checker expects: the generator's record_ids, or every record produced into the
        # source topic (each once), under the id the source must give it.
        expected = self.source.expected_ids() if self.source else {r.record_id.decode() for r in self.load.records}
        batch_rows = self._batch_rows(batch_answer)
        rows, behind = self._settle(batch_rows)
        return self._check(expected, rows, batch_rows, injected, behind)

    # -- sending, with faults -----------------------------------------------------------------

    def _refresh(self) -> None:
        for name in self.supervisor.restart_exited():
            self.note(f"{name} exited on its own: restarted")
        self.progress.addresses = {name: instance.address for name, instance in self.supervisor.instances.items()}
        self.on_progress(self.progress)

    def _after_fault(self, text: str) -> None:
        self.note(text)
        if self.options.late_resends:
            self.senders.resend_earlier(LATE_BATCHES_PER_FAULT)

    def _batch_answer_meanwhile(self) -> Future[ResultTable]:
        """The reference answer depends on the workload alone: Spark computes it while the
        clients send, instead of after them (a Spark start and job, 30-60 s on a busy 2-core
        machine)."""
        reference = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-answer")
        batch_answer = reference.submit(_batch_answer, self.load, self.note)
        reference.shutdown(wait=False)
        return batch_answer

    def _send_with_faults(self) -> None:
        """Until the input is sent, then until the fault under way has finished."""
        progress, sending, schedule = self.progress, self.sending, self.schedule
        progress.phase = "sending, with faults"
        sending.start()
        schedule.start()
        while sending.running():
            progress.sent = sending.acknowledged
            self._refresh()
            time.sleep(0.5)
        progress.sent = sending.acknowledged
        schedule.stop()
        progress.phase = "letting the last fault finish"
        while schedule.is_alive():
            self._refresh()
            schedule.join(0.5)

    def _resend_earlier_batches(self) -> None:
        self.progress.phase = "re-sending earlier batches"
        self.on_progress(self.progress)
        if self.options.late_resends:
            self.senders.resend_earlier(LATE_BATCHES_AT_END)
        self.senders.join_late()

    def _injected(self) -> dict[str, int]:
        """What the run injected: the faults, and the clients' re-sends (or the source's
        restarts); a sender or a schedule that gave up fails the campaign here."""
        source, senders = self.source, self.senders
        if self.sending.error is not None:
            raise RuntimeError(f"{'the producer into the source topic' if source else 'a client'} gave up: {self.sending.error}")
        if self.schedule.error is not None:
            raise RuntimeError(f"the fault schedule failed: {self.schedule.error}")
        injected = dict(self.schedule.injected)
        if source is None:
            injected["client_resends"] = len(senders.sent_again)
            injected["client_transport_retries"] = senders.retries
            injected["client_late_resends"] = senders.late_resends
        else:
            injected["source_restarts_after_recreate"] = source.restarts_after_recreate
        return injected

    # -- settling -----------------------------------------------------------------------------

    def _batch_rows(self, batch_answer: Future[ResultTable]) -> ResultTable:
        self.progress.phase = "computing the batch answer (Spark)"
        self.on_progress(self.progress)
        batch_rows = batch_answer.result()
        if batch_rows != self.load.fold_answer():
            raise RuntimeError("Spark's batch answer differs from a plain fold of the records")
        return batch_rows

    def _in_flight(self) -> list[str]:
        """What is not yet through: the source's copying (--source), then the pipeline."""
        behind = (self.source.behind() if self.source else []) or undrained(
            self.common, self.job, sink_store=self.options.sink_store
        )
        if not behind and self.options.kafka_output:
            behind = kafka_output_behind(self.common, self.job, output_topic(self.common.topic_prefix, self.job))
        return behind

    def _settle(self, batch_rows: ResultTable) -> tuple[ResultTable, list[str]]:
        """The sink's table once the pipeline drained (or the settle time is out), and what was
        still in flight then."""
        self.progress.phase = "waiting for the sink to converge"
        deadline = time.monotonic() + self.options.settle_s
        # Until the table matches, or the pipeline drained without it: then nothing is in flight
        # that could still change a row, and waiting out the settle time would only delay a fail.
        _sink_rows(
            self.load, self.supervisor, self._refresh, until=lambda rows: rows == batch_rows or not self._in_flight(),
            deadline=deadline,
        )
        # An early match proves little while copies are still in flight: judge a drained pipeline.
        behind = self._drain(deadline)
        rows = _sink_rows(self.load, self.supervisor, self._refresh, until=lambda _rows: True, deadline=time.monotonic() + 60)
        return rows, behind

    def _drain(self, deadline: float) -> list[str]:
        """Until every consumer has read to the end or the deadline passes: what is still behind."""
        self.progress.phase = "waiting for every consumer to read to the end"
        self.on_progress(self.progress)
        behind = self._in_flight()
        while behind and time.monotonic() < deadline:
            self._refresh()
            time.sleep(2.0)
            behind = self._in_flight()
        if behind:
            self.note(f"not drained within the settle time: {behind}")
            for path in self.supervisor.dump_stacks():
                self.note(f"stacks: {path}")
        return behind

    # -- checking -----------------------------------------------------------------------------

    def _check(
        self, expected: set[str], rows: ResultTable, batch_rows: ResultTable, injected: dict[str, int], behind: list[str],
    ) -> Verdict:
        self.progress.phase = "checking every topic"
        self.on_progress(self.progress)
        verdict = check(self.common, self.job, expected, rows, batch_rows, injected, still_undrained=behind)
        if self.options.kafka_output:
            check_output_topic(verdict, self.common, output_topic(self.common.topic_prefix, self.job), batch_rows)
        verdict.redis_repairs = _repairs_logged(self.supervisor.log_dir)
        verdict.late_resends = self.senders.late_resends
        verdict.zombie_exits = [z.exit_code for z in self.supervisor.zombies]
        verdict.unexpected_restarts = dict(self.supervisor.restarts)
        return verdict
