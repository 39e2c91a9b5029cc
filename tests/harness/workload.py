"""Generated inputs for tests: envelopes written straight to a topic, and ingest records."""

from __future__ import annotations

import random
from dataclasses import dataclass

from confluent_kafka import Producer

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord


@dataclass(frozen=True)
class Item:
    record_id: str
    key: bytes


def items(prefix: str, count: int, keys: int = 20, seed: int = 0) -> list[Item]:
    rng = random.Random(seed)
    return [Item(f"{prefix}-{i}", f"k{rng.randrange(keys)}".encode()) for i in range(count)]


def produce_envelopes(common: CommonSettings, topic: str, batch: list[Item], poison: list[bytes] = ()) -> None:
    """Write envelopes keyed by record_id (as ingest does), plus raw poison values."""
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for item in batch:
        envelope = Envelope(
            record_id=item.record_id, root_id=new_id(), edge_id=new_id(), attempt=1,
            event_time_ms=now_ms(), ingest_time_ms=now_ms(), key=item.key, payload=b"x",
        )
        producer.produce(topic, encode_envelope(envelope), key=item.record_id.encode())
    for value in poison:
        producer.produce(topic, value, key=b"poison")
    assert producer.flush(60) == 0


def ingest_records(batch: list[Item], payload_bytes: int = 100) -> list[IngestRecord]:
    return [IngestRecord(record_id=i.record_id.encode(), key=i.key, payload=b"p" * payload_bytes) for i in batch]
