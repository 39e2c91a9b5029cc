"""A job's versions, operated: where each stands, its promotion and its retirement
(docs/jobs.md#versions-and-bluegreen, docs/decisions/0024). The sink's JobAdmin calls these,
and so does `onceflow job` (which adds deploying, since that loads the job's code, and the
workers it started on its own machine).

Every change goes through the registry (``RegistryWriter``: one command at a time); the sink
follows it. A promotion switches the alias readers follow, and only once the version has caught
up: its map hop as far as the live one's, its merge hop to the end of its partials, and the sink
to the end of ``compute.results``. Anything less would serve a partial table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException

from onceflow import readers, streams
from onceflow.config import CommonSettings
from onceflow.kafka import clients, positions
from onceflow.kafka.inspect import partitions_of
from onceflow.kafka.positions import Behind
from onceflow.kafka.registry import RegistryWriter, read_registry
from onceflow.topology import COMPUTE_MAP, COMPUTE_MERGE, Topic, job_topic, versioned
from onceflow.versions import JobRecord, Version, VersionState

from onceflow.state.result_store import ResultStore


class JobCommandError(ValueError):
    """A command refused: nothing changed. The message says why and what to do."""


class NoSuchJob(JobCommandError):
    """The job, or the version, is not in the registry."""


@dataclass(frozen=True)
class VersionStatus:
    job: str
    version: Version
    live: bool
    map_behind: Behind
    merge_behind: Behind | None
    records_per_s: float | None  # its map hop's, over the sample
    group_members: int  # workers in its map group now

    @property
    def name(self) -> str:
        return versioned(self.job, self.version.version)

    @property
    def catch_up_s(self) -> float | None:
        if not self.map_behind.records:
            return 0.0
        if not self.records_per_s:
            return None
        return self.map_behind.records / self.records_per_s


def record_of(common: CommonSettings, job: str) -> JobRecord:
    record = read_registry(common).get(job)
    if record is None:
        raise NoSuchJob(f"no job {job!r} in the registry: deploy it first (`onceflow job deploy MODULE`)")
    return record


def version_of(record: JobRecord, version: int) -> Version:
    found = record.versions.get(version)
    if found is None:
        known = ", ".join(f"{v} ({record.versions[v].state.value})" for v in sorted(record.versions)) or "none"
        raise NoSuchJob(f"{record.job} has no version {version} (versions: {known})")
    return found


def map_group(common: CommonSettings, job: str, version: int) -> str:
    return COMPUTE_MAP.group_id(common.topic_prefix, versioned(job, version))


def status(common: CommonSettings, job: str, sample_s: float = 1.0) -> list[VersionStatus]:
    """Every version that runs: how far its hops are behind the ends of their inputs, and its
    map hop's rate over ``sample_s``."""
    record = record_of(common, job)
    running = [v for v in sorted(record.versions.values(), key=lambda v: v.version) if v.running]
    inputs = {v.version: common.topic(streams.topic_of(v.stream)) for v in running}
    ends = {topic: positions.stable_ends(common, topic) for topic in set(inputs.values())}
    before = {v.version: positions.group_positions(common, map_group(common, job, v.version), inputs[v.version]) for v in running}
    started = time.monotonic()
    if sample_s > 0:
        time.sleep(sample_s)
    out = []
    for v in running:
        dedup = inputs[v.version]
        now = positions.group_positions(common, map_group(common, job, v.version), dedup)
        elapsed = time.monotonic() - started
        moved = sum(now.values()) - sum(before[v.version].values())
        out.append(
            VersionStatus(
                job=job,
                version=v,
                live=v.version == record.live,
                map_behind=positions.behind(common, dedup, now, ends[dedup]),
                merge_behind=_merge_behind(common, versioned(job, v.version)) if v.kind != "transform" else None,
                records_per_s=moved / elapsed if sample_s > 0 else None,
                group_members=_members(common, map_group(common, job, v.version)),
            )
        )
    return out


def _members(common: CommonSettings, group: str) -> int:
    admin = clients.admin(common)  # held until the answer: a freed client never completes its futures
    future = admin.describe_consumer_groups([group], request_timeout=10)[group]
    try:
        return len(future.result(timeout=15).members)
    except KafkaException:
        return 0  # no such group yet


def _merge_behind(common: CommonSettings, name: str) -> Behind | None:
    partials = common.topic(job_topic(Topic.COMPUTE_PARTIALS, name))
    group = COMPUTE_MERGE.group_id(common.topic_prefix, name)
    try:
        ends = positions.stable_ends(common, partials)
        at = positions.group_positions(common, group, partials)
    except KafkaException:
        # Not created yet (no worker has started), or just created and still without a leader
        # (NOT_LEADER_FOR_PARTITION, seen by a status asked as the first worker made it): unknown.
        return None
    return positions.behind(common, partials, at, ends)


