"""Where a fault on a replicated Kafka cluster hurts a running pipeline: the brokers leading the
partitions it writes, and those coordinating its open transactions. Read from the cluster
itself (metadata, and the keys of ``__transaction_state``), never from naming conventions."""

from __future__ import annotations

import struct
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

TRANSACTION_STATE = "__transaction_state"


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def partition_leaders(bootstrap: str, topic_prefix: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the id of the broker leading it, for every topic of ``topic_prefix``
    that has a leader right now."""
    topics = _admin(bootstrap).list_topics(timeout=10).topics
    return {
        (name, partition.id): partition.leader
        for name, topic in topics.items()
        if name.startswith(topic_prefix)
        for partition in topic.partitions.values()
        if partition.leader >= 0
    }


def transactional_id_of(key: bytes | None) -> str | None:
    """A ``__transaction_state`` record key: version (int16), then the transactional.id as a
    length-prefixed (int16) UTF-8 string."""
    if key is None or len(key) < 4:
        return None
    (length,) = struct.unpack_from(">h", key, 2)
    if length < 0 or len(key) < 4 + length:
        return None
    return key[4 : 4 + length].decode("utf-8", errors="replace")


def coordinators(bootstrap: str, id_prefix: str, tail: int = 200, timeout_s: float = 10.0) -> dict[str, int]:
    """transactional.id -> the broker coordinating it, for the ids starting with ``id_prefix``
    that wrote transaction state lately (the last ``tail`` records of each partition)."""
    state = _admin(bootstrap).list_topics(TRANSACTION_STATE, timeout=10).topics.get(TRANSACTION_STATE)
    if state is None or state.error is not None:
        return {}
    leaders = {p.id: p.leader for p in state.partitions.values()}
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "onceflow-verify-coordinators", "enable.auto.commit": False,
        "log_level": 3,
    })
    found: dict[str, int] = {}
    try:
        ends: dict[int, int] = {}
        starts = []
        for partition in leaders:
            low, high = consumer.get_watermark_offsets(TopicPartition(TRANSACTION_STATE, partition), timeout=5)
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(TRANSACTION_STATE, partition, max(low, high - tail)))
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            txn_id = transactional_id_of(message.key())
            if txn_id is not None and txn_id.startswith(id_prefix) and leaders[message.partition()] >= 0:
                found[txn_id] = leaders[message.partition()]
            if message.offset() + 1 >= ends.get(message.partition(), 0):
                ends.pop(message.partition(), None)
    finally:
        consumer.close()
    return found


def under_replicated(bootstrap: str) -> int:
    """Partitions with fewer replicas in sync than assigned, or with no leader."""
    topics = _admin(bootstrap).list_topics(timeout=10).topics
    return sum(
        1 for topic in topics.values() for p in topic.partitions.values() if p.leader < 0 or len(p.isrs) < len(p.replicas)
    )


def wait_fully_replicated(bootstrap: str, timeout_s: float = 120.0) -> None:
    """Until every partition has all its replicas in sync again: a rolling restart that moves
    on earlier takes a partition below min.insync.replicas on purpose."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if under_replicated(bootstrap) == 0:
                return
        except Exception:  # noqa: BLE001 - metadata unanswered mid-election
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions still under-replicated {timeout_s:.0f} s after a restart")
        time.sleep(0.5)
