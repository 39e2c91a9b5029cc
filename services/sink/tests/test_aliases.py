"""The registry folded into aliases and retired versions (``RegistryView``), a round of writes
that Redis refuses, and which tables a page token may continue: no broker, no Redis."""

from __future__ import annotations

import logging

import pytest
import redis

from onceflow.config import CommonSettings
from onceflow.versions import JobRecord, Version, VersionState

from onceflow_sink.aliases import Alias, RegistryFollower, RegistryView
from onceflow_sink.pages import check_pinned


def version(number: int, state: VersionState = VersionState.SHADOW) -> Version:
    return Version(number, "onceflow_compute.jobs.usersum", state, "earliest", 4, 1_700_000_000_000)


def record(job: str, *versions: Version, live: int = 0) -> bytes:
    return JobRecord(job, {v.version: v for v in versions}, live).encode()


def test_a_job_with_a_live_version_gets_an_alias_from_its_last_record() -> None:
    view = RegistryView()
    view.take(b"orders", record("orders", version(1)), 0)  # deployed, not promoted: no alias yet
    view.take(b"clicks", record("clicks", version(1, VersionState.LIVE), live=1), 1)
    assert view.aliases() == [Alias("clicks", "clicks@1", 1)]
    view.take(b"orders", record("orders", version(1, VersionState.LIVE), live=1), 2)
    view.take(b"orders", record("orders", version(1, VersionState.PREVIOUS), version(2, VersionState.LIVE), live=2), 5)
    assert view.aliases() == [Alias("clicks", "clicks@1", 1), Alias("orders", "orders@2", 5)]
    assert view.offset == 5
    assert view.retired() == frozenset()


def test_retired_versions_are_named_per_job() -> None:
    view = RegistryView()
    view.take(b"orders", record("orders", version(1, VersionState.RETIRED), version(2, VersionState.LIVE),
                                version(3, VersionState.RETIRED), live=2), 0)
    view.take(b"clicks", record("clicks", version(7, VersionState.RETIRED)), 1)
    assert view.retired() == frozenset({"orders@1", "orders@3", "clicks@7"})


def test_a_deleted_job_clears_its_alias_and_forgets_its_versions() -> None:
    view = RegistryView()
    view.take(b"orders", record("orders", version(1, VersionState.RETIRED), version(2, VersionState.LIVE), live=2), 0)
    view.take(b"orders", None, 3)
    assert view.aliases() == [Alias("orders", "", 3)]
    assert view.retired() == frozenset()


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (b"orders", b"{not json", "not a JobRecord (JSONDecodeError"),
        (b"orders", b'{"versions": {}}', "not a JobRecord (KeyError"),
        (b"orders", record("clicks"), "holds the record of job 'clicks'"),
        (None, record("orders"), "job name ''"),
        (b"no such/job", record("orders"), "job name 'no such/job'"),
    ],
)
def test_a_record_that_is_not_a_jobs_changes_nothing(key: bytes | None, value: bytes, reason: str) -> None:
    view = RegistryView()
    view.take(b"orders", record("orders", version(1, VersionState.LIVE), live=1), 0)
    with pytest.raises(ValueError) as error:
        view.take(key, value, 1)
    assert reason in str(error.value)
    assert view.aliases() == [Alias("orders", "orders@1", 0)]
    assert view.offset == 1  # read past all the same


@pytest.mark.parametrize(
    ("job", "table"),
    [("orders", "orders"), ("orders", "orders@2"), ("orders@2", "orders@2")],
)
def test_a_token_continues_a_table_of_the_job_asked_for(job: str, table: str) -> None:
    check_pinned(job, table)


@pytest.mark.parametrize(
    ("job", "table", "reason"),
    [
        ("orders", "clicks@2", "table 'clicks@2', not of job 'orders'"),
        ("orders", "orders2", "table 'orders2', not of job 'orders'"),
        ("orders@3", "orders@2", "table 'orders@2', not of job 'orders@3'"),
        ("orders@3", "orders", "table 'orders', not of job 'orders@3'"),
        ("orders", "orders@0", "not a page token this service gave"),
        ("orders", "a b", "not a page token this service gave"),
    ],
)
def test_a_token_for_another_table_is_refused(job: str, table: str, reason: str) -> None:
    with pytest.raises(ValueError) as error:
        check_pinned(job, table)
    assert reason in str(error.value)


class _FlakyTables:
    """Refuses every write while ``down``; records the aliases and drops that got through."""

    def __init__(self) -> None:
        self.down = True
        self.aliases: dict[str, tuple[str, int]] = {}
        self.dropped: list[str] = []

    def set_alias(self, job: str, table: str, offset: int) -> bool:
        if self.down:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:16379. Connection refused.")
        self.aliases[job] = (table, offset)
        return True

    def drop_table(self, table: str) -> None:
        self.dropped.append(table)


def test_a_redis_error_is_logged_once_per_kind_and_the_next_round_writes_it_all(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="onceflow_sink.aliases")
    tables = _FlakyTables()
    follower = RegistryFollower(CommonSettings(), tables)  # type: ignore[arg-type]
    follower._view.take(b"orders", record("orders", version(1, VersionState.RETIRED), version(2, VersionState.LIVE), live=2), 4)
    follower._retired = follower._view.retired()
    for _ in range(3):
        follower._write()  # no exception: the sink serves on
    assert caplog.text.count("aliases not written: Redis ConnectionError") == 1
    tables.down = False
    follower._write()
    assert tables.aliases == {"orders": ("orders@2", 4)} and tables.dropped == ["orders@1"]
    assert "aliases written again after Redis ConnectionError" in caplog.text
