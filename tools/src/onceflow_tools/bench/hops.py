"""One hop at a time on the same backlog: onceflow's dedup gate and compute worker, and what a
user would otherwise run for the same job (a Quix Streams or a Kafka Streams exactly-once app) or
could at best get (a bare transactional copier). Each runs as its own process and is timed the same way: from its
consumer group's first commit until it has committed the whole backlog (``watch.py``).

onceflow's services are warmed up first (Spark JIT-compiles its own code for minutes): they
consume a warm-up backlog, are paused through their Admin API while the measured backlog is
written, and resumed. The peers start at full speed: Quix is plain Python over librdkafka, and
Kafka Streams' JVM starts cold but its group join is not timed either."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings, repo_root
from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets
from onceflow.redis_client import connect, delete_prefix
from onceflow.topology import Topic, job_topic
from onceflow_tools import admin_client
from onceflow_tools.bench import workload
from onceflow_tools.bench.cpu import SpanMeter
from onceflow_tools.bench.watch import BacklogRun, GroupWatch, time_backlog
from onceflow_tools.infra.kafka import java_executable
from onceflow_tools.infra.topics import TopicSpec, delete_topics, ensure_topics, job_specs
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service

QUIX_DIR = Path("bench") / "peers" / "quix"
KSTREAMS_DIR = Path("bench") / "peers" / "kstreams"
KSTREAMS_JAR = Path("target") / "onceflow-kstreams-peer.jar"
PEER_INPUT, PEER_OUTPUT = "peer.input", "peer.output"
# The pipeline's exactly-once hops: ingest's group commit, the gate, compute's map and merge, the sink.
CHAIN_LENGTH = 5
# The contenders of the hop table, by the job they do.
HOPS = ("copier", "copier-chain", "dedup", "quix-dedup", "kstreams-dedup", "compute", "quix-keyed-count", "kstreams-keyed-count")
# Kafka Streams' own default commit.interval.ms under exactly_once_v2 (30 s under at_least_once).
KSTREAMS_DEFAULT_COMMIT_INTERVAL_S = 0.1
_TOKEN = "bench"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HopOptions:
    records: int = 200_000
    warm_up_records: int = 50_000
    users: int = 1_000
    quix_commit_interval_s: float = 1.0
    kstreams_commit_interval_s: float = KSTREAMS_DEFAULT_COMMIT_INTERVAL_S
    log_dir: Path = Path(".")
    # With it, onceflow's hop processes are sampled by py-spy over the timed backlog, one flame
    # graph each (<dir>/<service>.svg); the sampling itself costs the hop a little CPU.
    profile_dir: Path | None = None


def transaction_sizes(options: HopOptions) -> dict[str, str]:
    """What each contender puts in one transaction (the report shows it: it moves throughput)."""
    from onceflow_compute.config import ComputeSettings

    loop, compute = LoopSettings(), ComputeSettings()
    per_batch = f"≤ {loop.max_batch_records:,} records or {loop.max_batch_ms} ms"
    quix = f"a checkpoint every {options.quix_commit_interval_s:g} s"
    kstreams = f"a commit every {options.kstreams_commit_interval_s:g} s (commit.interval.ms)"
    return {
        "copier": per_batch,
        "copier-chain": f"{per_batch}, per copier",
        "dedup": per_batch,
        "compute": f"{compute.min_batch_records:,}–{compute.max_batch_records:,} records (adaptive) or {compute.max_batch_ms} ms, per hop",
        "quix-dedup": quix,
        "quix-keyed-count": quix,
        "kstreams-dedup": kstreams,
        "kstreams-keyed-count": kstreams,
    }


@contextmanager
def namespace(tag: str) -> Iterator[CommonSettings]:
    """A fresh topic prefix with every onceflow topic and the peers' two; deleted afterwards,
    with whatever the contender created under it (Quix's changelogs carry the prefix in their
    names, not at their start)."""
    prefix = f"bench{uuid.uuid4().hex[:6]}{tag}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix, specs=[TopicSpec(PEER_INPUT, 4), TopicSpec(PEER_OUTPUT, 4)])
    try:
        yield common
    finally:
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        admin = clients.admin(common)
        leftovers = [name for name in admin.list_topics(timeout=30).topics if prefix in name]
        if leftovers:
            for future in admin.delete_topics(leftovers, request_timeout=30).values():
                future.result()
        delete_prefix(connect(common.redis_url), prefix)


def _metered(pids: Sequence[int], timed: Callable[[Callable[[], None]], BacklogRun]) -> BacklogRun:
    """``timed(on_first)``, with the CPU its contender (``pids`` and their children), the broker
    and Redis spent from its first commit to its end."""
    meter = SpanMeter(pids)
    run = timed(meter.start)
    # A first commit that already held everything leaves no span to divide by.
    return replace(run, cpu=meter.stop(run.records)) if run.records > 0 else run


def time_process(process: ServiceProcess, watch: GroupWatch, total: int) -> BacklogRun:
    """Start ``process`` cold and time ``watch``'s group from its first commit until it has
    committed ``total`` records (startup and group join not timed); stopped after."""
    started = time.monotonic()
    process.start()
    try:
        return _metered([process.pid], lambda on_first: time_backlog(watch, total, process.alive, started=started, on_first=on_first))
    finally:
        watch.close()
        if process.alive():
            process.terminate(60)


def _run_service(
    name: str, common: CommonSettings, options: HopOptions, watch: GroupWatch, topic: str,
    key: Callable[[workload.KeyedRecord], str], finished: Callable[[], bool] = lambda: True, **settings: str,
) -> BacklogRun:
    """Warm up on ``warm_up_records``, pause, write the measured backlog, resume, time it."""
    def backlog(id_prefix: str, count: int) -> None:
        workload.write_backlog(
            common, common.topic(topic),
            ((key(r).encode(), workload.envelope(r)) for r in workload.records(count, options.users, id_prefix)),
        )

    address = f"127.0.0.1:{free_port()}"
    process = pipeline_service(name, address, common.topic_prefix, "bench", options.log_dir, **settings)
    process.env["ONCEFLOW_ADMIN_TOKEN"] = _TOKEN
    backlog("warm", options.warm_up_records)
    process.start()
    try:
        process.wait_healthy(address, 180)
        time_backlog(watch, options.warm_up_records, process.alive, finished)
        with grpc.insecure_channel(address) as channel:
            admin_client.pause(channel, 30, _TOKEN)
            backlog("bench", options.records)
            admin_client.resume(channel, 30, _TOKEN)
        total = options.warm_up_records + options.records
        with _profiled(process, options.profile_dir, name):
            return _metered([process.pid], lambda on_first: time_backlog(
                watch, total, process.alive, finished, after=options.warm_up_records, on_first=on_first,
            ))
    finally:
        watch.close()
        if process.alive():
            process.terminate(60)


@contextmanager
def _profiled(process: ServiceProcess, profile_dir: Path | None, name: str) -> Iterator[None]:
    """py-spy samples ``process`` (its Python threads, idle ones left out) while the block runs."""
    if profile_dir is None:
        yield
        return
    profile_dir.mkdir(parents=True, exist_ok=True)
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    output = profile_dir / f"{name}.svg"
    sampler = subprocess.Popen(
        [py_spy, "record", "--pid", str(process.pid), "--rate", "200", "--nonblocking",
         "--format", "flamegraph", "--output", str(output)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            said, _ = sampler.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            sampler.kill()
            said = b"no output within 60 s"
        if not output.exists():
            # py-spy needs ptrace rights over the process (a container may deny them).
            log.warning("%s: no flame graph from py-spy: %s", name, (said.decode("utf-8", "replace").strip().splitlines() or ["no output"])[0])


def peer_records(options: HopOptions, keyed_by_record_id: bool) -> Iterator[tuple[bytes, bytes]]:
    """The measured backlog as the peers read it: (key, the record as JSON), keyed by user or by
    record id."""
    for record in workload.records(options.records, options.users, "bench"):
        key = record.record_id if keyed_by_record_id else record.user
        yield key.encode(), workload.peer_json(record)


def copier(options: HopOptions) -> BacklogRun:
    with namespace("copy") as common:
        workload.write_backlog(common, common.topic(PEER_INPUT), peer_records(options, keyed_by_record_id=False))
        group = common.topic("copier")
        process = ServiceProcess(
            "copier", "onceflow_tools.bench.copier", {}, options.log_dir, cwd=repo_root(),
            args=[common.topic(PEER_INPUT), common.topic(PEER_OUTPUT), group, group],
        )
        return time_process(process, GroupWatch(common, group, common.topic(PEER_INPUT)), options.records)


# The broker warms by volume and time: on a freshly started one, a copier's three runs one after
# another measured 20,738, 44,883 and 87,888 records/s. So it is warmed until a copier's rate
# stops rising, within WARM_STEADY of the run before, for at most WARM_MAX_RUNS runs.
WARM_STEADY, WARM_MAX_RUNS = 0.10, 8


def warm_broker(options: HopOptions, note: Callable[[str], None] = lambda _text: None) -> list[float]:
    """Untimed copier runs over the measured backlog's size until the copier's rate is steady:
    whatever contender ran first on a cold broker paid for it, and the copier is the baseline of
    every "× copier" ratio. The rates seen, in order."""
    rates: list[float] = []
    if options.warm_up_records <= 0:
        return rates
    while len(rates) < WARM_MAX_RUNS:
        rates.append(copier(replace(options, records=max(options.records, options.warm_up_records))).records_per_s)
        note(f"warming the broker: copier run {len(rates)} at {rates[-1]:,.0f} records/s")
        if len(rates) >= 2 and rates[-1] <= rates[-2] * (1 + WARM_STEADY):
            break
    return rates


def copier_chain(options: HopOptions) -> BacklogRun:
    """Five copiers in a row, each reading what the one before committed (read_committed): the
    most five exactly-once Python hops can move on this machine, whatever they compute. Timed
    from the first copier's first commit until the last has read everything; the record's key
    (its user) partitions every link, as the pipeline's shuffle by key does."""
    with namespace("chain") as common:
        links = [PEER_INPUT, *(f"chain.{n}" for n in range(1, CHAIN_LENGTH)), PEER_OUTPUT]
        ensure_topics(common.kafka_bootstrap, prefix=common.topic_prefix, specs=[TopicSpec(t, 4) for t in links[1:-1]])
        workload.write_backlog(common, common.topic(links[0]), peer_records(options, keyed_by_record_id=False))
        processes, watches = [], []
        for n, (source, target) in enumerate(zip(links, links[1:], strict=False), start=1):
            group = common.topic(f"copier-{n}")
            processes.append(ServiceProcess(
                f"copier-{n}", "onceflow_tools.bench.copier", {}, options.log_dir, cwd=repo_root(),
                args=[common.topic(source), common.topic(target), group, group],
            ))
            watches.append(GroupWatch(common, group, common.topic(source)))

        def delivered() -> bool:
            # Upstream first: once a copier has read its input to the end, and that input is
            # final (the one before it was done), its own output is final too.
            return all(_all_read(common, watch, source)() for watch, source in zip(watches[1:], links[1:-1], strict=True))

        started = time.monotonic()
        for process in processes:
            process.start()
        try:
            # The backlog has no transaction markers, so the first copier's offsets count records.
            return _metered([p.pid for p in processes], lambda on_first: time_backlog(
                watches[0], options.records, lambda: all(p.alive() for p in processes), delivered,
                started=started, on_first=on_first,
            ))
        finally:
            for watch in watches:
                watch.close()
            for process in processes:
                if process.alive():
                    process.terminate(60)


