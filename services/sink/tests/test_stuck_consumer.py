"""The sink runs on the shared consumer driver, so it takes the driver's rule for a consumer
that cannot learn its committed offsets: after the tries of ``onceflow.txn.offsets`` it ends
with exit 4 so that a new process takes over, as every other hop does (one rule, one place:
only the driver's module is patched here)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from onceflow.config import CommonSettings, LoopSettings
from onceflow.topology import Topic
from onceflow.txn import driver, offsets
from onceflow.txn.errors import EXIT_RESTART

from onceflow_sink import worker as worker_module


class _ConsumerWhoseGroupNeverAnswers:
    """Assigns one partition at the first consume, then times out on every committed()."""

    def __init__(self) -> None:
        self.on_assign: Any = None
        self.committed_calls = 0

    def subscribe(self, topics: list[str], on_assign: Any = None, **_callbacks: Any) -> None:
        self.on_assign = on_assign

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list:
        self.on_assign(self, [TopicPartition(Topic.COMPUTE_RESULTS, 0)])
        return []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.committed_calls += 1
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets: Local: Timed out"))

    def assignment(self) -> list[TopicPartition]:
        return []

    def close(self) -> None:
        pass


class _Membership:
    def observe(self, _consumer: Any) -> None:
        pass


class _Tables:
    def watch_identity(self) -> None:
        pass


def test_a_sink_whose_consumer_gets_no_committed_offsets_exits_for_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _ConsumerWhoseGroupNeverAnswers()
    monkeypatch.setattr(offsets, "COMMITTED_TRIES", 2)
    monkeypatch.setattr(driver, "open_producer", lambda *_args, **_kwargs: object())
    monkeypatch.setattr(driver, "wait_partition_count", lambda *_args, **_kwargs: 4)
    monkeypatch.setattr(driver, "watch_membership", lambda *_args, **_kwargs: _Membership())
    monkeypatch.setattr(driver.clients, "consumer", lambda *_args, **_kwargs: consumer)
    sink = worker_module.SinkWorker(
        CommonSettings(), LoopSettings(), _Tables(), instance="t", acking=False,  # type: ignore[arg-type]
    )
    assert sink.run() == EXIT_RESTART
    assert consumer.committed_calls == 2
    assert "no committed offsets for [0] after 2 tries" in sink.stats.last_error
    assert sink.state is driver.LoopState.STOPPED
