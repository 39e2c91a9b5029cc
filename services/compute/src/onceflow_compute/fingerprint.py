"""A job's state fingerprint (docs/jobs.md#changing-a-job, docs/decisions/0023): a canonical,
versioned description of everything that shapes the job's state, a hash of it, and the one
comparison that decides what a worker does with state written under another description.

Pure: no Kafka, no Redis. The description is a JSON object, stored whole with the state (the
changelog's reserved key, the sink's table meta keeps the hash), so a refusal can name the
difference instead of two hashes.

What is in it: the kind, the job's name, its stream (when not the default), the key, the input schema (each field's name, type and
nullability); per aggregate its name, type, column and, for a ``Combine``, the combiner's class
(``module.qualname``: its identity); the window, trigger, accumulation, allowed lateness and
time column; a join's side ids and kind. What is not: the doc string and the code of
``prepare``/``transform``/a join's sides, which shape the values that reach state, not the state's
layout (a change there is a bug fix: reprocess, docs/jobs.md).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow import streams

from onceflow_compute.api import Aggregation, Job, Join, JSONValue
from onceflow_compute.api.aggregates import Aggregate, Combine
from onceflow_compute.dataflow.windows import WindowFn

# The description's format. A worker refuses state described in a version it does not know.
VERSION = 1

Description = dict[str, Any]


def describe(job: Job) -> Description:
    """The job's canonical description (JSON values only; key order irrelevant: see :func:`canonical`)."""
    out: Description = {
        "v": VERSION,
        "kind": job.kind,
        "job": job.name,
        "key": job.key,
        "schema": [[f.name, str(f.type), f.nullable] for f in job.schema],
    }
    if streams.canonical(job.stream):
        # Another stream's records are other state; the default stream's jobs keep the
        # description they were fingerprinted with before streams existed.
        out["stream"] = job.stream
    if isinstance(job, Aggregation):
        out.update(
            aggregates=[_aggregate(a) for a in job.aggregates],
            window=_window(job.window),
            trigger={"early_every_ms": job.trigger.early_every_ms, "late": job.trigger.late},
            accumulation=job.accumulation.value,
            allowed_lateness_ms=job.allowed_lateness_ms,
            time_column=job.time_column,
        )
    elif isinstance(job, Join):
        out.update(
            join={"on": job.on, "left_id": job.left_id, "right_id": job.right_id, "how": job.how.value},
            window=_window(job.window),
            allowed_lateness_ms=job.allowed_lateness_ms,
            time_column=job.time_column,
        )
    return out


def _aggregate(aggregate: Aggregate) -> dict[str, JSONValue]:
    described: dict[str, JSONValue] = {"name": aggregate.name, "type": type(aggregate).__name__}
    column = getattr(aggregate, "column", None)
    if column is not None:
        described["column"] = column
    if isinstance(aggregate, Combine):
        combiner = type(aggregate.combiner)
        described["combiner"] = f"{combiner.__module__}.{combiner.__qualname__}"
    return described


# Window settings added after jobs were fingerprinted: described only when not at this value
# (which behaves as before), so those jobs' fingerprints stand.
LATER_WINDOW_SETTINGS: dict[str, JSONValue] = {"merge_touching": False}


def _window(window: WindowFn) -> dict[str, JSONValue]:
    described: dict[str, JSONValue] = {"type": type(window).__name__}
    if dataclasses.is_dataclass(window):
        for f in dataclasses.fields(window):
            value = getattr(window, f.name)
            if f.name in LATER_WINDOW_SETTINGS and value == LATER_WINDOW_SETTINGS[f.name]:
                continue
            described[f.name] = value
    return described


def canonical(description: Description) -> bytes:
    return json.dumps(description, sort_keys=True, separators=(",", ":")).encode()


def fingerprint(description: Description) -> str:
    """``v1:`` and 16 hex digits of the canonical description's SHA-256."""
    return f"v{description.get('v')}:{hashlib.sha256(canonical(description)).hexdigest()[:16]}"


