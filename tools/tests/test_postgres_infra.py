"""The local PostgreSQL on the real server: started by the stack's own function, it keeps what
was committed through a kill -9 (crash recovery), and a restored base backup takes it back to
the backup's moment (verify's rollback fault).

tools/tests have no conftest giving each xdist worker a stack of its own, and this test kills
and rolls back its server: it runs a cluster of its own (a home per worker, a free port), never
the one a session's sink tests use."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from onceflow.config import runtime_dir
from onceflow_tools.infra import postgres
from onceflow_tools.verify import postgres_faults

pytestmark = [pytest.mark.sinks, pytest.mark.integration, pytest.mark.fault]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[postgres.PostgresServer]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    # Kept between runs (under the runtime home, which the server's OS user can reach): the
    # next run skips initdb.
    home = runtime_dir() / "tests" / f"postgres-infra-{worker}"
    monkeypatch.setenv("ONCEFLOW_HOME", str(home))
    monkeypatch.setenv("ONCEFLOW_POSTGRES_URL", f"postgresql://onceflow@127.0.0.1:{_free_port()}/onceflow")
    started = postgres.ensure_running(timeout=60)
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(started.backup_dir, ignore_errors=True)


def _rows(url: str) -> list[int]:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return [row[0] for row in conn.execute("SELECT n FROM infra_probe ORDER BY n")]


def _insert(url: str, *values: int) -> None:
    with psycopg.connect(url, connect_timeout=5) as conn:  # commits on leaving the block
        conn.cursor().executemany("INSERT INTO infra_probe (n) VALUES (%s)", [(v,) for v in values])


def test_commits_survive_kill9_and_a_restore_goes_back_to_the_backup(server: postgres.PostgresServer, tmp_path: Path) -> None:
    started = time.monotonic()
    assert server.is_healthy() and server.pid() is not None
    assert postgres.ensure_running() == server and server.start() is False  # idempotent: already running
    with psycopg.connect(server.url) as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("onceflow", "onceflow")
        conn.execute("DROP TABLE IF EXISTS infra_probe")
        conn.execute("CREATE TABLE infra_probe (n int PRIMARY KEY)")
    _insert(server.url, 1, 2)

    backup = server.base_backup(server.backup_dir / "before-3")
    _insert(server.url, 3, 4)

    old_pid = server.pid()
    postgres_faults.crash(server, pause_s=0.2)
    assert server.pid() not in (None, old_pid)
    assert _rows(server.url) == [1, 2, 3, 4], "a commit was lost in crash recovery"
    assert "database system was interrupted" in server.log_path.read_text()

    postgres_faults.rollback(server, backup)
    assert _rows(server.url) == [1, 2], "the restore did not go back to the backup's moment"
    _insert(server.url, 5)  # and it takes writes again, as a primary
    assert _rows(server.url) == [1, 2, 5]
    assert time.monotonic() - started < 30
