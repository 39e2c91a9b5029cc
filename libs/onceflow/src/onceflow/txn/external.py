"""An intake on another Kafka cluster, exactly once (docs/decisions/0017-sources-on-another-cluster.md).

The consumed offsets of a topic on another cluster cannot join a transaction of the pipeline's
cluster, so they are not kept there as group offsets: the positions go, as records of a compacted
topic of the pipeline's cluster (``source.offsets``), into the same transaction as the batch's
outputs, as Kafka Connect's exactly-once sources do. The consumer joins no group: it assigns the
topic's partitions itself, at the positions read back from that topic. It opens only after the
hop's producer is initialised, so a zombie with the same transactional.id is fenced and its open
transaction aborted before the positions are read: they are then exactly what has committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka.inspect import end_offsets, latest_by_key, read_committed
from onceflow.txn.driver import Rebalance
from onceflow.txn.errors import ConsumerStuck
from onceflow.txn.producer import TransactionalProducer

log = logging.getLogger(__name__)
_METADATA_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ExternalTopic:
    """A topic on another cluster: where it is, and that cluster's id (part of every position's
    key, so two clusters' topics of the same name never share positions)."""

    bootstrap: str
    topic: str
    cluster_id: str

    def position_key(self, partition: int) -> bytes:
        # Topic names cannot hold '/', and cluster ids are URL-safe base64: the key is unambiguous.
        return f"{self.cluster_id}/{self.topic}/{partition}".encode()


def read_positions(common: CommonSettings, positions_topic: str, source: ExternalTopic,
                   stop: threading.Event | None = None, timeout_s: float = 120.0) -> dict[int, int]:
    """partition -> the committed next offset of ``source``, from ``positions_topic``."""
    return {p: offset for p, (offset, _metadata) in read_stored(common, positions_topic, source, stop, timeout_s).items()}


def read_stored(common: CommonSettings, positions_topic: str, source: ExternalTopic,
                stop: threading.Event | None = None, timeout_s: float = 120.0) -> dict[int, tuple[int, str]]:
    """partition -> (the committed next offset of ``source``, its metadata), from ``positions_topic``.

    Read to the high watermark seen at the call, not only to the last stable offset: another
    writer's open transaction holds the LSO back, and records of ours committed after its start
    would be missed. Every transaction open at the call ends (commits, aborts, or times out), so
    the LSO reaches that mark in at most a transaction timeout."""
    deadline = time.monotonic() + timeout_s
    mark = {p: high for p, (_lso, high) in end_offsets(common, positions_topic).items()}
    while any(lso < mark[p] for p, (lso, _high) in end_offsets(common, positions_topic).items()):
        if time.monotonic() > deadline:
            raise ConsumerStuck(f"{positions_topic}: transactions still open after {timeout_s:.0f} s")
        if stop is not None and stop.wait(0.2):
            return {}
        if stop is None:
            time.sleep(0.2)
    ours = source.position_key(0)[:-1]
    return {
        int(key[len(ours):]): _position(value)
        for (_partition, key), value in latest_by_key(read_committed(common, positions_topic)).items()
        if key.startswith(ours)
    }


def _position(value: bytes) -> tuple[int, str]:
    """A position record's value: the offset, then optionally a space and its metadata (the
    source's topic id, for instance; like a group offset's commit metadata)."""
    offset, _, metadata = value.decode().partition(" ")
    return int(offset), metadata


def partition_count(consumer: Consumer, topic: str) -> int:
    try:
        metadata = consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException as exc:
        raise ConsumerStuck(f"the source cluster does not answer for {topic}: {exc}") from None
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise ConsumerStuck(f"topic {topic} is not on the source cluster ({metadata and metadata.error})")
    return len(metadata.partitions)


def source_config(common: CommonSettings, source: ExternalTopic, **overrides: Any) -> dict[str, Any]:
    """A read_committed consumer of the other cluster (its security settings: the pipeline's).
    Its group id is never used for offsets or membership: it only assigns."""
    return {
        "bootstrap.servers": source.bootstrap,
        "group.id": "onceflow-source-unused",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **common.kafka_client_config(),
        **overrides,
    }


class ExternalIntake:
    """Every partition of ``source.topic``, assigned by hand; positions in ``positions_topic``
    (one partition, compacted), written in the hop's transaction."""

    def __init__(self, common: CommonSettings, source: ExternalTopic, positions_topic: str) -> None:
        self._common = common
        self.source = source
        self._positions_topic = positions_topic

    def open(self, overrides: dict[str, Any], on_assign: Rebalance, on_revoke: Rebalance) -> Consumer:
        consumer = Consumer(source_config(self._common, self.source, **overrides))
        count = partition_count(consumer, self.source.topic)
        positions = read_stored(self._common, self._positions_topic, self.source)
        log.info("%s: %d partitions, resuming at %s", self.source.topic, count,
                 {p: offset for p, (offset, _metadata) in positions.items()})
        on_assign(consumer, self._at(positions, range(count)))
        return consumer

    def observe(self, consumer: Consumer) -> None:
        """No group to fall out of: the assignment is static."""

    def send(self, producer: TransactionalProducer, consumer: Consumer, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            value = f"{tp.offset} {tp.metadata}" if tp.metadata else str(tp.offset)
            producer.produce(self._positions_topic, value.encode(), self.source.position_key(tp.partition), 0)

    def committed(
        self, consumer: Consumer, partitions: list[TopicPartition], stop: threading.Event
    ) -> list[TopicPartition] | None:
        positions = read_stored(self._common, self._positions_topic, self.source, stop)
        if stop.is_set():
            return None
        return self._at(positions, [tp.partition for tp in partitions])

    def _at(self, positions: dict[int, tuple[int, str]], partitions: Iterable[int]) -> list[TopicPartition]:
        return [TopicPartition(self.source.topic, p, *positions.get(p, (OFFSET_BEGINNING, ""))) for p in partitions]
