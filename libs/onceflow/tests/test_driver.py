"""The consumer driver's own rules, against a scripted consumer: what every hop (the
transactional loop and the sink) gets from it without writing it again."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from onceflow.config import CommonSettings, LoopSettings
from onceflow.txn import driver
from onceflow.txn.driver import ConsumerDriver, LoopState
from onceflow.txn.errors import EXIT_OK


class _Record:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class _Consumer:
    """Assigns partition 0 at the first consume; serves one record from each assigned,
    unpaused partition per consume, as a real consumer would."""

    def __init__(self) -> None:
        self.on_assign: Any = None
        self.assigned: set[int] = set()
        self.paused: set[int] = set()
        self.next_offset: dict[int, int] = {}
        self.lock = threading.Lock()

    def subscribe(self, topics: list[str], on_assign: Any = None, **_callbacks: Any) -> None:
        self.on_assign = on_assign

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[_Record]:
        with self.lock:
            if not self.assigned:
                self.on_assign(self, [TopicPartition("t", 0)])
            served = []
            for partition in sorted(self.assigned - self.paused):
                offset = self.next_offset.get(partition, 0)
                self.next_offset[partition] = offset + 1
                served.append(_Record(partition, offset))
        time.sleep(0.01)
        return served

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = {tp.partition for tp in partitions}
        self.paused -= self.assigned  # assign() resets pausing, as librdkafka's does

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in partitions}

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", p) for p in sorted(self.assigned)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition("t", tp.partition, self.next_offset.get(tp.partition, 0)) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False) -> tuple[int, int]:
        return 0, 100

    def memberid(self) -> str:
        return "m"

    def close(self) -> None:
        pass


class _Recorder(ConsumerDriver):
    def __init__(self) -> None:
        super().__init__(
            name="recorder", common=CommonSettings(), settings=LoopSettings(max_batch_ms=10), input_topic="t",
            group_id="g", transactional_id="x",
        )
        self.handled: list[tuple[int, int]] = []

    def handle(self, records: list[Any]) -> None:
        self.handled += [(r.partition(), r.offset()) for r in records]


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> _Consumer:
    fake = _Consumer()
    monkeypatch.setattr(driver, "open_producer", lambda *_args, **_kwargs: object())
    monkeypatch.setattr(driver, "wait_partition_count", lambda *_args, **_kwargs: 4)
    monkeypatch.setattr(driver.clients, "consumer", lambda *_args, **_kwargs: fake)
    return fake


def _eventually(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_partition_assigned_while_paused_is_not_read_until_resumed(consumer: _Consumer) -> None:
    hop = _Recorder()
    hop.pause()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(hop.run()))
    thread.start()
    try:
        _eventually(lambda: consumer.assigned == {0})
        time.sleep(0.2)  # many polls while paused
        assert hop.handled == [] and consumer.paused == {0}
        assert hop.state is LoopState.PAUSED
        hop.resume()
        _eventually(lambda: len(hop.handled) >= 3)
        # Nothing was read (and so skipped) while paused: the hop sees the partition from 0.
        assert hop.handled[:3] == [(0, 0), (0, 1), (0, 2)]
    finally:
        hop.stop()
        thread.join(5)
    assert codes == [EXIT_OK] and hop.state is LoopState.STOPPED


def test_drain_reports_drained_once_nothing_is_taken(consumer: _Consumer) -> None:
    hop = _Recorder()
    thread = threading.Thread(target=hop.run)
    thread.start()
    try:
        _eventually(lambda: len(hop.handled) >= 2)
        assert hop.drain(5.0)
        assert hop.state is LoopState.DRAINED
        taken = len(hop.handled)
        time.sleep(0.2)
        assert len(hop.handled) == taken
    finally:
        hop.stop()
        thread.join(5)


class _Backlog:
    """A consumer holding ``fetched`` records already fetched; records every consume call."""

    def __init__(self, fetched: int) -> None:
        self.fetched = fetched
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[_Record]:
        self.calls.append((num_messages, timeout))
        served = [_Record(0, i) for i in range(min(num_messages, self.fetched))]
        self.fetched -= len(served)
        return served


def _polled(fetched: int, **settings: Any) -> tuple[int, list[tuple[int, float]]]:
    hop = ConsumerDriver(
        name="t", common=CommonSettings(), settings=LoopSettings(**settings), input_topic="t", group_id="g",
        transactional_id="x",
    )
    consumer = _Backlog(fetched)
    hop._consumer = consumer  # type: ignore[assignment]
    return len(hop._poll()), consumer.calls


def test_a_poll_takes_what_was_fetched_at_once_and_lingers_only_after_a_first_record() -> None:
    # Records waiting: taken without a wait, then linger_ms for more up to the bound.
    assert _polled(30, max_batch_records=100, max_batch_ms=100, linger_ms=5) == (30, [(100, 0), (70, 0.005)])
    # A full bound: no linger at all.
    assert _polled(500, max_batch_records=100) == (100, [(100, 0)])
    # Idle: wait up to max_batch_ms for one record, never the whole wait for a full batch.
    assert _polled(0, max_batch_records=100, max_batch_ms=100, linger_ms=5) == (0, [(100, 0), (1, 0.1)])
    # linger 0: what came is the batch.
    assert _polled(3, max_batch_records=100, linger_ms=0) == (3, [(100, 0)])


def test_a_held_hop_reads_nothing_until_its_backpressure_lifts(consumer: _Consumer) -> None:
    """Storm's max.spout.pending for the Kafka source: ``held`` pauses reading like Pause, and
    an operator's Pause still wins over it."""
    hop = _Recorder()
    in_flight = {"trees": 0}
    hop.held = lambda: in_flight["trees"] >= 3
    thread = threading.Thread(target=hop.run)
    thread.start()
    try:
        _eventually(lambda: len(hop.handled) >= 3)
        in_flight["trees"] = 3
        _eventually(lambda: hop.state is LoopState.HELD and consumer.paused == {0})
        taken = len(hop.handled)
        time.sleep(0.2)  # many polls while held
        assert len(hop.handled) == taken
        hop.pause()
        _eventually(lambda: hop.state is LoopState.PAUSED)
        in_flight["trees"] = 0
        time.sleep(0.1)
        assert hop.state is LoopState.PAUSED and len(hop.handled) == taken  # lifted, still paused
        hop.resume()
        _eventually(lambda: len(hop.handled) > taken)
        assert hop.state is LoopState.RUNNING
        offsets = [offset for _partition, offset in hop.handled]
        assert offsets == list(range(len(offsets)))  # nothing skipped while held
    finally:
        hop.stop()
        thread.join(5)
