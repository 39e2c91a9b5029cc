"""A restore must not stop at a last stable offset held back by someone else's open
transaction: records committed after it would be missing from the store while the input offsets
committed with them are not (pure logic: a scripted read_committed reader, no broker)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from onceflow.config import CommonSettings
from onceflow.state import stores as stores_module
from onceflow.state.store import MemoryStore
from onceflow.topology import Topic, job_topic

TOPIC = job_topic(Topic.COMPUTE_CHANGELOG, "nexmark_q7")
KEY = b"nexmark_q7\x00all"


def _record(offset: int, value: bytes) -> Message:
    return Message(topic=TOPIC, partition=1, offset=offset, key=KEY, value=value)


def _eof(offset: int) -> Message:
    return Message(topic=TOPIC, partition=1, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


class ScriptedReader:
    """Changelog partition 1: offset 0, our key at v1 (committed); offset 1, another
    producer's record (a kill -9'd worker's) in a transaction still open (the stable end is 1); offset 2, our key at v2, committed
    by the previous owner with its input offsets; high watermark 3. The first fetch ends at the
    stable end (EOF at 1), as librdkafka's does; once the other transaction is aborted (its
    marker at 3), v2 and EOF at 4."""

    def __init__(self) -> None:
        self.fetches = [[_record(0, b"v1"), _eof(1)], [], [_record(2, b"v2"), _eof(4)]]
        self.high = 3

    def assign(self, _assignment: object) -> None: ...

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if not self.fetches:
            return []
        batch = self.fetches.pop(0)
        if not self.fetches:
            self.high = 4
        return batch

    def get_watermark_offsets(self, _tp: object, cached: bool = False) -> tuple[int, int]:
        return 0, self.high

    def close(self) -> None: ...


def test_a_restore_reads_past_a_stable_end_held_back_by_an_open_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stores_module.clients, "reader", lambda _common, **_kw: ScriptedReader())
    stores = stores_module.PartitionStores(CommonSettings(), TOPIC, lambda _p: MemoryStore(), restore_timeout_s=5.0)
    stores.assign([1])
    assert stores[1].get(KEY) == b"v2"  # the previous owner's last committed value, not an older one
    assert stores[1].checkpoint == 3
