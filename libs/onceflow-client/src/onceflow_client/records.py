"""What a client may send: an IngestRecord, a dict, or the JSON bytes of one. A dict has
``record_id`` (the id the gate deduplicates on: the same record sent again must carry the same
one), and optionally ``key``, ``payload``, ``event_time_ms``, ``headers`` and ``stream`` (the
named stream it belongs to; docs/decisions/0025). A payload that is a
dict or list is sent as JSON; one that is a str, as its UTF-8."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Union

from onceflow.v1.ingest_pb2 import IngestRecord

RecordLike = Union[IngestRecord, Mapping[str, Any], bytes]
_FIELDS = {"record_id", "key", "payload", "event_time_ms", "headers", "stream"}


def _bytes(name: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if name == "payload" and isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":")).encode()
    raise TypeError(f"{name}: want str or bytes{' (or a dict or list, sent as JSON)' if name == 'payload' else ''}, got {type(value).__name__}")


def to_record(value: RecordLike, stream: str = "") -> IngestRecord:
    """One record to send, in ``stream`` unless it names its own; raises TypeError or ValueError
    naming the field that is wrong."""
    if isinstance(value, IngestRecord):
        if stream and not value.stream:
            named = IngestRecord()
            named.CopyFrom(value)
            named.stream = stream.encode()
            return named
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON record: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("a JSON record is an object with record_id, key, payload, ...")
    if not isinstance(value, Mapping):
        raise TypeError(f"a record is an IngestRecord, a dict or JSON bytes, not {type(value).__name__}")
    unknown = set(value) - _FIELDS
    if unknown:
        raise ValueError(f"unknown record fields {sorted(unknown)}: want {sorted(_FIELDS)}")
    if "record_id" not in value:
        raise ValueError("record_id: missing; the gate deduplicates on it, so a re-sent record must carry the same one")
    headers = value.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise TypeError("headers: want a dict of str to str")
    event_time = value.get("event_time_ms", 0)
    if not isinstance(event_time, int) or isinstance(event_time, bool):
        raise TypeError(f"event_time_ms: want an int (ms since the epoch), got {type(event_time).__name__}")
    return IngestRecord(
        record_id=_bytes("record_id", value["record_id"]),
        key=_bytes("key", value.get("key", b"")),
        payload=_bytes("payload", value.get("payload", b"")),
        event_time_ms=event_time,
        headers=dict(headers),
        stream=_bytes("stream", value.get("stream") or stream),
    )
