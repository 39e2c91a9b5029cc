"""Where a job's state fingerprint lives and the check a worker runs before it consumes anything
(docs/decisions/0023; the comparison itself is pure: fingerprint.py).

The fingerprint is stored in the job's changelog (``compute.changelog.<job>``) under a reserved
key per partition, ``<job>\\x02fingerprint``, whose value is the canonical description. The merge
hop writes it in the same transaction as the partition's first state write (merge/layout.py), so
a restore sees state and fingerprint together, and compaction keeps it (one key, rewritten only
when the description changes). :func:`check_state` reads it back: the function ``onceflow
compute`` runs at start and a later ``onceflow job deploy`` can run against a live job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from onceflow.config import CommonSettings
from onceflow.kafka.inspect import partitions_of
from onceflow.state.stores import PartitionStores
from onceflow.topology import Topic, job_topic

from onceflow_compute.api import Job
from onceflow_compute.fingerprint import Decision, Description, Verdict, compare, describe, fingerprint, refusal_reason

log = logging.getLogger(__name__)


def fingerprint_key(job: str) -> bytes:
    """The reserved changelog key (state keys are ``job\\x00key``, source watermarks ``job\\x01p``)."""
    return f"{job}\x02fingerprint".encode()


def record(description: Description, carried: Mapping[str, Sequence[int]]) -> bytes:
    """The reserved key's value: the description, and each earlier layout it was carried over
    from with that layout's mapping to it (merge/layout.py)."""
    return json.dumps({"description": description, "carried": dict(carried)}, sort_keys=True, separators=(",", ":")).encode()


def parse(value: bytes) -> tuple[Description, dict[str, list[int]]]:
    data = json.loads(value)
    return data["description"], data.get("carried", {})


class FingerprintOnly:
    """A store for :class:`PartitionStores` that keeps the reserved key and counts the rest: a
    restore that reads the whole changelog partition but holds only its fingerprint."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.value: bytes | None = None
        self.state_keys = 0
        self._checkpoint: int | None = None

    @property
    def checkpoint(self) -> int | None:
        return self._checkpoint

    def get(self, key: bytes) -> bytes | None:
        return self.value if key == self._key else None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter([] if self.value is None else [(self._key, self.value)])

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        for key, value in changes.items():
            if key == self._key:
                self.value = value
            elif value is not None:
                self.state_keys += 1  # an upper bound (a key may repeat): "is there state" is all it answers
        if checkpoint is not None and (self._checkpoint is None or checkpoint > self._checkpoint):
            self._checkpoint = checkpoint

    def reset(self) -> None:
        self.value, self.state_keys, self._checkpoint = None, 0, None

    def audit(self) -> None:
        """Process memory."""

    def close(self) -> None:
        """Nothing held outside the process."""


@dataclass(frozen=True)
class StateCheck:
    """What the job's stored state says about the loaded job."""

    job: str
    loaded: str  # the loaded job's fingerprint
    verdict: Verdict
    # Per changelog partition: the stored fingerprint, "" for none (fresh, or written before fingerprints).
    stored: dict[int, str] = field(default_factory=dict)
    # Partitions with state but no fingerprint: the upgrade path (taken as the loaded job's once).
    unfingerprinted: tuple[int, ...] = ()

    @property
    def refused(self) -> bool:
        return self.verdict.decision is Decision.REFUSED

    def reason(self) -> str:
        return refusal_reason(self.job, self.verdict) if self.refused else ""


def decide(job: Job, stored: Mapping[int, Description | None], has_state: Mapping[int, bool]) -> StateCheck:
    """Pure: the verdict over every partition's stored description. One refusing partition
    refuses the job; partitions without a fingerprint follow the others (the upgrade path)."""
    loaded = describe(job)
    verdicts = [compare(description, loaded) for description in stored.values() if description is not None]
    refusals = [v for v in verdicts if v.decision is Decision.REFUSED]
    carried = [v for v in verdicts if v.decision is Decision.CARRY_OVER]
    if refusals:
        differences = tuple(dict.fromkeys(d for v in refusals for d in v.differences))
        verdict = Verdict(Decision.REFUSED, differences=differences)
    elif carried:
        verdict = carried[0]
    else:
        verdict = Verdict(Decision.IDENTICAL, tuple(range(len(loaded.get("aggregates", [])))))
    return StateCheck(
        job=job.name,
        loaded=fingerprint(loaded),
        verdict=verdict,
        stored={p: "" if d is None else fingerprint(d) for p, d in sorted(stored.items())},
        unfingerprinted=tuple(p for p, d in sorted(stored.items()) if d is None and has_state.get(p)),
    )


def check_state(common: CommonSettings, job: Job) -> StateCheck:
    """Read the fingerprint stored in every partition of the job's changelog and judge the
    loaded job against it. Reads each partition to its end, as a restore does (with the same
    care for open transactions: PartitionStores), so it costs about one restore."""
    topic = common.topic(job_topic(Topic.COMPUTE_CHANGELOG, job.name))
    key = fingerprint_key(job.name)
    stores: PartitionStores[FingerprintOnly] = PartitionStores(common, topic, lambda _p: FingerprintOnly(key), service="compute-check")
    partitions = partitions_of(common, topic)
    stores.assign(partitions)
    stored: dict[int, Description | None] = {}
    has_state: dict[int, bool] = {}
    for partition, store in stores.items():
        stored[partition] = None if store.value is None else parse(store.value)[0]
        has_state[partition] = store.state_keys > 0
    stores.revoke(partitions)
    return decide(job, stored, has_state)
