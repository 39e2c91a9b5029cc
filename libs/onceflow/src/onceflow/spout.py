"""How a record enters the pipeline, for every spout (ingest's gRPC calls, the Kafka source):
checked against the same limits, wrapped in the first envelope of a new tuple tree, and written
to ``ingest.records`` keyed by record_id, with, when acking is on, the INIT that starts its tree
and names where the record landed (the replayer reads it back from there).

Pure but for ``produce_new_records``, which writes inside the caller's open transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from confluent_kafka import KafkaError, Message

from onceflow import acks, streams
from onceflow.codec import new_id
from onceflow.kafka.records import offset_of, partition_of
from onceflow.v1.acker_pb2 import RecordRef
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord

if TYPE_CHECKING:  # the loop imports this module, and txn imports the loop
    from onceflow.txn.producer import TransactionalProducer

RECORD_ID_MAX_BYTES = 256  # part of the contract (docs/services/ingest.md), not a tunable


@dataclass(frozen=True, slots=True)
class Limits:
    max_payload_bytes: int
    max_key_bytes: int
    max_headers: int = 32
    max_header_key_bytes: int = 256
    max_header_value_bytes: int = 16 * 1024
    # The whole record as it will be written: a record Kafka would refuse as too large must
    # be refused alone, not fail the transaction it would share with other records.
    max_record_bytes: int = 512 * 1024
    # Event time at most this far ahead of the taking clock (ONCEFLOW_EVENT_TIME_MAX_AHEAD_MS).
    max_event_time_ahead_ms: int = 3_600_000


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why one record was refused: ``field`` names the record by index, e.g. records[3].record_id."""

    index: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    @property
    def kind(self) -> str:
        """The field's name without its index or key (``headers``, ``record_id``; ``record``
        for the whole record): a metric label whose values are bounded, whatever header names
        a caller makes up (issue 39)."""
        rest = self.field.split("].", 1)[1] if "]." in self.field else "record"
        return rest.split("[", 1)[0]


def check_record(
    index: int, record: IngestRecord, limits: Limits, field_prefix: str = "records", now_ms: int | None = None,
    stream_exists: Callable[[str], bool] | None = None, redrive: bool = False,
) -> Invalid | None:
    """Why ``record`` cannot be taken, or None. ``now_ms``: the taking clock, against which the
    event time is bounded (None: not checked). ``stream_exists``: whether a stream exists (None:
    not checked; a spout whose stream is a setting checks it once, at start). ``redrive``: the
    record may carry the redrive fields (only `onceflow dlq redrive` sets them)."""
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
    if b"\x00" in record_id:
        # The gate's key for a named stream's record is "stream NUL record_id" (onceflow.streams).
        return Invalid(index, f"{where}.record_id", f"holds a NUL byte (at byte {record_id.index(0)}), which is reserved")
    if record.stream and not streams.STREAM_NAME.fullmatch(record.stream.decode("ascii", "replace")):
        return Invalid(index, f"{where}.stream", f"{record.stream[:120]!r}: 1 to 100 of A-Z, a-z, 0-9, '_' and '-'")
    if record.producer and not redrive:
        return Invalid(index, f"{where}.producer", "set by ingest from the caller's credential, never by a client")
    if not redrive and (record.redrive_job or record.redrive_count):
        field = "redrive_job" if record.redrive_job else "redrive_count"
        return Invalid(index, f"{where}.{field}", "set only by `onceflow dlq redrive`, never by a client")
    if stream_exists is not None and not stream_exists(record.stream.decode()):
        return Invalid(index, f"{where}.stream", streams.missing_stream(record.stream.decode()))
    if len(record.payload) > limits.max_payload_bytes:
        return Invalid(index, f"{where}.payload", f"{len(record.payload)} bytes, the limit is {limits.max_payload_bytes}")
    if len(record.key) > limits.max_key_bytes:
        return Invalid(index, f"{where}.key", f"{len(record.key)} bytes, the limit is {limits.max_key_bytes}")
    if record.event_time_ms < 0:
        return Invalid(index, f"{where}.event_time_ms", f"{record.event_time_ms} is negative")
    if now_ms is not None and record.event_time_ms > now_ms + limits.max_event_time_ahead_ms:
        return Invalid(index, f"{where}.event_time_ms", event_time_ahead(record.event_time_ms, now_ms, limits.max_event_time_ahead_ms))
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