def dedup(options: HopOptions) -> BacklogRun:
    from onceflow_dedup.config import DedupSettings

    with namespace("dedup") as common:
        group = DedupSettings(common=common).group_id_of(topology.DEDUP)
        watch = GroupWatch(common, group, common.topic(Topic.INGEST_RECORDS))
        return _run_service("dedup", common, options, watch, Topic.INGEST_RECORDS, key=lambda r: r.record_id)


def _all_read(common: CommonSettings, watch: GroupWatch, topic: str) -> Callable[[], bool]:
    """Whether ``watch``'s group has read ``topic`` (written in transactions) to its end: a
    committed offset can stop one short of the last stable offset, at the last transaction's
    marker."""

    def check() -> bool:
        committed = watch.offsets()
        return all(committed.get(p, 0) >= lso - 1 for p, (lso, _hw) in end_offsets(common, common.topic(topic)).items() if lso > 0)

    return check


def compute(options: HopOptions) -> BacklogRun:
    """Both of compute's hops (map, then the keyed merge): done when the merge hop has read every
    partial the map hop wrote."""
    from onceflow_compute.config import ComputeSettings

    with namespace("compute") as common:
        settings = ComputeSettings(common=common)
        # The job's partials topic is compute's to create; the watch needs it before compute starts.
        ensure_topics(common.kafka_bootstrap, prefix=common.topic_prefix, specs=job_specs(workload.JOB))
        partials = job_topic(Topic.COMPUTE_PARTIALS, workload.JOB)
        watch = GroupWatch(common, settings.group_id_of(topology.COMPUTE_MAP, workload.JOB), common.topic(Topic.DEDUP_RECORDS))
        merge = GroupWatch(common, settings.group_id_of(topology.COMPUTE_MERGE, workload.JOB), common.topic(partials))
        try:
            return _run_service(
                "compute", common, options, watch, Topic.DEDUP_RECORDS, key=lambda r: r.user,
                finished=_all_read(common, merge, partials), JOB=workload.JOB,
            )
        finally:
            merge.close()


