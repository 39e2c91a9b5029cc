"""A job's versions (docs/jobs.md#changing-a-job, docs/decisions/0024): how a version is named,
and the registry record that says which versions exist and which one readers see.

Pure: no Kafka, no Redis (``onceflow.kafka.registry`` reads and writes the records).

A version runs as a job of its own name, ``<job>@<version>``: its own groups, transactional
ids, internal topics (``compute.partials.<job>.v<version>``, where a topic cannot hold ``@``),
state keys, result rows and table. The job's plain name is an alias: ``Query``, ``ResultsTail``
and the console read the version the registry calls live. A job never deployed through
``onceflow job`` has no record and no alias: its plain name is its one table, as before.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum

from onceflow.topology import MAX_VERSION, parse_version, split, topic_slot, versioned

__all__ = ["MAX_VERSION", "JobRecord", "Version", "VersionState", "parse_version", "split", "topic_slot", "versioned"]

class VersionState(StrEnum):
    SHADOW = "shadow"  # deployed, building its table; readers do not see it
    LIVE = "live"  # what the job's plain name reads
    PREVIOUS = "previous"  # was live; still running until retired (a promotion can go back to it)
    RETIRED = "retired"  # stopped; its topics, groups and table deleted


@dataclass(frozen=True)
class Version:
    version: int
    module: str
    state: VersionState
    start_from: str  # "earliest", or an event time in ms since the epoch (as text)
    partitions: int  # its internal topics' partitions
    deployed_ms: int
    fingerprint: str = ""
    note: str = ""  # why it was deployed: "reprocess", "rescale to 8", ...
    kind: str = ""  # the job's kind: "aggregation", "join", "transform" (a transform has no merge hop)
    stream: str = ""  # the stream it reads ("": the default; onceflow.streams)

    @property
    def running(self) -> bool:
        return self.state is not VersionState.RETIRED


@dataclass(frozen=True)
class JobRecord:
    """One job's versions: the registry's value under the job's name (the last one wins: the
    topic is compacted)."""

    job: str
    versions: dict[int, Version] = field(default_factory=dict)
    live: int = 0  # 0: no version promoted yet (the plain name reads the unversioned table)

    @property
    def live_name(self) -> str:
        return versioned(self.job, self.live)

    def next_version(self) -> int:
        return max(self.versions, default=0) + 1

    def with_version(self, version: Version) -> JobRecord:
        return replace(self, versions={**self.versions, version.version: version})

    def promoted(self, version: int) -> JobRecord:
        """``version`` live; the one live before it, previous."""
        versions = dict(self.versions)
        if self.live and self.live in versions and self.live != version:
            versions[self.live] = replace(versions[self.live], state=VersionState.PREVIOUS)
        versions[version] = replace(versions[version], state=VersionState.LIVE)
        return replace(self, versions=versions, live=version)

    def retired(self, version: int) -> JobRecord:
        return replace(self, versions={**self.versions, version: replace(self.versions[version], state=VersionState.RETIRED)})

    def encode(self) -> bytes:
        data = asdict(self)
        data["versions"] = {str(v): {**asdict(ver), "state": ver.state.value} for v, ver in self.versions.items()}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> JobRecord:
        data = json.loads(value)
        versions = {
            int(v): Version(**{**ver, "state": VersionState(ver["state"])}) for v, ver in data.get("versions", {}).items()
        }
        return cls(job=data["job"], versions=versions, live=int(data.get("live", 0)))