def event_time_ahead(event_time_ms: int, now_ms: int, limit_ms: int) -> str:
    """The reason a record from the future is refused, wherever it is."""
    return (
        f"{event_time_ms} is {event_time_ms - now_ms} ms ahead of the clock taking it in, the limit is {limit_ms} "
        f"(ONCEFLOW_EVENT_TIME_MAX_AHEAD_MS): it would hold every windowed job's watermark there"
    )


def envelope_bytes(
    record: IngestRecord, ingest_time_ms: int, root_id: int, edge_id: int, attempt: int = 1, producer: str = ""
) -> bytes:
    """A checked record as the serialized first envelope of a new tuple tree.

    IngestRecord shares Envelope's field numbers (see ingest.proto), so the record's own bytes
    followed by the fields ingest adds parse as one Envelope: protobuf merges concatenated
    messages. Much cheaper than building and encoding an Envelope per record. ``producer``: the
    caller's, from its credential (docs/decisions/0027). The caller strips the record's unknown
    fields first (``IngestRequest.DiscardUnknownFields``): they would pass into the envelope.
    """
    added = Envelope(root_id=root_id, edge_id=edge_id, attempt=attempt, ingest_time_ms=ingest_time_ms, producer=producer)
    if not record.event_time_ms:
        added.event_time_ms = ingest_time_ms
    return record.SerializeToString() + added.SerializeToString()


class NewRecord(NamedTuple):
    """A checked record ready for ``ingest.records``: its Kafka key and first envelope, and the
    ids of the tree it starts."""

    record_id: bytes
    envelope: bytes
    root_id: int
    edge_id: int


def new_record(record: IngestRecord, ingest_time_ms: int, producer: str = "") -> NewRecord:
    """The record as the root of a fresh tree (random root and edge ids, attempt 1)."""
    root_id, edge_id = new_id(), new_id()
    return NewRecord(record.record_id, envelope_bytes(record, ingest_time_ms, root_id, edge_id, producer=producer), root_id, edge_id)


@dataclass(frozen=True, slots=True)
class Inits:
    """Where INITs go (acking on): ``acker.acks`` and its partition count, and the trees' timeout."""

    acks_topic: str
    acks_partitions: int
    timeout_ms: int


def produce_new_records(producer: TransactionalProducer, topic: str, records: Iterable[NewRecord], inits: Inits | None) -> None:
    """Write records to ``topic`` (``ingest.records``) inside the caller's open transaction;
    with ``inits``, each one's INIT too. An INIT names where its record lives (for replays), so
    the records are delivered first (flush, still inside the transaction) and their offsets go
    into the INITs. A record not delivered aborts the transaction."""
    records = list(records)
    if inits is None:
        for record in records:
            producer.produce(topic, record.envelope, key=record.record_id)
        return
    origins: list[tuple[int, int] | None] = [None] * len(records)

    def delivered(index: int) -> Callable[[KafkaError | None, Message], None]:
        def callback(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                origins[index] = (partition_of(msg), offset_of(msg))

        return callback

    for index, record in enumerate(records):
        producer.produce(topic, record.envelope, key=record.record_id, on_delivery=delivered(index))
    producer.flush()
    buffer = acks.AckBuffer(inits.acks_partitions)
    for record, origin in zip(records, origins, strict=True):
        if origin is None:
            raise producer.abortable("a record was not delivered inside the transaction")
        ref = RecordRef(record_id=record.record_id.decode(), topic=topic, partition=origin[0], offset=origin[1])
        buffer.add(acks.init(record.root_id, [record.edge_id], ref, attempt=1, timeout_ms=inits.timeout_ms))
    for partition, value in buffer.seal():
        producer.produce(inits.acks_topic, value, partition=partition)
