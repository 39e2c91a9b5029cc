"""A user's Kafka record as an onceflow record, or the reason it cannot be one. Pure: no Kafka.

record_id is by default the record's place in the world,
``kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>`` (``onceflow_client.kafka_identity``):
two records with the same payload at different offsets are two records, a record read again after
a crash is the same one, and a topic deleted and created again under its name (a new topic id),
or a same-named topic of another cluster, is another topic. With an id field, record_id is that
field of the JSON value (a dotted path reaches into nested objects), as given, and records
sharing it are copies of one record (the gate keeps the first)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from onceflow.spout import Limits, check_record
from onceflow_client.kafka_identity import KafkaOrigin, kafka_record_id
from onceflow.v1.ingest_pb2 import IngestRecord


class Unmappable(Exception):
    """A record that goes to source.dlq; the subclass names the reason class."""


class Unparsable(Unmappable):
    """The id field was asked for, and the value is not a JSON object."""


class NoIdField(Unmappable):
    """The value has no usable id field."""


class OverLimit(Unmappable):
    """The record breaks one of the limits ingest applies (payload, key, headers, record size)."""


class MappingFailed(Unmappable):
    """Anything else the mapping raised on this record. A record's bytes are the user's: whatever
    they make the mapping do is that record's fault, and retrying the batch would fail on it again
    forever (a stalled source), so it is a dead letter naming the exception (issue 39)."""


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """What the mapping needs of a consumed message (a confluent_kafka Message has all of it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int = 0  # 0: none (the record then takes ingest time)


@dataclass(frozen=True, slots=True)
class Mapping:
    limits: Limits
    id_field: str = ""  # "": the record's place, kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>
    origin: KafkaOrigin = KafkaOrigin("")  # the topic's cluster id and topic id ("": unknown, written "-")
    stream: str = ""  # the stream every copied record belongs to ("": the default)
    producer: str = ""  # the producer every copied record is from ("": none; docs/decisions/0027)


def default_record_id(origin: KafkaOrigin, topic: str, partition: int, offset: int) -> str:
    return kafka_record_id(origin, topic, partition, offset)


def record_id_of(record: SourceRecord, id_field: str, origin: KafkaOrigin = KafkaOrigin("")) -> str:
    if not id_field:
        return default_record_id(origin, record.topic, record.partition, record.offset)
    try:
        value = json.loads(record.value) if record.value is not None else None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: b"[" * 100000
        raise Unparsable(f"the value is not JSON ({exc}), so it has no id field {id_field!r}") from None
    if not isinstance(value, dict):
        raise Unparsable(f"the value is {'empty' if value is None else type(value).__name__}, not a JSON object, "
                         f"so it has no id field {id_field!r}")
    found: object = value
    for part in id_field.split("."):
        if not isinstance(found, dict) or part not in found:
            raise NoIdField(f"no id field {id_field!r}")
        found = found[part]
    if isinstance(found, bool) or not isinstance(found, str | int):
        raise NoIdField(f"id field {id_field!r} is {json.dumps(found)[:80]}, not a string or an integer")
    if found == "":
        raise NoIdField(f"id field {id_field!r} is empty")
    return str(found)


def _headers(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str]:
    out = {}
    for name, value in headers:
        try:
            out[name] = (value or b"").decode("utf-8")
        except UnicodeDecodeError as exc:
            raise OverLimit(f"header {name!r} is not UTF-8 (byte {exc.start}); onceflow headers are text") from None
    return out


def map_record(record: SourceRecord, mapping: Mapping) -> IngestRecord:
    """The record as ingest would take it from a client, checked with ingest's limits; raises
    an ``Unmappable`` subclass with the reason otherwise, whatever went wrong."""
    try:
        return _mapped(record, mapping)
    except Unmappable:
        raise
    except Exception as exc:  # noqa: BLE001 - see MappingFailed: one record's failure, never the batch's
        raise MappingFailed(f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def _mapped(record: SourceRecord, mapping: Mapping) -> IngestRecord:
    record_id = record_id_of(record, mapping.id_field, mapping.origin)
    mapped = IngestRecord(
        record_id=record_id.encode(),
        key=record.key or b"",
        payload=record.value or b"",
        headers=_headers(record.headers),
        event_time_ms=max(record.timestamp_ms, 0),
        stream=mapping.stream.encode(),
    )
    invalid = check_record(0, mapped, mapping.limits, field_prefix="record")
    if invalid is not None:
        field = invalid.field.removeprefix("record[0]").lstrip(".") or "record"
        raise OverLimit(f"{field}: {invalid.message}")
    return mapped
