"""Topic specs from ``infra/topics.toml``, and their idempotent creation via the AdminClient:
here, in the core, because compute creates its job's own topics (``job_specs``) at start."""

from __future__ import annotations

import dataclasses
import logging
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from onceflow.config import repo_root
from onceflow.kafka.clients import plain_config
from onceflow.topology import Topic, is_topic_slot, job_topic

log = logging.getLogger(__name__)

# Changelogs are restored by reading them from the start, and compaction never touches the
# active segment: rolling every minute and cleaning at 10% dirty keeps a restore close to one
# record per key instead of the whole history.
RETENTION_MS = "retention.ms"
TIMESTAMP_TYPE = "message.timestamp.type"
CHANGELOG_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "min.cleanable.dirty.ratio": "0.1",
}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False
    retention_ms: int | None = None
    partitions_of: str | None = None
    key: str = ""
    doc: str = ""
    # None: decided by the cluster (``replication_for``): 3 replicas where there are 3 brokers.
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    # "LogAppendTime": the broker stamps each record as it appends it, so readers get one clock
    # that no writer's host controls (ingest.records: the dedup gate's horizon). None: CreateTime.
    timestamp_type: str | None = None

    @property
    def per_job(self) -> bool:
        """A template with a `{job}` slot: one topic per compute job (``job_specs``)."""
        return "{job}" in self.name

    def config(self) -> dict[str, str]:
        if self.compacted:
            config = dict(CHANGELOG_CONFIG)
        else:
            config = {"retention.ms": str(self.retention_ms)} if self.retention_ms is not None else {}
        if self.timestamp_type is not None:
            config[TIMESTAMP_TYPE] = self.timestamp_type
        return config

    def replication_for(self, brokers: int) -> tuple[int, int]:
        """(replicas, min.insync.replicas) on a cluster of ``brokers``: as declared, else up to
        3 replicas with 2 in sync (a committed write survives one broker's loss), and on one
        broker the only possible 1 and 1."""
        replicas = self.replication_factor or min(3, brokers)
        if replicas > brokers:
            raise TopicReplicationError(
                f"{self.name} declares {replicas} replicas; the cluster has {brokers} broker(s)"
            )
        in_sync = self.min_insync_replicas or max(1, min(2, replicas - 1))
        if not 1 <= in_sync <= replicas:
            raise TopicReplicationError(f"{self.name}: min_insync_replicas {in_sync} with {replicas} replicas")
        return replicas, in_sync


class TopicReplicationError(ValueError):
    """A topic cannot have, or does not have, the replication it declares."""


def topics_file() -> Path:
    return repo_root() / "infra" / "topics.toml"


def load_specs(path: Path | None = None) -> list[TopicSpec]:
    """Parse topics.toml: ``[defaults]`` fill the gaps, ``partitions_of`` copies the partition
    count of the named topic (a changelog must match its input partition for partition)."""
    data = tomllib.loads((path or topics_file()).read_text())
    defaults = data.get("defaults", {})
    raw = data.get("topic", [])
    by_name = {t["name"]: t for t in raw}
    if len(by_name) != len(raw):
        raise ValueError("duplicate topic name in topics.toml")

    def partitions(name: str, seen: tuple[str, ...] = ()) -> int:
        t = by_name[name]
        src = t.get("partitions_of")
        if src is None:
            return int(t.get("partitions", defaults.get("partitions", 1)))
        if src not in by_name:
            raise ValueError(f"{name}: partitions_of names unknown topic {src!r}")
        if src in seen:
            raise ValueError(f"{name}: partitions_of cycle {' -> '.join((*seen, src))}")
        return partitions(src, (*seen, name))

    specs = []
    for t in raw:
        compacted = bool(t.get("compacted", False))
        specs.append(
            TopicSpec(
                name=t["name"],
                partitions=partitions(t["name"]),
                compacted=compacted,
                retention_ms=None if compacted else t.get("retention_ms", defaults.get("retention_ms")),
                partitions_of=t.get("partitions_of"),
                key=t.get("key", ""),
                doc=t.get("doc", ""),
                replication_factor=t.get("replication_factor", defaults.get("replication_factor")),
                min_insync_replicas=t.get("min_insync_replicas", defaults.get("min_insync_replicas")),
                timestamp_type=t.get("timestamp_type"),
            )
        )
    return specs


def is_declared(name: str, specs: list[TopicSpec]) -> bool:
    """A shared topic's name, or a per-job template's for some job."""
    for spec in specs:
        stem, _slot, rest = spec.name.partition("{job}")
        if name == spec.name or (
            spec.per_job and name.startswith(stem) and name.endswith(rest)
            and is_topic_slot(name[len(stem) : len(name) - len(rest)])
        ):
            return True
    return False


def shared_specs(specs: list[TopicSpec] | None = None) -> list[TopicSpec]:
    """The topics every job shares: what `onceflow infra topics` creates."""
    return [s for s in (load_specs() if specs is None else specs) if not s.per_job]