def lagging(common: CommonSettings, tables: ResultStore, record: JobRecord, version: Version) -> list[str]:
    """What the version still lacks before readers may see it ([] = caught up): its map hop
    behind the live version's (the end of its stream when none is live, or the live one reads
    another stream), its merge hop
    behind its partials, the sink behind compute.results. Each is measured after the one
    before it, so what the earlier hop wrote is counted."""
    name = versioned(record.job, version.version)
    dedup = common.topic(streams.topic_of(version.stream))
    live = record.versions.get(record.live)
    if live is not None and streams.canonical(live.stream) == streams.canonical(version.stream):
        target = positions.group_positions(common, map_group(common, record.job, record.live), dedup)
        against = f"the live {record.live_name}"
    else:
        target, against = positions.stable_ends(common, dedup), f"the end of {dedup}"
    mapped = positions.behind(common, dedup, positions.group_positions(common, map_group(common, record.job, version.version), dedup), target)
    if mapped.records:
        return [f"its map hop is {mapped} behind {against}"]
    if version.kind != "transform":
        merged = _merge_behind(common, name)
        if merged is None or merged.records:
            return [f"its merge hop is {merged or 'not started: its partials topic does not exist'} behind"]
    applied = sink_behind(common, tables)
    return [f"the sink is {applied} behind"] if applied.records else []


def sink_behind(common: CommonSettings, tables: ResultStore) -> Behind:
    """How far the sink is behind the end of compute.results (its offsets live in Redis)."""
    results = common.topic(Topic.COMPUTE_RESULTS)
    applied = {p: tables.applied_offset(p) + 1 for p in partitions_of(common, results)}
    return positions.behind(common, results, applied, positions.stable_ends(common, results))


def promote(
    common: CommonSettings, tables: ResultStore, job: str, version: int, force: bool = False, wait_s: float = 0.0,
    on_wait: Callable[[list[str]], None] | None = None, alias_timeout_s: float = 30.0,
) -> JobRecord:
    """Switch the job's readers to ``version``: refused while it lags (``wait_s``: wait up to
    that long for it to catch up), unless ``force``. Returns the record once the sink serves it."""
    deadline = time.monotonic() + wait_s
    while True:
        record = record_of(common, job)
        target = version_of(record, version)
        if target.state is VersionState.RETIRED:
            raise JobCommandError(f"{versioned(job, version)} is retired: deploy a new version")
        if record.live == version:
            raise JobCommandError(f"{versioned(job, version)} is already live")
        missing = [] if force else lagging(common, tables, record, target)
        if not missing:
            break
        if time.monotonic() >= deadline:
            raise JobCommandError(
                f"{versioned(job, version)} still lags: {'; '.join(missing)}. Nothing changed; wait for it "
                f"(`onceflow job status {job}`), give --wait, or --force to serve a partial table"
            )
        if on_wait is not None:
            on_wait(missing)
        time.sleep(1.0)
    with RegistryWriter(common) as registry:
        current = registry.records.get(job) or record
        if current != record:
            raise JobCommandError(f"{job}'s versions changed while checking: nothing changed; run the promotion again")
        promoted = current.promoted(version)
        registry.write(promoted)
    deadline = time.monotonic() + alias_timeout_s
    while tables.resolve(job) != promoted.live_name:
        if time.monotonic() >= deadline:
            raise JobCommandError(
                f"the registry makes {promoted.live_name} live, but the sink has not switched {job}'s readers to it "
                f"within {alias_timeout_s:.0f} s: is the sink running? It switches them when it next reads the registry"
            )
        time.sleep(0.2)
    return promoted


def check_retirable(record: JobRecord, version: int) -> None:
    """Refuse a version that cannot be retired (unknown, live, retired already)."""
    target = version_of(record, version)
    name = versioned(record.job, version)
    if record.live == version:
        raise JobCommandError(f"{name} is live: promote another version first; readers would have nothing to read")
    if target.state is VersionState.RETIRED:
        raise JobCommandError(f"{name} is already retired")


def retire(common: CommonSettings, job: str, version: int) -> list[str]:
    """Retire a version that is not live and whose workers have stopped: delete its topics and
    groups; the sink deletes its table when it reads the registry. Returns what was deleted."""
    record = record_of(common, job)
    check_retirable(record, version)
    name = versioned(job, version)
    groups = [hop.group_id(common.topic_prefix, name) for hop in (COMPUTE_MAP, COMPUTE_MERGE)]
    busy = sum(_members(common, group) for group in groups)
    if busy:
        raise JobCommandError(
            f"{name} still has {busy} worker(s) in its groups: stop them first (a worker left running would write "
            f"into what retiring deletes)"
        )
    with RegistryWriter(common) as registry:
        current = registry.records.get(job) or record
        if current.live == version:
            raise JobCommandError(f"{name} became live meanwhile: nothing changed")
        registry.write(current.retired(version))
    deleted = []
    admin = clients.admin(common)
    topics = [common.topic(job_topic(t, name)) for t in (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_CHANGELOG)]
    existing = set(admin.list_topics(timeout=10).topics)
    gone = [t for t in topics if t in existing]
    for topic, future in (admin.delete_topics(gone, operation_timeout=30).items() if gone else []):
        future.result()
        deleted.append(f"topic {topic}")
    for group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
        try:
            future.result()
            deleted.append(f"group {group}")
        except KafkaException:
            pass  # never created (a transform has no merge group)
    target = record.versions[version]
    if readers.forget(common, target.stream, name):  # its workers were killed, not stopped cleanly
        deleted.append(f"reader {name} of stream {streams.display(target.stream)}")
    deleted.append(f"table {name} (by the sink, as it reads the registry)")
    return deleted
