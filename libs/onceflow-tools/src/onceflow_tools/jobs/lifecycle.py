"""`onceflow job deploy | status | promote | retire | reprocess`, as functions the CLI (and the
tests) call. Every change to a job's versions goes through the registry (``RegistryWriter``:
one command at a time); the sink follows it (docs/decisions/0024).

A version is a job of its own name (``orders@2``): its map group reads ``dedup.records`` from
where the deploy put it, exactly once like any job, while the live version keeps serving. A
promotion switches the alias the readers follow, and only once the shadow has caught up: its map
hop as far as the live one's, its merge hop to the end of its partials, and the sink to the end
of ``compute.results``. Anything less would serve a partial table.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from onceflow.codec import now_ms
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import partitions_of
from onceflow.kafka.registry import RegistryWriter, read_registry
from onceflow.redis_client import connect
from onceflow.topology import COMPUTE_MAP, COMPUTE_MERGE, Topic, job_topic, parse_version, versioned
from onceflow.versions import JobRecord, Version, VersionState

from onceflow_tools.jobs import positions, workers
from onceflow_tools.jobs.positions import Behind

log = logging.getLogger(__name__)

EARLIEST = "earliest"


class JobCommandError(ValueError):
    """A command refused: nothing changed. The message says why and what to do."""


@dataclass(frozen=True)
class Deployed:
    job: str
    version: Version
    workers: list[workers.Worker]
    env: dict[str, str]  # the worker's settings, for a deployment run elsewhere
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return versioned(self.job, self.version.version)


def parse_start(text: str) -> str:
    """``earliest``, milliseconds since the epoch, or an ISO-8601 time (UTC unless it says)."""
    if text == EARLIEST:
        return text
    if text.isdigit():
        return text
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise JobCommandError(f"--from {text!r}: 'earliest', milliseconds since the epoch, or an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return str(int(moment.timestamp() * 1000))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def load_module(module: str) -> object:
    """The job a module defines; a module that fails to import is an error naming both."""
    from onceflow_compute import jobs  # the compute package (and pyspark) only when a command needs it

    try:
        return jobs.load_job(module)
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything on import
        raise JobCommandError(f"job module {module!r} does not load: {type(exc).__name__}: {exc}") from None


def deploy(
    common: CommonSettings,
    module: str,
    version: int | None = None,
    start_from: str = EARLIEST,
    partitions: int = 0,
    worker_count: int = 1,
    start: bool = True,
    note: str = "",
) -> Deployed:
    """Register a new version as a shadow, put its map group at ``start_from`` and (``start``)
    run its workers here. Refused, with nothing changed: a version that exists, another version
    still a shadow, a start older than the history held."""
    from onceflow_compute.api import Transform
    from onceflow_compute.fingerprint import describe, fingerprint

    job = load_module(module)
    assert not isinstance(job, str)
    name: str = job.name  # type: ignore[attr-defined]
    start_from = parse_start(start_from)
    notes = history_notes(common, start_from)
    with RegistryWriter(common) as registry:
        record = registry.records.get(name) or JobRecord(name)
        shadows = [v for v in record.versions.values() if v.state is VersionState.SHADOW]
        if shadows:
            raise JobCommandError(
                f"{versioned(name, shadows[0].version)} is still a shadow (deployed, not promoted): "
                f"promote it or retire it before deploying another version"
            )
        number = version or record.next_version()
        if number in record.versions:
            existing = record.versions[number]
            raise JobCommandError(
                f"{versioned(name, number)} exists ({existing.state.value}, module {existing.module}); "
                f"versions are never reused: deploy version {record.next_version()}"
            )
        renamed = dataclasses.replace(job, name=versioned(name, number))  # type: ignore[type-var]
        notes += state_notes(common, record, job)
        deployed = Version(
            version=number,
            module=module,
            state=VersionState.SHADOW,
            start_from=start_from,
            partitions=partitions,
            deployed_ms=now_ms(),
            fingerprint=fingerprint(describe(renamed)),
            note=note,
            kind=job.kind,  # type: ignore[attr-defined]
        )
        registry.write(record.with_version(deployed))
    if start_from != EARLIEST:
        _position_map_group(common, versioned(name, number), int(start_from))
    env = workers.worker_env(module, number, partitions, f"{name}-v{number}-0", 0)
    started = workers.start(name, number, module, partitions, worker_count) if start else []
    if isinstance(job, Transform):
        notes.append("a transform keeps no state: its rows are written as its map hop reads them")
    return Deployed(name, deployed, started, env, notes)


def history_notes(common: CommonSettings, start_from: str) -> list[str]:
    """Refuse a start older than what ``dedup.records`` still holds; say where history begins."""
    topic = common.topic(Topic.DEDUP_RECORDS)
    oldest = positions.earliest_retained_ms(common, topic)
    lows = positions.low_watermarks(common, topic)
    if start_from != EARLIEST:
        wanted = int(start_from)
        if oldest is not None and any(lows.values()) and wanted < oldest:
            raise JobCommandError(
                f"--from {_iso(wanted)}: {topic} no longer holds records that old (retention deleted them); "
                f"the oldest it holds is from {_iso(oldest)}. Deploy --from earliest to start there, or raise "
                f"ONCEFLOW_HISTORY_RETENTION_MS for the next time (docs/jobs.md#how-far-back)"
            )
        return [f"reads {topic} from {_iso(wanted)}"]
    if any(lows.values()):
        since = f" (its oldest record is from {_iso(oldest)})" if oldest is not None else ""
        return [f"reads {topic} from its earliest retained record{since}: older records were deleted by retention"]
    return [f"reads {topic} from its first record: the whole history"]


def state_notes(common: CommonSettings, record: JobRecord, job: object) -> list[str]:
    """What the live version's state says about the deployed code: the same check a worker runs
    at start (docs/decisions/0023), as information: a new version builds a state of its own."""
    from onceflow_compute import lifecycle
    from onceflow_compute.api import Transform

    if isinstance(job, Transform):
        return []
    live = dataclasses.replace(job, name=record.live_name)  # type: ignore[type-var]
    try:
        check = lifecycle.check_state(common, live)  # type: ignore[arg-type]
    except KafkaException:
        return []  # no live state to compare with (its topics do not exist)
    if not any(check.stored.values()):
        return []
    if check.refused:
        return [f"the live {record.live_name} could not take this code's state ({'; '.join(check.verdict.differences)}): this version builds its own"]
    return [f"the live {record.live_name}'s state fits this code ({check.verdict.decision.value}): a restart of {record.live_name} on it would carry its state over without reprocessing"]


def _position_map_group(common: CommonSettings, name: str, at_ms: int) -> None:
    """The new version's map group starts at ``at_ms`` (it has never run: nothing committed)."""
    topic = common.topic(Topic.DEDUP_RECORDS)
    offsets = positions.offsets_for_time(common, topic, at_ms)
    group = COMPUTE_MAP.group_id(common.topic_prefix, name)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])
    for future in clients.admin(common).alter_consumer_group_offsets([request]).values():
        future.result(timeout=30)


