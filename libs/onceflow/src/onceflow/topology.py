"""The pipeline's shape, in one place: every topic, and per hop what it reads, writes and records.

`infra/topics.toml` says how each topic is created (partitions, compaction, replication); this
module says who uses it. `libs/onceflow/tests/test_topology.py` checks that the two declare the
same topics, that every changelog has its input's partitions, that every hop's input is written
by a hop before it, and that docs/topics.md's table lists them all. Services, the verifier and
the benchmarks name topics, consumer groups and transactional ids only through here.

It also says where each service listens by default (`SERVICES`): the services' settings take
their port defaults from here, the CLI its default addresses, and `tests/test_deploy_config.py`
checks infra/services.toml, the Tiltfile, docker-compose.yml and the Dockerfile against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The names live in the client package, which every layer can import; re-exported here.
from onceflow_client.topics import Topic as Topic


# A job's name goes into its topics' names: Kafka allows [A-Za-z0-9._-], up to 249 characters
# with the prefix. No dot, so that no two jobs' topics collide in Kafka's metric names ('.' and
# '_' are one there, and the broker refuses a topic that collides).
JOB_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")


def check_job_name(job: str) -> str:
    if not JOB_NAME.fullmatch(job):
        raise ValueError(f"job name {job!r}: 1 to 100 of A-Z, a-z, 0-9, '_' and '-' (it names the job's topics)")
    return job


# A job's version runs under its own name, `orders@2` (onceflow.versions, docs/decisions/0024).
SEPARATOR = "@"
# In a topic name '@' cannot appear; '.' can, and no plain job name holds one (topology.JOB_NAME).
TOPIC_SEPARATOR = ".v"
MAX_VERSION = 999_999


def versioned(job: str, version: int) -> str:
    """The name a version runs under: ``orders@2``; version 0 is the plain, unversioned name."""
    return f"{job}{SEPARATOR}{version}" if version else job


def split(name: str) -> tuple[str, int]:
    """``orders@2`` -> (``orders``, 2); ``orders`` -> (``orders``, 0). Raises ValueError naming
    what is wrong with a name that is neither."""
    job, sep, version = name.partition(SEPARATOR)
    check_job_name(job)
    if not sep:
        return job, 0
    return job, parse_version(version)


def parse_version(text: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,5}", text):
        raise ValueError(f"version {text!r}: a whole number from 1 to {MAX_VERSION}")
    return int(text)


def topic_slot(name: str) -> str:
    """What fills a per-job topic's ``{job}`` slot: ``orders`` or ``orders.v2``."""
    job, version = split(name)
    return f"{job}{TOPIC_SEPARATOR}{version}" if version else job


def is_topic_slot(text: str) -> bool:
    """Whether ``text`` is what :func:`topic_slot` gives for some job or version."""
    job, sep, version = text.partition(TOPIC_SEPARATOR)
    return bool(JOB_NAME.fullmatch(job)) and (not sep or bool(re.fullmatch(r"[1-9][0-9]{0,5}", version)))


def job_topic(topic: Topic, job: str) -> str:
    """The name of the topic ``job`` uses (before the prefix): a per-job one's for the job
    (`compute.partials.wordcount`, a version's `compute.partials.wordcount.v2`: each job has its
    own shuffle and state, as a Kafka Streams application has its internal topics), a shared
    one's as it is."""
    return topic.value.format(job=topic_slot(job)) if topic.per_job else topic.value


@dataclass(frozen=True)
class Hop:
    """One transactional step. `name` is the stem of its consumer group and transactional ids;
    a compute hop's has a `{job}` slot, since each job's hops are groups of their own."""

    service: str
    name: str
    input: Topic | None  # None: a spout (ingest's gRPC calls, the Kafka source's user topic)
    outputs: tuple[Topic, ...]
    dlq: Topic
    changelog: Topic | None = None  # state restored from Kafka; partition n = input partition n
    offsets_in_kafka: bool = True  # False: the sink keeps its offsets in Redis, fenced
    external_input: str = "gRPC Ingest"  # what a spout reads, for describe()

    def group_id(self, prefix: str, job: str = "") -> str:
        return f"{prefix}{self.name.format(job=job)}"

    def transactional_id(self, prefix: str, instance: str, job: str = "") -> str:
        return f"{self.group_id(prefix, job)}-{instance}"


