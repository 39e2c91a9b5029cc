"""`onceflow job deploy | status | promote | retire | reprocess`, as functions the CLI (and the
tests) call (docs/decisions/0024). Deploying is here: it loads the job's code and may start
workers on this machine. Status, promotion and retirement are the sink's
(``onceflow_sink.versions``, also served as gRPC JobAdmin); here they add the local workers.

A version is a job of its own name (``orders@2``): its map group reads ``dedup.records`` from
where the deploy put it, exactly once like any job, while the live version keeps serving.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from onceflow import streams
from onceflow.codec import now_ms
from onceflow.config import CommonSettings
from onceflow.kafka import clients, positions
from onceflow.kafka.registry import RegistryWriter, read_registry
from onceflow.state.result_store import ResultStore
from onceflow.topology import COMPUTE_MAP, parse_version, versioned
from onceflow.versions import JobRecord, Version, VersionState
from onceflow_sink import versions
from onceflow_sink.config import SinkSettings
from onceflow_sink.stores import open_store
from onceflow_sink.versions import JobCommandError

from onceflow_tools.jobs import workers

if TYPE_CHECKING:
    from onceflow_compute.api import Job  # the compute package (and pyspark) only when a command needs it

__all__ = ["EARLIEST", "Deployed", "JobCommandError", "LocalStatus", "deploy", "lagging", "promote", "reprocess", "retire", "status"]

log = logging.getLogger(__name__)

EARLIEST = "earliest"


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


def load_module(module: str) -> Job:
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
    name = job.name
    stream = streams.canonical(job.stream)
    if not streams.lookup(common, stream):
        raise JobCommandError(f"job {name} reads {streams.missing_stream(stream)}")
    start_from = parse_start(start_from)
    notes = history_notes(common, start_from, stream)
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
        renamed = dataclasses.replace(job, name=versioned(name, number))
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
            kind=job.kind,
            stream=stream,
        )
        registry.write(record.with_version(deployed))
    if start_from != EARLIEST:
        _position_map_group(common, versioned(name, number), int(start_from), stream)
    notes.append(f"reads {streams.reading(common, stream, COMPUTE_MAP.group_id(common.topic_prefix, versioned(name, number)))}")
    env = workers.worker_env(module, number, partitions, f"{name}-v{number}-0", 0)
    started = workers.start(name, number, module, partitions, worker_count) if start else []
    if isinstance(job, Transform):
        notes.append("a transform keeps no state: its rows are written as its map hop reads them")
    return Deployed(name, deployed, started, env, notes)


def check_notes(common: CommonSettings, job: Job) -> list[str]:
    """What a deploy of ``job`` would meet (`onceflow job check`): its stream, what it would
    read, and whether the live version's state fits it. Reads only."""
    stream = streams.canonical(job.stream)
    name = job.name
    if not streams.lookup(common, stream):
        return [f"a deploy would be refused: {streams.missing_stream(stream)}"]
    record = read_registry(common).get(name) or JobRecord(name)
    next_name = versioned(name, record.next_version())
    notes = [f"a deploy as {next_name} would read {streams.reading(common, stream, COMPUTE_MAP.group_id(common.topic_prefix, next_name))}"]
    notes += state_notes(common, record, job) or [f"no live state of {name} to compare with"]
    return notes


def history_notes(common: CommonSettings, start_from: str, stream: str = "") -> list[str]:
    """Refuse a start older than what the stream's topic still holds; say where history begins."""
    topic = common.topic(streams.topic_of(stream))
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


def state_notes(common: CommonSettings, record: JobRecord, job: Job) -> list[str]:
    """What the live version's state says about the deployed code: the same check a worker runs
    at start (docs/decisions/0023), as information: a new version builds a state of its own."""
    from onceflow_compute import lifecycle
    from onceflow_compute.api import Transform

    if isinstance(job, Transform):
        return []
    live = dataclasses.replace(job, name=record.live_name)
    try:
        check = lifecycle.check_state(common, live)
    except KafkaException:
        return []  # no live state to compare with (its topics do not exist)
    if not any(check.stored.values()):
        return []
    if check.refused:
        return [f"the live {record.live_name} could not take this code's state ({'; '.join(check.verdict.differences)}): this version builds its own"]
    return [f"the live {record.live_name}'s state fits this code ({check.verdict.decision.value}): a restart of {record.live_name} on it would carry its state over without reprocessing"]


def _position_map_group(common: CommonSettings, name: str, at_ms: int, stream: str) -> None:
    """The new version's map group starts at ``at_ms`` (it has never run: nothing committed)."""
    topic = common.topic(streams.topic_of(stream))
    offsets = positions.offsets_for_time(common, topic, at_ms)
    group = COMPUTE_MAP.group_id(common.topic_prefix, name)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])
    admin = clients.admin(common)  # held until the answer: a freed client never completes its futures
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(timeout=30)


@dataclass(frozen=True)
class LocalStatus:
    """A version's status, and its workers started on this machine."""

    status: versions.VersionStatus
    workers: list[workers.Worker]


def status(common: CommonSettings, job: str, sample_s: float = 1.0) -> list[LocalStatus]:
    return [LocalStatus(s, workers.running(job, s.version.version)) for s in versions.status(common, job, sample_s)]


def _tables(common: CommonSettings) -> ResultStore:
    """The store the sink keeps the tables in (``ONCEFLOW_SINK_STORE``, as the sink reads it)."""
    return open_store(common, SinkSettings().store)


def lagging(common: CommonSettings, record: JobRecord, version: Version) -> list[str]:
    return versions.lagging(common, _tables(common), record, version)


def promote(
    common: CommonSettings, job: str, version: int, force: bool = False, wait_s: float = 0.0,
    on_wait: Callable[[list[str]], None] | None = None, alias_timeout_s: float = 30.0,
) -> JobRecord:
    return versions.promote(common, _tables(common), job, version, force, wait_s, on_wait, alias_timeout_s)


def retire(common: CommonSettings, job: str, version: int) -> list[str]:
    """Stop the version's workers started here, then retire it (``versions.retire``)."""
    versions.check_retirable(versions.record_of(common, job), version)  # refused before stopping anything
    stopped = workers.stop(job, version)
    deleted = versions.retire(common, job, version)
    return ([f"{len(stopped)} local worker(s) stopped"] if stopped else []) + deleted


def reprocess(
    common: CommonSettings, job: str, start_from: str = EARLIEST, worker_count: int = 1, start: bool = True
) -> Deployed:
    """A new version of the live code from ``start_from``: the bug-fix path."""
    record = versions.record_of(common, job)
    if not record.live:
        raise JobCommandError(f"{job} has no live version to reprocess: deploy and promote one first")
    module = record.versions[record.live].module
    note = f"reprocess of {record.live_name}"
    return deploy(common, module, start_from=start_from, worker_count=worker_count, start=start, note=note)


def version_argument(text: str) -> int:
    try:
        return parse_version(text.lstrip("v"))
    except ValueError as exc:
        raise JobCommandError(str(exc)) from None