@dataclass(frozen=True)
class VersionStatus:
    job: str
    version: Version
    live: bool
    map_behind: Behind
    merge_behind: Behind | None
    records_per_s: float | None  # its map hop's, over the sample
    workers: list[workers.Worker]

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
        raise JobCommandError(f"no job {job!r} in the registry: deploy it first (`onceflow job deploy MODULE`)")
    return record


def status(common: CommonSettings, job: str, sample_s: float = 1.0) -> list[VersionStatus]:
    """Every version that runs: how far its hops are behind the ends of their inputs, and its
    map hop's rate over ``sample_s``."""
    record = record_of(common, job)
    dedup = common.topic(Topic.DEDUP_RECORDS)
    running = [v for v in sorted(record.versions.values(), key=lambda v: v.version) if v.running]
    ends = positions.stable_ends(common, dedup)
    before = {v.version: positions.group_positions(common, _map_group(common, job, v), dedup) for v in running}
    started = time.monotonic()
    if sample_s > 0:
        time.sleep(sample_s)
    out = []
    for v in running:
        now = positions.group_positions(common, _map_group(common, job, v), dedup)
        elapsed = time.monotonic() - started
        rate = sum(now.values()) - sum(before[v.version].values())
        out.append(
            VersionStatus(
                job=job,
                version=v,
                live=v.version == record.live,
                map_behind=positions.behind(common, dedup, now, ends),
                merge_behind=_merge_behind(common, versioned(job, v.version)) if v.kind != "transform" else None,
                records_per_s=rate / elapsed if sample_s > 0 else None,
                workers=workers.running(job, v.version),
            )
        )
    return out


def _map_group(common: CommonSettings, job: str, version: Version) -> str:
    return COMPUTE_MAP.group_id(common.topic_prefix, versioned(job, version.version))


def _merge_behind(common: CommonSettings, name: str) -> Behind | None:
    partials = common.topic(job_topic(Topic.COMPUTE_PARTIALS, name))
    try:
        ends = positions.stable_ends(common, partials)
    except KafkaException:
        return None  # not created yet: the worker has not started
    group = COMPUTE_MERGE.group_id(common.topic_prefix, name)
    return positions.behind(common, partials, positions.group_positions(common, group, partials), ends)


def lagging(common: CommonSettings, record: JobRecord, version: Version) -> list[str]:
    """What the version still lacks before readers may see it ([] = caught up): its map hop
    behind the live version's (the end of dedup.records when none is live), its merge hop
    behind its partials, the sink behind compute.results. Each is measured after the one
    before it, so what the earlier hop wrote is counted."""
    name = versioned(record.job, version.version)
    dedup = common.topic(Topic.DEDUP_RECORDS)
    if record.live:
        target = positions.group_positions(common, _map_group(common, record.job, record.versions[record.live]), dedup)
        against = f"the live {record.live_name}"
    else:
        target, against = positions.stable_ends(common, dedup), f"the end of {dedup}"
    mapped = positions.behind(common, dedup, positions.group_positions(common, _map_group(common, record.job, version), dedup), target)
    if mapped.records:
        return [f"its map hop is {mapped} behind {against}"]
    if version.kind != "transform":
        merged = _merge_behind(common, name)
        if merged is None or merged.records:
            return [f"its merge hop is {merged or 'not started: its partials topic does not exist'} behind"]
    applied = _sink_behind(common)
    return [f"the sink is {applied} behind"] if applied.records else []


