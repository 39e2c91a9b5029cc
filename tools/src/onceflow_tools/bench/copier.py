"""The ceiling for one transactional hop: consume -> produce -> send_offsets -> commit, nothing
else (no decoding, no state, no acks), with the batch bounds of the shared loop.

Run as its own process by ``onceflow bench``:
``python -m onceflow_tools.bench.copier INPUT OUTPUT GROUP TRANSACTIONAL_ID``"""

from __future__ import annotations

import signal
import sys
import threading

from confluent_kafka import Consumer, Producer, TopicPartition

from onceflow.config import CommonSettings, LoopSettings
from onceflow.kafka.clients import TRANSACTION_RETRY_BACKOFF_MS, plain_config
from onceflow.kafka.records import offset_of, partition_of


def copy(common: CommonSettings, loop: LoopSettings, source: str, target: str, group: str, transactional_id: str,
         stop: threading.Event) -> int:
    """Copy until ``stop``; the records copied."""
    consumer = Consumer({
        **plain_config(common.kafka_bootstrap), "group.id": group, "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })
    producer = Producer({
        **plain_config(common.kafka_bootstrap), "transactional.id": transactional_id,
        "transaction.timeout.ms": common.transaction_timeout_ms, "linger.ms": 5,
        "retry.backoff.ms": TRANSACTION_RETRY_BACKOFF_MS,  # as the services' producers
    })
    producer.init_transactions(30)
    consumer.subscribe([source])
    copied = 0
    try:
        while not stop.is_set():
            messages = [m for m in consumer.consume(loop.max_batch_records, loop.max_batch_ms / 1000) if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            positions: dict[int, int] = {}
            for message in messages:
                producer.produce(target, message.value(), key=message.key())
                positions[partition_of(message)] = offset_of(message) + 1
            offsets = [TopicPartition(source, partition, offset) for partition, offset in positions.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            copied += len(messages)
    finally:
        consumer.close()
    return copied


def main() -> None:
    source, target, group, transactional_id = sys.argv[1:5]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    copy(CommonSettings(), LoopSettings(), source, target, group, transactional_id, stop)


if __name__ == "__main__":
    main()