def peer_args(app: str, common: CommonSettings, group: str, commit_interval_s: float, state_dir: Path) -> list[str]:
    """The arguments both peers' apps take (``apps.py`` and the Kafka Streams jar alike)."""
    return [
        app, "--bootstrap", common.kafka_bootstrap, "--input", common.topic(PEER_INPUT),
        "--output", common.topic(PEER_OUTPUT), "--group", group,
        "--commit-interval", f"{commit_interval_s:g}", "--state-dir", str(state_dir), "--quiet",
    ]


def quix_python(root: Path | None = None) -> Path:
    """The Quix Streams peer's own venv (its pins clash with the workspace's), set up on demand."""
    folder = (root or repo_root()) / QUIX_DIR
    subprocess.run([str(folder / "setup.sh")], check=True)
    return folder / ".venv" / "bin" / "python"


def quix(options: HopOptions, app: str) -> BacklogRun:
    """A Quix Streams app (``apps.py``: ``dedup`` or ``keyed_count``), exactly-once, on the same
    records as JSON."""
    with namespace(f"quix{app.replace('_', '')}") as common:
        workload.write_backlog(common, common.topic(PEER_INPUT), peer_records(options, keyed_by_record_id=app == "dedup"))
        group = common.topic(f"quix-{app}")
        state_dir = options.log_dir / f"quix-state-{uuid.uuid4().hex[:6]}"
        process = ServiceProcess(
            f"quix-{app}", "apps", {}, options.log_dir, cwd=repo_root() / QUIX_DIR,
            args=peer_args(app, common, group, options.quix_commit_interval_s, state_dir),
            python=str(quix_python()),
        )
        return time_process(process, GroupWatch(common, group, common.topic(PEER_INPUT)), options.records)