class Decision(str, enum.Enum):
    IDENTICAL = "identical"  # resume as is
    CARRY_OVER = "carry_over"  # the same state under another layout: remap it by name
    REFUSED = "refused"  # state this job cannot read: serve nothing, say why


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    # CARRY_OVER: for each aggregate of the loaded job, its position in the stored state.
    mapping: tuple[int, ...] = ()
    # What differs, one sentence each (CARRY_OVER: what was mapped; REFUSED: why).
    differences: tuple[str, ...] = field(default_factory=tuple)

    @property
    def identity(self) -> bool:
        """The mapping changes nothing (a carry-over that only rewrites the description)."""
        return self.mapping == tuple(range(len(self.mapping)))


_SETTINGS = ("kind", "job", "key", "schema", "window", "trigger", "accumulation", "allowed_lateness_ms", "time_column", "join")


def compare(stored: Description, loaded: Description) -> Verdict:
    """What a worker running ``loaded`` does with state written under ``stored``."""
    if stored.get("v") != VERSION:
        return Verdict(Decision.REFUSED, differences=(f"the state's fingerprint is format v{stored.get('v')}; this worker reads v{VERSION}",))
    if canonical(stored) == canonical(loaded):
        return Verdict(Decision.IDENTICAL, tuple(range(len(loaded.get("aggregates", [])))))
    refused = [
        f"{name} changed from {_text(stored.get(name))} to {_text(loaded.get(name))}"
        for name in _SETTINGS
        if stored.get(name) != loaded.get(name)
    ]
    old: list[dict[str, Any]] = stored.get("aggregates", [])
    new: list[dict[str, Any]] = loaded.get("aggregates", [])
    old_at = {a["name"]: i for i, a in enumerate(old)}
    new_names = {a["name"] for a in new}
    refused += [f"aggregate {a['name']!r} ({_aggregate_text(a)}) added" for a in new if a["name"] not in old_at]
    refused += [f"aggregate {a['name']!r} ({_aggregate_text(a)}) removed" for a in old if a["name"] not in new_names]
    refused += [
        f"aggregate {a['name']!r} changed from {_aggregate_text(old[old_at[a['name']]])} to {_aggregate_text(a)}"
        for a in new
        if a["name"] in old_at and old[old_at[a["name"]]] != a
    ]
    if refused:
        return Verdict(Decision.REFUSED, differences=tuple(refused))
    mapping = tuple(old_at[a["name"]] for a in new)
    mapped = tuple(f"aggregate {a['name']!r} position {mapping[i]} -> {i}" for i, a in enumerate(new) if mapping[i] != i)
    return Verdict(Decision.CARRY_OVER, mapping, mapped)


def remap(values: Sequence[JSONValue], mapping: Sequence[int]) -> list[JSONValue]:
    """Stored partials (one per stored aggregate) in the loaded job's order."""
    if len(values) != len(mapping):
        raise ValueError(f"expected {len(mapping)} stored partials, got {len(values)}")
    return [values[at] for at in mapping]


def refusal_reason(job: str, verdict: Verdict) -> str:
    """The sentence an operator reads in Status: what differs and what to do instead."""
    return (
        f"job {job!r}: its state was written by an incompatible version of the job "
        f"({'; '.join(verdict.differences)}); this worker consumes nothing and the old table stays served. "
        f"Deploy the changed job as a new version beside the live one (`onceflow job deploy MODULE`: its own "
        f"topics and table, promoted once caught up), or start the previous code again; reading the old state "
        f"under new rules would corrupt the table (docs/jobs.md#changing-a-job)"
    )


def _text(value: Any) -> str:
    return "none" if value is None else json.dumps(value, sort_keys=True)


def _aggregate_text(aggregate: dict[str, Any]) -> str:
    inner = aggregate.get("combiner") or aggregate.get("column") or ""
    return f"{aggregate['type']}({inner})" if inner else aggregate["type"]
