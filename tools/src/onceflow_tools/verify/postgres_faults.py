"""What can happen to the PostgreSQL a sink keeps its tables in, done on purpose:

- a crash: kill -9 of the postmaster, a restart a moment later and crash recovery from the WAL.
  Every commit survives (fsync on); the sink must neither lose nor repeat a change across it;
- a rollback: an older base backup restored. Every commit after the backup's moment is gone (the
  rows and the applied offsets with them), as after restoring last night's backup or promoting a
  lagging replica. The sink must notice that the store went back in time and rebuild what it
  lost from compute.results.

The schedule (``schedule.FaultSchedule``) keeps one base backup at a time (``Backups``): taken
near the start of the run and again after each rollback, so a rollback always has something
older to go back to.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psycopg
from psycopg import sql

from onceflow_tools.infra.postgres import PostgresServer


def crash(server: PostgresServer, pause_s: float = 1.0) -> str:
    """kill -9 of the server; after ``pause_s`` (clients meanwhile see refused connections) a
    start, which runs crash recovery."""
    started = time.monotonic()
    server.kill9()
    time.sleep(pause_s)
    server.start()
    return f"postgres kill -9 and restart with crash recovery ({time.monotonic() - started:.0f} s)"


def rollback(server: PostgresServer, backup: Path) -> str:
    """The server back to ``backup``'s moment: killed, its data replaced by the backup, started."""
    started = time.monotonic()
    server.restore(backup)
    return f"postgres rollback: base backup {backup.name} restored ({time.monotonic() - started:.0f} s)"


def applied_total(server: PostgresServer, topic_prefix: str) -> int:
    """The sum of the applied offsets the sink's partitions hold for ``topic_prefix`` (-1: none
    yet): it grows with every apply, so a rollback that would lose nothing can be told."""
    from onceflow_sink.postgres import schema_of  # the sink's layout lives with it

    query = sql.SQL('SELECT coalesce(sum(applied_offset + 1), 0) FROM {}').format(
        sql.Identifier(schema_of(topic_prefix), "sink.partitions")
    )
    try:
        with psycopg.connect(server.url, connect_timeout=5) as conn:
            row = conn.execute(query).fetchone()
    except psycopg.Error:  # not made yet, or the server restarting
        return -1
    return int(row[0]) if row else -1


class Backups:
    """The one base backup a run's rollback goes back to, under the server's home."""

    def __init__(self, server: PostgresServer, name: str) -> None:
        self.server = server
        self.prefix = name
        self.name = name.strip(".-_") or "run"  # a run's topic prefix (Kafka's characters), maybe empty
        self.count = 0
        self.latest: Path | None = None
        self.taken_at = 0.0  # time.monotonic() of the latest
        self.applied_at_backup = -1  # applied_total when the latest was taken

    def wait_for_writes(self, timeout_s: float = 60.0) -> bool:
        """Until the sink applied something since the latest backup (a rollback that loses
        nothing tests nothing): False if it did not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while applied_total(self.server, self.prefix) <= self.applied_at_backup:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
        return True

    def take(self) -> Path:
        """A new base backup; the previous one is deleted once the new one is complete."""
        self.count += 1
        dest = self.server.backup_dir / f"{self.name}-{self.count}"
        shutil.rmtree(dest, ignore_errors=True)
        applied = applied_total(self.server, self.prefix)  # before: what the backup holds at least
        self.server.base_backup(dest)
        previous, self.latest, self.taken_at = self.latest, dest, time.monotonic()
        self.applied_at_backup = applied
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return dest

    def age_s(self) -> float:
        return time.monotonic() - self.taken_at if self.latest else 0.0

    def discard(self) -> None:
        if self.latest is not None:
            shutil.rmtree(self.latest, ignore_errors=True)
            self.latest = None