def kstreams_version(pom: Path) -> str:
    """The ``kafka.version`` property of a pom (the peer's and the broker's must agree)."""
    m = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if not m:
        raise ValueError(f"no <kafka.version> in {pom}")
    return m.group(1)


def kstreams_jar(root: Path | None = None) -> Path:
    """The Kafka Streams peer's runnable jar, built by Maven on demand (``setup.sh`` rebuilds only
    when its pom or sources changed)."""
    folder = (root or repo_root()) / KSTREAMS_DIR
    subprocess.run([str(folder / "setup.sh")], check=True)
    return folder / KSTREAMS_JAR


def kstreams_command(java: str, jar: Path, args: Sequence[str]) -> list[str]:
    """``java -jar`` the peer with a small heap: it shares two cores with the broker and the bench."""
    return [java, "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-jar", str(jar), *args]


def kstreams(options: HopOptions, app: str) -> BacklogRun:
    """A Kafka Streams app (``Main.java``: ``dedup`` or ``keyed_count``), exactly_once_v2, on the
    same records as JSON. Its group is its application.id."""
    with namespace(f"ks{app.replace('_', '')}") as common:
        workload.write_backlog(common, common.topic(PEER_INPUT), peer_records(options, keyed_by_record_id=app == "dedup"))
        group = common.topic(f"kstreams-{app}")
        state_dir = options.log_dir / f"kstreams-state-{uuid.uuid4().hex[:6]}"
        args = peer_args(app, common, group, options.kstreams_commit_interval_s, state_dir)
        process = ServiceProcess(
            f"kstreams-{app}", "", {}, options.log_dir, cwd=repo_root() / KSTREAMS_DIR,
            command=kstreams_command(java_executable(), kstreams_jar(), args),
        )
        return time_process(process, GroupWatch(common, group, common.topic(PEER_INPUT)), options.records)