def job_specs(job: str, specs: list[TopicSpec] | None = None, partitions: int = 0) -> list[TopicSpec]:
    """The per-job templates, named for ``job`` (compute.partials.<job>, ...); ``partitions``
    (a rescaled version's) replaces the declared count of every one of them, since a per-job
    changelog follows the job's shuffle partition for partition."""
    return [
        dataclasses.replace(
            s,
            name=job_topic(Topic(s.name), job),
            partitions_of=None if s.partitions_of is None else job_topic(Topic(s.partitions_of), job),
            partitions=partitions or s.partitions,
        )
        for s in (load_specs() if specs is None else specs)
        if s.per_job
    ]


def admin_client(bootstrap: str) -> AdminClient:
    # log_level 3: a dead broker named first in the bootstrap list is expected, not worth lines.
    return AdminClient(plain_config(bootstrap, log_level=3))


def ensure_topics(
    bootstrap: str, prefix: str = "", specs: list[TopicSpec] | None = None, timeout: float = 30.0,
    history_retention_ms: int | None = None,
) -> list[str]:
    """Create the topics (``prefix`` + name) that do not exist yet (by default the shared ones);
    returns the names created.

    Replicated as each spec declares, by default as the cluster allows (``replication_for``);
    a topic that exists with fewer replicas than that is an error, not silently accepted. Safe
    to run concurrently: TOPIC_ALREADY_EXISTS counts as success. Returns once the metadata
    lists every topic with a leader for every partition, so producers and ListOffsets can use
    them at once.
    """
    specs = shared_specs() if specs is None else specs
    if history_retention_ms is not None:
        # ONCEFLOW_HISTORY_RETENTION_MS: how far back a job version can rebuild; set on an
        # existing dedup.records too (the operator's commands pass it; the tests' and the
        # demo's calls leave an existing topic's retention as it is).
        specs = [dataclasses.replace(s, retention_ms=history_retention_ms) if s.name == Topic.DEDUP_RECORDS else s for s in specs]
    admin = admin_client(bootstrap)
    metadata = admin.list_topics(timeout=timeout)
    brokers = len(metadata.brokers)
    short = [
        f"{prefix + s.name} has {len(next(iter(metadata.topics[prefix + s.name].partitions.values())).replicas)} "
        f"replica(s), declared {s.replication_for(brokers)[0]}"
        for s in specs
        if prefix + s.name in metadata.topics
        and metadata.topics[prefix + s.name].partitions
        and min(len(p.replicas) for p in metadata.topics[prefix + s.name].partitions.values()) < s.replication_for(brokers)[0]
    ]
    if short:
        raise TopicReplicationError(
            "topics exist with fewer replicas than declared (recreate them, or reassign partitions with "
            "kafka-reassign-partitions): " + "; ".join(short)
        )
    _align_configs(admin, [s for s in specs if prefix + s.name in metadata.topics], prefix, timeout, history_retention_ms is not None)
    new = []
    for s in specs:
        if prefix + s.name in metadata.topics:
            continue
        replicas, in_sync = s.replication_for(brokers)
        config = {**s.config(), "min.insync.replicas": str(in_sync)}
        new.append(NewTopic(prefix + s.name, num_partitions=s.partitions, replication_factor=replicas, config=config))
    created: list[str] = []
    if new:
        for name, fut in admin.create_topics(new, request_timeout=timeout).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    wanted = {prefix + s.name for s in specs}
    deadline = time.monotonic() + timeout
    while not _all_led(admin.list_topics(timeout=timeout).topics, wanted):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics without leaders after {timeout:.0f}s: {sorted(wanted)}")
        time.sleep(0.1)
    return created


def _align_configs(admin: AdminClient, existing: list[TopicSpec], prefix: str, timeout: float, retention: bool) -> None:
    """Topics made before their spec declared a timestamp type (ingest.records before
    LogAppendTime) get it now: it changes only the stamps of records appended from here on, and
    the dedup gate takes either kind, so this is safe on a running pipeline. With ``retention``,
    dedup.records gets the history retention asked for (ONCEFLOW_HISTORY_RETENTION_MS)."""
    declared: dict[str, dict[str, str]] = {}
    for s in existing:
        wanted = {TIMESTAMP_TYPE: s.timestamp_type} if s.timestamp_type is not None else {}
        if retention and s.name == Topic.DEDUP_RECORDS and s.retention_ms is not None:
            wanted[RETENTION_MS] = str(s.retention_ms)  # the history a version can rebuild from
        if wanted:
            declared[prefix + s.name] = wanted
    if not declared:
        return
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in declared]
    for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
        found = future.result()
        for config, wanted_value in declared[resource.name].items():
            current = found.get(config)
            if current is not None and current.value == wanted_value:
                continue
            change = ConfigResource(
                ResourceType.TOPIC, resource.name,
                incremental_configs=[ConfigEntry(config, wanted_value, incremental_operation=AlterConfigOpType.SET)],
            )
            admin.incremental_alter_configs([change], request_timeout=timeout)[change].result()
            log.info("%s: %s set to %s (was %s)", resource.name, config, wanted_value, current.value if current else "unset")


def _all_led(topics: dict, wanted: set[str]) -> bool:  # type: ignore[type-arg]
    return all(
        name in topics and topics[name].error is None and topics[name].partitions
        and all(p.leader >= 0 for p in topics[name].partitions.values())
        for name in wanted
    )


