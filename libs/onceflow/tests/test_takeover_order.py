"""The takeover order (docs/decisions/0021-takeover-order.md), without a broker: a transaction
timeout that could outlive the session is refused at start, and a new owner fetches its
partitions' committed offsets before it restores their state, then starts at the offsets it
fetched."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import service_main
from onceflow.config import CommonSettings, LoopSettings, heartbeat_interval_ms, takeover_order_problem
from onceflow.state.stores import Changelog
from onceflow.txn import TransactionalLoop
from onceflow.txn.batch import Batch
from onceflow.txn.errors import ConsumerStuck

# -- the start-time check ------------------------------------------------------------------


def test_the_defaults_and_the_test_and_verify_sessions_keep_the_order() -> None:
    common = CommonSettings()
    assert takeover_order_problem(common, LoopSettings()) is None
    # tests/conftest.py TEST_SESSION_TIMEOUT_MS and onceflow verify's campaign: 6 s.
    assert takeover_order_problem(common, LoopSettings(session_timeout_ms=6000)) is None


def test_a_transaction_timeout_not_below_the_session_by_a_heartbeat_is_refused_naming_both() -> None:
    session = 10_000
    heartbeat = heartbeat_interval_ms(session)
    assert heartbeat == 2000
    loop = LoopSettings(session_timeout_ms=session)
    assert takeover_order_problem(CommonSettings(transaction_timeout_ms=session - heartbeat - 1), loop) is None
    for txn in (session - heartbeat, session, 60_000):
        problem = takeover_order_problem(CommonSettings(transaction_timeout_ms=txn), loop)
        assert problem is not None
        assert f"ONCEFLOW_TRANSACTION_TIMEOUT_MS={txn}" in problem
        assert f"ONCEFLOW_LOOP_SESSION_TIMEOUT_MS={session}" in problem


class _ConsumingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_TOY_")
    common: CommonSettings = Field(default_factory=CommonSettings)
    loop: LoopSettings = Field(default_factory=LoopSettings)


def _never_run(_settings: _ConsumingSettings) -> int:
    raise AssertionError("the service was started")


def test_a_service_refuses_it_at_start_with_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ONCEFLOW_TRANSACTION_TIMEOUT_MS", "10000")
    monkeypatch.setenv("ONCEFLOW_LOOP_SESSION_TIMEOUT_MS", "10000")
    with pytest.raises(SystemExit) as ended:
        service_main.main("toy", "A toy service.", _ConsumingSettings, _never_run, argv=[])
    assert ended.value.code == service_main.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ONCEFLOW_TRANSACTION_TIMEOUT_MS=10000" in err and "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS=10000" in err
    assert "Traceback" not in err


def test_the_loop_refuses_to_be_built_with_it() -> None:
    with pytest.raises(ValueError, match="ONCEFLOW_TRANSACTION_TIMEOUT_MS=9000"):
        _loop(CommonSettings(transaction_timeout_ms=9000), LoopSettings(session_timeout_ms=9000))


# -- the assignment path ---------------------------------------------------------------------


class _Stage:
    name = "stage"

    def process(self, batch: Batch[Any]) -> None:
        pass


class _Stores:
    """Records when the restore ran, against the intake's calls."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.restored_records = 0
        self.repairs = 0

    def assign(self, partitions: list[int]) -> None:
        self.events.append(f"restore {sorted(partitions)}")


class _Intake:
    def __init__(self, events: list[str], committed: dict[int, int] | None) -> None:
        self.events = events
        self._committed = committed

    def committed(self, consumer: Any, partitions: list[TopicPartition], stop: threading.Event) -> list[TopicPartition] | None:
        self.events.append(f"committed {sorted(tp.partition for tp in partitions)}")
        if self._committed is None:
            stop.set()
            return None
        return [TopicPartition(tp.topic, tp.partition, self._committed.get(tp.partition, -1001)) for tp in partitions]


def _loop(common: CommonSettings | None = None, settings: LoopSettings | None = None, intake: Any = None) -> TransactionalLoop[Any]:
    return TransactionalLoop(
        stage=_Stage(), common=common or CommonSettings(), settings=settings or LoopSettings(), input_topic="in",
        group_id="g", transactional_id="x", dlq_topic="dlq", changelog=Changelog.in_memory("cl"), intake=intake,
    )


def _assigning(committed: dict[int, int] | None, partitions: list[TopicPartition]) -> tuple[list[str], Any]:
    events: list[str] = []
    loop = _loop(intake=_Intake(events, committed))
    loop.stores = _Stores(events)  # type: ignore[assignment]
    loop.assigning(object(), partitions)  # type: ignore[arg-type]
    return events, loop


def test_a_new_owner_fetches_committed_offsets_before_it_restores_and_starts_at_them() -> None:
    partitions = [TopicPartition("in", p) for p in (0, 1, 2)]
    events, _loop_ = _assigning({0: 120, 1: 7}, partitions)
    assert events == ["committed [0, 1, 2]", "restore [0, 1, 2]"]
    # At the offsets fetched before the restore, not at ones librdkafka would fetch after it;
    # a partition nothing committed yet starts at its beginning.
    assert [tp.offset for tp in partitions] == [120, 7, OFFSET_BEGINNING]


def test_positions_the_intake_handed_over_are_kept_and_not_fetched_again() -> None:
    # The external intake reads its positions topic before it assigns.
    partitions = [TopicPartition("in", 0, 55), TopicPartition("in", 1, OFFSET_BEGINNING)]
    events, _loop_ = _assigning({0: 1, 1: 1}, partitions)
    assert events == ["restore [0, 1]"]
    assert [tp.offset for tp in partitions] == [55, OFFSET_BEGINNING]


def test_a_stop_while_fetching_restores_nothing() -> None:
    partitions = [TopicPartition("in", 0)]
    events, _loop_ = _assigning(None, partitions)
    assert events == ["committed [0]"]
    assert partitions[0].offset == OFFSET_INVALID


def test_a_consumer_stuck_on_the_fetch_leaves_the_callback_before_any_restore() -> None:
    events: list[str] = []

    class _Stuck(_Intake):
        def committed(self, consumer: Any, partitions: list[TopicPartition], stop: threading.Event) -> list[TopicPartition] | None:
            raise ConsumerStuck("no committed offsets")

    loop = _loop(intake=_Stuck(events, {}))
    loop.stores = _Stores(events)  # type: ignore[assignment]
    with pytest.raises(ConsumerStuck):
        loop.assigning(object(), [TopicPartition("in", 0)])  # type: ignore[arg-type]
    assert events == []