INGEST = Hop("ingest", "onceflow-ingest", None, (Topic.INGEST_RECORDS, Topic.ACKER_ACKS), Topic.INGEST_DLQ)
INGEST_REPLAYER = Hop(
    "ingest", "onceflow-ingest-replayer", Topic.ACKER_EVENTS, (Topic.INGEST_RECORDS, Topic.ACKER_ACKS), Topic.INGEST_DLQ
)
ACKER = Hop("acker", "onceflow-acker", Topic.ACKER_ACKS, (Topic.ACKER_EVENTS,), Topic.ACKER_DLQ, Topic.ACKER_CHANGELOG)
DEDUP = Hop(
    "dedup", "onceflow-dedup", Topic.INGEST_RECORDS, (Topic.DEDUP_RECORDS, Topic.ACKER_ACKS), Topic.DEDUP_DLQ,
    Topic.DEDUP_CHANGELOG,
)
# The Kafka source: a spout over a user's topic (its `{job}` slot: that topic), writing what ingest
# writes; a topic on another cluster also writes its positions (source.offsets) in the transaction.
SOURCE = Hop(
    "source", "onceflow-source-{job}", None, (Topic.INGEST_RECORDS, Topic.ACKER_ACKS, Topic.SOURCE_OFFSETS),
    Topic.SOURCE_DLQ,
    external_input="a user's Kafka topic",
)
# A transform job's map hop writes result rows itself; an aggregating job's writes partials.
COMPUTE_MAP = Hop(
    "compute", "onceflow-compute-{job}-map", Topic.DEDUP_RECORDS,
    (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_RESULTS, Topic.COMPUTE_LATE, Topic.ACKER_ACKS), Topic.COMPUTE_DLQ,
    Topic.COMPUTE_EVENTTIME,
)
COMPUTE_MERGE = Hop(
    "compute", "onceflow-compute-{job}-merge", Topic.COMPUTE_PARTIALS, (Topic.COMPUTE_RESULTS, Topic.ACKER_ACKS),
    Topic.COMPUTE_DLQ, Topic.COMPUTE_CHANGELOG,
)
# The sink's main output is Redis; it acks the anchors of the changes it applied (trees end
# there: docs/decisions/0016).
SINK = Hop("sink", "onceflow-sink", Topic.COMPUTE_RESULTS, (Topic.ACKER_ACKS,), Topic.SINK_DLQ, offsets_in_kafka=False)

# In the order a record meets them (the replayer and the acker close the loop back to ingest).
HOPS: tuple[Hop, ...] = (INGEST, SOURCE, DEDUP, COMPUTE_MAP, COMPUTE_MERGE, SINK, ACKER, INGEST_REPLAYER)
DLQS: tuple[Topic, ...] = tuple(dict.fromkeys(hop.dlq for hop in HOPS))
# Topics no hop reads or writes: the control plane's (`onceflow job` writes the registry; the
# sink follows it to point each job's plain name at its live version; compute's workers say which
# streams they read, and the gate follows that to give each reader its own ack edge).
CONTROL: tuple[Topic, ...] = (Topic.JOBS_REGISTRY, Topic.DLQ_REDRIVEN, Topic.STREAM_READERS)


def hops_of(service: str) -> tuple[Hop, ...]:
    return tuple(hop for hop in HOPS if hop.service == service)


def describe() -> str:
    """One line per hop: what `onceflow topology` prints and docs/architecture.md shows."""
    lines = []
    for hop in HOPS:
        source = hop.input or hop.external_input
        targets = ", ".join(["Redis tables"] * (not hop.offsets_in_kafka) + [str(t) for t in hop.outputs])
        state = f"; state {hop.changelog}" if hop.changelog else ""
        lines.append(f"{hop.name}: {source} -> {targets}{state}; dead letters {hop.dlq}")
    return "\n".join(lines)


LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Service:
    """One deployable service and where it listens unless configured otherwise."""

    name: str
    grpc_port: int  # Admin, health, reflection and the service's own APIs
    metrics_port: int  # Prometheus /metrics
    apis: tuple[str, ...]  # its own gRPC services, besides Admin, health and reflection

    def address(self, host: str = LOCALHOST) -> str:
        return f"{host}:{self.grpc_port}"


INGEST_SERVICE = Service("ingest", 15051, 9101, ("Ingest", "IngestStream"))
ACKER_SERVICE = Service("acker", 15052, 9102, ("AckerAdmin",))
DEDUP_SERVICE = Service("dedup", 15053, 9103, ("DedupAdmin",))
COMPUTE_SERVICE = Service("compute", 15054, 9104, ("ComputeAdmin",))
SINK_SERVICE = Service("sink", 15055, 9105, ("Query",))
SOURCE_SERVICE = Service("source", 15056, 9106, ())  # optional: copies a user's Kafka topic in
SERVICES: tuple[Service, ...] = (
    INGEST_SERVICE, ACKER_SERVICE, DEDUP_SERVICE, COMPUTE_SERVICE, SINK_SERVICE, SOURCE_SERVICE,
)


def service(name: str) -> Service:
    for candidate in SERVICES:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no service named {name!r} (known: {', '.join(s.name for s in SERVICES)})")