# How each contender of HOPS is run.
RUNNERS: dict[str, Callable[[HopOptions], BacklogRun]] = {
    "copier": copier, "copier-chain": copier_chain, "dedup": dedup, "compute": compute,
    "quix-dedup": lambda o: quix(o, "dedup"), "quix-keyed-count": lambda o: quix(o, "keyed_count"),
    "kstreams-dedup": lambda o: kstreams(o, "dedup"), "kstreams-keyed-count": lambda o: kstreams(o, "keyed_count"),
}


# The peers, whose commit interval a contender may name: ``quix-dedup@5`` is Quix's dedup
# with a checkpoint every 5 s (its own default), ``kstreams-keyed-count@1`` Kafka Streams with
# commit.interval.ms 1000. So one run can hold a peer at its defaults and tuned, side by side.
PEERS = ("quix-dedup", "quix-keyed-count", "kstreams-dedup", "kstreams-keyed-count")


def parse_contender(name: str) -> tuple[str, float | None]:
    """``hop`` or ``peer@seconds`` -> (hop, commit interval or None); ValueError names the problem."""
    hop, at, interval = name.partition("@")
    if hop not in HOPS:
        raise ValueError(f"unknown hop {hop!r}: {', '.join(HOPS)}")
    if not at:
        return hop, None
    if hop not in PEERS:
        raise ValueError(f"{name!r}: only a peer takes @seconds (its commit interval): {', '.join(PEERS)}")
    try:
        seconds = float(interval)
    except ValueError:
        raise ValueError(f"{name!r}: the commit interval after @ must be seconds, got {interval!r}") from None
    if not 0 < seconds <= 60:
        raise ValueError(f"{name!r}: the commit interval must be in (0, 60] s")
    return hop, seconds


def contender_options(name: str, options: HopOptions) -> HopOptions:
    """The options ``name`` runs with: its own commit interval, if it names one."""
    hop, interval = parse_contender(name)
    if interval is None:
        return options
    if hop.startswith("quix"):
        return replace(options, quix_commit_interval_s=interval)
    return replace(options, kstreams_commit_interval_s=interval)


def describe_transaction(name: str, options: HopOptions) -> str:
    """What one transaction of contender ``name`` holds."""
    hop, _interval = parse_contender(name)
    return transaction_sizes(contender_options(name, options))[hop]


def run_hop(name: str, options: HopOptions) -> BacklogRun:
    hop, _interval = parse_contender(name)
    return RUNNERS[hop](contender_options(name, options))
