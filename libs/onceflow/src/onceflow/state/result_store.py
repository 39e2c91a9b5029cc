"""The sink contract: what a store of result tables (Redis, PostgreSQL) answers the sink.

In the spirit of Flink's ``TwoPhaseCommitSinkFunction``, but with the store itself as the
record of what was committed: the sink applies one ``compute.results`` partition's batch of
changes in one atomic step of the store, and that step states

- the **owner token** of the instance applying it (a newer owner's fences it: the zombie's write
  lands nowhere);
- the **offset range**: everything up to ``last_offset`` of the partition;
- the **position it believes the store holds** (``applied``: the last offset this owner applied,
  -1 none).

A store that holds another position (it lost or rolled back writes: a failover, a restored
backup, a flush) writes nothing and answers ``DIVERGED``; the sink then ``retake``s the
partition and replays ``compute.results`` from its start, which rewrites exactly that
partition's rows. Every answer is an ``Answer`` whose outcome is ``onceflow.state.fencing``'s.

A store unreachable or refusing writes (down, read-only, out of disk) raises
``StoreUnavailable``: the sink is NOT_SERVING and retries; whether the write landed is for the
next continuity check to say. docs/services/sink.md describes each store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from onceflow.state.fencing import Outcome


class StoreRefused(Exception):
    """The store holds something this sink must not write on (a table altered by hand): an
    operator has to fix it; the sink does not start (exit 2) rather than guess."""


@dataclass(frozen=True)
class Answer:
    outcome: Outcome  # applied, checked, fenced, diverged, retaken
    newest_token: int
    stored: int  # the offset the store holds, -1 for none


@dataclass(frozen=True)
class Change:
    op: str  # "+" upsert or "-" retract
    job: str
    key: str
    value: bytes = b""
    fingerprint: str = ""  # the job's state fingerprint ("" from workers that predate them)


@dataclass(frozen=True)
class ScanPage:
    rows: list[tuple[str, bytes]]
    token: bytes  # empty: the scan is done
    table: str  # the table read: the job's alias resolved on the first page, pinned in the token


class ResultStore(Protocol):
    """One store of every job's result table, partitioned as ``compute.results`` is."""

    name: str  # "Redis", "PostgreSQL": for logs and errors

    # -- the sink's writes: fenced, continuity-checked, atomic per call ------------------------

    def take_ownership(self, partition: int) -> tuple[int, int]:
        """A new owner's first step: the next fencing token (above every earlier owner's, and
        above the clock in ms so it stays above them after the store lost its tokens), and the
        last offset applied (-1 none). Whatever the store holds is a consistent prefix."""

    def apply(
        self, partition: int, token: int, applied: int, last_offset: int | None, changes: Iterable[Change]
    ) -> Answer:
        """Apply ``changes`` up to ``last_offset`` if the store holds exactly ``applied`` for this
        owner; ``last_offset`` None only checks that (CHECKED)."""

    def retake(self, partition: int, token: int) -> Answer:
        """A rebuild's claim: ``token`` + 1 (RETAKEN) and no position, unless a newer owner holds
        the partition (FENCED)."""

    def refusal(self, change: Change) -> str:
        """Why this store cannot hold ``change`` ("" if it can): the sink dead-letters it with
        that reason instead of failing the batch (a key longer than an index allows)."""

    def applied_offset(self, partition: int) -> int:
        """The last offset applied to ``partition`` (-1 none); read only, no token taken."""

    def watch_identity(self) -> None:
        """Note a restart or a failover of the store (for the logs and Status)."""

    @property
    def restarts_seen(self) -> int: ...

    # -- versions: aliases and retired tables (the registry follower) --------------------------

    def set_alias(self, job: str, table: str, offset: int) -> bool:
        """Point ``job``'s plain name at ``table`` ('' : its unversioned table) as the registry
        record at ``offset`` says; False if the store holds a newer record's word."""

    def alias(self, job: str) -> tuple[str, int] | None: ...

    def resolve(self, job: str) -> str:
        """The table a name reads: a version as it is, a plain name through its alias."""

    def drop_table(self, table: str) -> None: ...

    def table_fingerprint(self, job: str) -> str: ...

    # -- reads (Query) ---------------------------------------------------------------------------

    def get(self, table: str, key: str) -> bytes | None: ...

    def scan_page(
        self, job: str, prefix: str, limit: int, token: bytes = b"", *, deadline: float | None = None,
    ) -> ScanPage:
        """At most ``limit`` rows under ``prefix`` from where ``token`` left off, in bounded work
        per call; ValueError for a token this store did not make, or made for another job."""

    def table(self, job: str) -> dict[bytes, bytes]: ...

    def rejected(self, partition: int) -> int:
        """Writes refused from stale owners (zombies) on ``partition``."""

    def close(self) -> None: ...
