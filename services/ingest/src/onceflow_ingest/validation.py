"""Boundary checks for client records. Pure: no Kafka, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord

from onceflow_ingest.config import RECORD_ID_MAX_BYTES


@dataclass(frozen=True, slots=True)
class Limits:
    max_payload_bytes: int
    max_key_bytes: int
    max_headers: int = 32
    max_header_key_bytes: int = 256
    max_header_value_bytes: int = 16 * 1024
    # The whole record as ingest will write it: a record Kafka would refuse as too large must
    # be refused here, alone, not fail the group commit it would share with other callers.
    max_record_bytes: int = 512 * 1024


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why one record was refused: ``field`` names the record by index, e.g. records[3].record_id."""

    index: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def check_record(index: int, record: IngestRecord, limits: Limits, field_prefix: str = "records") -> Invalid | None:
    where = f"{field_prefix}[{index}]"
    record_id = record.record_id
    if not record_id:
        return Invalid(index, f"{where}.record_id", "required: the idempotency key (ingest never invents one)")
    if len(record_id) > RECORD_ID_MAX_BYTES:
        return Invalid(index, f"{where}.record_id", f"{len(record_id)} bytes, the limit is {RECORD_ID_MAX_BYTES}")
    try:
        record_id.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Invalid(index, f"{where}.record_id", f"not valid UTF-8 (byte {exc.start})")
    if len(record.payload) > limits.max_payload_bytes:
        return Invalid(index, f"{where}.payload", f"{len(record.payload)} bytes, the limit is {limits.max_payload_bytes}")
    if len(record.key) > limits.max_key_bytes:
        return Invalid(index, f"{where}.key", f"{len(record.key)} bytes, the limit is {limits.max_key_bytes}")
    if record.event_time_ms < 0:
        return Invalid(index, f"{where}.event_time_ms", f"{record.event_time_ms} is negative")
    if len(record.headers) > limits.max_headers:
        return Invalid(index, f"{where}.headers", f"{len(record.headers)} headers, the limit is {limits.max_headers}")
    for name, value in record.headers.items():
        if len(name.encode()) > limits.max_header_key_bytes:
            return Invalid(index, f"{where}.headers", f"a name of {len(name.encode())} bytes, the limit is {limits.max_header_key_bytes}")
        if len(value.encode()) > limits.max_header_value_bytes:
            return Invalid(index, f"{where}.headers[{name!r}]", f"{len(value.encode())} bytes, the limit is {limits.max_header_value_bytes}")
    if (size := record.ByteSize()) > limits.max_record_bytes:
        return Invalid(index, where, f"{size} bytes in all, the limit is {limits.max_record_bytes}")
    return None


def envelope_bytes(record: IngestRecord, ingest_time_ms: int, root_id: int, edge_id: int, attempt: int = 1) -> bytes:
    """A checked record as the serialized first envelope of a new tuple tree.

    IngestRecord shares Envelope's field numbers (see ingest.proto), so the record's own bytes
    followed by the fields ingest adds parse as one Envelope: protobuf merges concatenated
    messages. Much cheaper than building and encoding an Envelope per record.
    """
    added = Envelope(root_id=root_id, edge_id=edge_id, attempt=attempt, ingest_time_ms=ingest_time_ms)
    if not record.event_time_ms:
        added.event_time_ms = ingest_time_ms
    return record.SerializeToString() + added.SerializeToString()
