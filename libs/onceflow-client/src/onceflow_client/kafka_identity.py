"""The record id of a Kafka record copied into onceflow by default (the Kafka source, the Faust
forwarder): where the record lives in the world, the same on every read.

    kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>

- The cluster id tells apart two clusters' topics of the same name.
- The topic id (Kafka's topic UUID, KIP-516) tells apart a topic from an earlier one of the same
  name that was deleted: a recreated topic's offsets start at 0 again, and without the topic id
  its records would carry the old records' ids, which the dedup gate drops as copies.
- Unknown parts (a broker that reports no topic ids, before Kafka 2.8; a forwarder given no
  origin) are written ``-``. A real id is never ``-`` (cluster ids and topic ids are base64), so
  an id with a ``-`` part never equals one without; it only loses what that part tells apart.

A topic name is at most 249 characters, so the full form can pass ingest's 256-byte limit. A
form that would is compacted: each of its three names longer than 64 bytes (in practice the
topic) becomes its first 40 bytes, ``~`` and 24 hex digits (96 bits) of its SHA-256, which keeps
any id within 236 bytes. ``~`` is allowed in none of these names, so a compacted name never
equals a real one, and the hash keeps it unique. Pure: no Kafka client needed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

RECORD_ID_MAX_BYTES = 256  # ingest's limit (onceflow.spout.RECORD_ID_MAX_BYTES)
UNKNOWN = "-"
SCHEME = "kafka://"
_LONG = 64  # bytes: a longer name is compacted when the whole id is over the limit
_KEEP = 40


@dataclass(frozen=True, slots=True)
class KafkaOrigin:
    """Where a topic's records come from: its cluster's id and its own id ("" if unknown)."""

    cluster_id: str
    topic_id: str = ""

    @property
    def complete(self) -> bool:
        return bool(self.cluster_id and self.topic_id)


def _compacted(part: str) -> str:
    raw = part.encode()
    if len(raw) <= _LONG:
        return part
    return f"{raw[:_KEEP].decode(errors='ignore')}~{hashlib.sha256(raw).hexdigest()[:24]}"


def kafka_record_id(origin: KafkaOrigin, topic: str, partition: int, offset: int) -> str:
    """The default record id of the record at ``offset`` of ``topic``'s ``partition``: at most
    256 bytes whatever the topic's name."""
    cluster, topic_id = origin.cluster_id or UNKNOWN, origin.topic_id or UNKNOWN
    tail = f"/{topic_id}/{partition}/{offset}"
    full = f"{SCHEME}{cluster}/{topic}{tail}"
    if len(full.encode()) <= RECORD_ID_MAX_BYTES:
        return full
    return f"{SCHEME}{_compacted(cluster)}/{_compacted(topic)}/{_compacted(topic_id)}/{partition}/{offset}"
