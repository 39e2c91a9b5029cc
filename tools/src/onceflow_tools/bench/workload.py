"""The keyed-count workload (``onceflow_tools.workloads.usersum``) as every contender of ``onceflow
bench`` reads it: records ``{"user": "u<k>", "amount": n}`` counted and summed per user.

One generator, three encodings: onceflow envelopes for a hop's input topic, plain JSON for the
peers (which have no envelope), and ``IngestRecord``s for clients of ingest."""

from __future__ import annotations

import json
from collections.abc import Iterator

from confluent_kafka import Producer

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings
from onceflow.kafka.clients import plain_config
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import JOB, KeyedRecord, records

__all__ = ["JOB", "KeyedRecord", "envelope", "ingest_records", "peer_json", "records", "write_backlog"]


def ingest_records(count: int, users: int, id_prefix: str, seed: int = 1) -> list[IngestRecord]:
    return usersum.ingest_records(records(count, users, id_prefix, seed))


def envelope(record: KeyedRecord) -> bytes:
    now = now_ms()
    return encode_envelope(Envelope(
        record_id=record.record_id, root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=now,
        ingest_time_ms=now, key=record.user.encode(), payload=record.payload,
    ))


def peer_json(record: KeyedRecord) -> bytes:
    """What the peers read: the same fields, as a JSON object."""
    return json.dumps(
        {"record_id": record.record_id, "user": record.user, "amount": record.amount, "ingest_time_ms": now_ms()}
    ).encode()


def write_backlog(common: CommonSettings, topic: str, values: Iterator[tuple[bytes, bytes]]) -> int:
    """(key, value) pairs into ``topic`` with a plain idempotent producer (no transaction, so the
    topic's end offset is its last record's + 1: a consumer group that read everything commits
    exactly that); the count written."""
    producer = Producer({**plain_config(common.kafka_bootstrap), "enable.idempotence": True, "linger.ms": 20})
    written = 0
    for key, value in values:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        written += 1
    if producer.flush(120):
        raise RuntimeError(f"backlog for {topic} not delivered within 120 s")
    return written