def _sink_behind(common: CommonSettings) -> Behind:
    from onceflow_sink.tables import ResultTables

    results = common.topic(Topic.COMPUTE_RESULTS)
    client = connect(common.redis_url)
    tables = ResultTables(client, common.topic_prefix)
    # The sink keeps its applied offsets in Redis, beside the rows (read only: no token taken).
    stored = {p: client.hget(tables.meta_key(p), "offset") for p in partitions_of(common, results)}
    applied = {p: 0 if o is None else int(o) + 1 for p, o in stored.items()}
    return positions.behind(common, results, applied, positions.stable_ends(common, results))


def promote(
    common: CommonSettings, job: str, version: int, force: bool = False, wait_s: float = 0.0,
    on_wait: Callable[[list[str]], None] | None = None, alias_timeout_s: float = 30.0,
) -> JobRecord:
    """Switch the job's readers to ``version``: refused while it lags (``wait_s``: wait up to
    that long for it to catch up), unless ``force``. Returns the record once the sink serves it."""
    deadline = time.monotonic() + wait_s
    while True:
        record = record_of(common, job)
        target = _version(record, version)
        if target.state is VersionState.RETIRED:
            raise JobCommandError(f"{versioned(job, version)} is retired: deploy a new version")
        if record.live == version:
            raise JobCommandError(f"{versioned(job, version)} is already live")
        missing = [] if force else lagging(common, record, target)
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
    _wait_served(common, job, promoted.live_name, alias_timeout_s)
    return promoted


def _wait_served(common: CommonSettings, job: str, name: str, timeout_s: float) -> None:
    from onceflow_sink.tables import ResultTables

    tables = ResultTables(connect(common.redis_url), common.topic_prefix)
    deadline = time.monotonic() + timeout_s
    while tables.resolve(job) != name:
        if time.monotonic() >= deadline:
            raise JobCommandError(
                f"the registry makes {name} live, but the sink has not switched {job}'s readers to it within "
                f"{timeout_s:.0f} s: is the sink running? It switches them when it next reads the registry"
            )
        time.sleep(0.2)


def _version(record: JobRecord, version: int) -> Version:
    found = record.versions.get(version)
    if found is None:
        known = ", ".join(f"{v} ({record.versions[v].state.value})" for v in sorted(record.versions)) or "none"
        raise JobCommandError(f"{record.job} has no version {version} (versions: {known})")
    return found


def retire(common: CommonSettings, job: str, version: int) -> list[str]:
    """Stop a version that is not live and delete its topics and groups; the sink deletes its
    table when it reads the registry. Returns what was deleted."""
    record = record_of(common, job)
    target = _version(record, version)
    name = versioned(job, version)
    if record.live == version:
        raise JobCommandError(f"{name} is live: promote another version first; readers would have nothing to read")
    if target.state is VersionState.RETIRED:
        raise JobCommandError(f"{name} is already retired")
    stopped = workers.stop(job, version)
    with RegistryWriter(common) as registry:
        current = registry.records.get(job) or record
        if current.live == version:
            raise JobCommandError(f"{name} became live meanwhile: nothing changed")
        registry.write(current.retired(version))
    deleted = [f"{len(stopped)} local worker(s) stopped"] if stopped else []
    admin = clients.admin(common)
    topics = [common.topic(job_topic(t, name)) for t in (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_CHANGELOG)]
    existing = set(admin.list_topics(timeout=10).topics)
    gone = [t for t in topics if t in existing]
    for topic, future in (admin.delete_topics(gone, operation_timeout=30).items() if gone else []):
        future.result()
        deleted.append(f"topic {topic}")
    groups = [hop.group_id(common.topic_prefix, name) for hop in (COMPUTE_MAP, COMPUTE_MERGE)]
    for group, future in admin.delete_consumer_groups(groups, request_timeout=30).items():
        try:
            future.result()
            deleted.append(f"group {group}")
        except KafkaException:
            pass  # never created (a transform has no merge group) or still held: nothing to delete
    deleted.append(f"table {name} (by the sink, as it reads the registry)")
    return deleted


def reprocess(common: CommonSettings, job: str, start_from: str = EARLIEST, **options: object) -> Deployed:
    """A new version of the live code from ``start_from``: the bug-fix path."""
    record = record_of(common, job)
    if not record.live:
        raise JobCommandError(f"{job} has no live version to reprocess: deploy and promote one first")
    module = record.versions[record.live].module
    return deploy(common, module, start_from=start_from, note=f"reprocess of {record.live_name}", **options)  # type: ignore[arg-type]


def version_argument(text: str) -> int:
    try:
        return parse_version(text.lstrip("v"))
    except ValueError as exc:
        raise JobCommandError(str(exc)) from None
