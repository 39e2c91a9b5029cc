"""Reading dead letters: ``DeadLetters`` lists, fetches and follows the pipeline's dead-letter
topics (read_committed, so only letters whose transaction committed). Each value there is an
``onceflow.v1.envelope_pb2.DeadLetter``: the stage, the error class, the message and the
original record. ``Letter`` decodes that original where it can (an envelope, a compute partial,
a result change) and says which record and which job it was. The CLI's ``onceflow dlq`` is a
shell over this module. Needs the ``tail`` extra (confluent-kafka).

The decoding and the filter are pure (``Letter.of``, ``LetterFilter``): no broker needed."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message

from onceflow.v1.compute_pb2 import PartialAggregate
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow.v1.results_pb2 import ResultChange
from onceflow_client.topics import Topic

# Every topic a stage writes DeadLetter values to, before ONCEFLOW_TOPIC_PREFIX (the same as
# onceflow.topology.DLQS plus compute.late, the too-late records of windowed jobs; a test in
# tests/test_dlq.py keeps the two in step).
DLQ_TOPICS: tuple[str, ...] = tuple(
    str(t) for t in (
        Topic.INGEST_DLQ, Topic.SOURCE_DLQ, Topic.DEDUP_DLQ, Topic.COMPUTE_DLQ, Topic.COMPUTE_LATE, Topic.SINK_DLQ,
        Topic.ACKER_DLQ,
    )
)
# The map hop names the job in the reasons it writes ("job wordcount failed on this record: ...",
# "late: job q8: ..."); the merge hop's original names it in its PartialAggregate.
_JOB_IN_MESSAGE = re.compile(r"(?:^|late: )job ([A-Za-z0-9_-]+)\b")
_PARTIALS_TOPIC = re.compile(r"compute\.partials\.([A-Za-z0-9_-]+)$")


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - the extra is not installed
        raise ImportError("DeadLetters reads Kafka: install onceflow-client[tail] (confluent-kafka)") from None
    return confluent_kafka


def _text(value: bytes) -> str:
    """UTF-8 text where it is, else hex (a payload is the user's bytes)."""
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()


def decode_original(letter: DeadLetter) -> Envelope | PartialAggregate | ResultChange | None:
    """The letter's original record, decoded by the stage that wrote it: the merge hop's is a
    PartialAggregate, the sink's a ResultChange, the source's the user's raw value (None: not
    ours to decode), the acker's an undecodable batch (None); any other stage's an Envelope.
    None too when the bytes are not what the stage should have written (that may be the very
    reason the record is a letter)."""
    kind: type[Envelope] | type[PartialAggregate] | type[ResultChange]
    if letter.stage in ("source", "acker") or not letter.original:
        return None
    if letter.stage == "compute-merge" or _PARTIALS_TOPIC.search(letter.source_topic):
        kind = PartialAggregate
    elif letter.stage == "sink":
        kind = ResultChange
    else:
        kind = Envelope
    try:
        message = kind.FromString(letter.original)
    except DecodeError:
        return None
    if isinstance(message, Envelope) and not message.record_id:
        return None  # every envelope has one: these bytes only happened to parse
    return message


def _canonical_stream(stream: str) -> str:
    return "" if stream in ("", "default") else stream


@dataclass(frozen=True)
class Letter:
    """One dead letter where it was read: ``topic`` without the prefix, its partition and offset."""

    topic: str
    partition: int
    offset: int
    letter: DeadLetter
    original: Envelope | PartialAggregate | ResultChange | None

    @classmethod
    def of(cls, topic: str, partition: int, offset: int, value: bytes) -> Letter:
        letter = DeadLetter.FromString(value)
        return cls(topic, partition, offset, letter, decode_original(letter))

    @property
    def stage(self) -> str:
        return self.letter.stage

    @property
    def error_class(self) -> str:
        return self.letter.error_class

    @property
    def message(self) -> str:
        return self.letter.message

    @property
    def failed_at_ms(self) -> int:
        return self.letter.failed_at_ms

    @property
    def record_id(self) -> str | None:
        """The record's idempotency key when the original is an envelope; None otherwise (a
        source letter's original is the user's raw value, a merge letter's a partial of many)."""
        return self.original.record_id if isinstance(self.original, Envelope) else None

    @property
    def job(self) -> str | None:
        """The compute job the letter is of, where it says: the merge hop's partial, the sink's
        result change, the partials topic it came from, or the map hop's reason."""
        if self.letter.job:
            return self.letter.job
        if isinstance(self.original, PartialAggregate | ResultChange) and self.original.job:
            return self.original.job
        topic = _PARTIALS_TOPIC.search(self.letter.source_topic)
        if topic:
            return topic.group(1)
        match = _JOB_IN_MESSAGE.search(self.letter.message)
        return match.group(1) if match else None

    @property
    def stream(self) -> str | None:
        """The stream of the record it holds ("" for the default stream); None without a record."""
        return _canonical_stream(self.original.stream) if isinstance(self.original, Envelope) else None

    @property
    def reason(self) -> str:
        """What letters are counted by: the stage and the error class."""
        return f"{self.stage}: {self.error_class}"

    def original_dict(self) -> dict[str, Any]:
        """The original record for people and JSON: decoded fields, bytes as text where they
        are UTF-8 (else hex), the raw value when it is not ours to decode."""
        original = self.original
        if isinstance(original, Envelope):
            return {
                "type": "Envelope",
                "record_id": original.record_id,
                "attempt": original.attempt,
                "root_id": original.root_id,
                "event_time_ms": original.event_time_ms,
                "ingest_time_ms": original.ingest_time_ms,
                "key": _text(original.key),
                "payload": _text(original.payload),
                "headers": dict(original.headers),
                "stream": original.stream or "default",
                # A re-driven record's (onceflow dlq redrive): the job it went back to, and how
                # many times it has been re-driven.
                "redrive_job": original.redrive_job,
                "redrive_count": original.redrive_count,
            }
        if isinstance(original, ResultChange | PartialAggregate):
            fields = _message_dict(original)
            for name in ("value", "partials"):
                if name in fields:
                    fields[name] = _text(getattr(original, name))
            return {"type": type(original).__name__, **fields}
        return {"type": "raw", "value": _text(self.letter.original)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "stage": self.stage,
            "error_class": self.error_class,
            "message": self.message,
            "record_id": self.record_id,
            "job": self.job,
            "failed_at_ms": self.failed_at_ms,
            "source": {
                "topic": self.letter.source_topic,
                "partition": self.letter.source_partition,
                "offset": self.letter.source_offset,
            },
            "original": self.original_dict(),
        }


def _message_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


@dataclass(frozen=True)
class LetterFilter:
    """Which letters to keep; an unset field keeps all. ``reason`` is a case-insensitive
    substring of the error class or the message."""

    stage: str | None = None
    job: str | None = None
    reason: str | None = None
    record_id: str | None = None
    # A record's stream (docs/decisions/0025): "default" (or "") for the default stream. Letters
    # that hold no record (a merge hop's partial, a sink's result change) belong to none.
    stream: str | None = None

    def __call__(self, letter: Letter) -> bool:
        if self.stage is not None and letter.stage != self.stage:
            return False
        if self.job is not None and letter.job != self.job:
            return False
        if self.record_id is not None and letter.record_id != self.record_id:
            return False
        if self.stream is not None and letter.stream != _canonical_stream(self.stream):
            return False
        if self.reason is not None:
            needle = self.reason.lower()
            if needle not in letter.error_class.lower() and needle not in letter.message.lower():
                return False
        return True


def reason_counts(letters: Iterable[Letter]) -> Counter[str]:
    """How many letters per reason (stage and error class), most first with ``most_common``."""
    return Counter(letter.reason for letter in letters)


class DeadLetters:
    """The dead-letter topics of one pipeline. ``topic_prefix`` is its topic prefix (None: the
    environment's ONCEFLOW_TOPIC_PREFIX, as the services read it; unset: none);
    ``topics`` narrows to some of ``DLQ_TOPICS``; ``kafka_config`` adds librdkafka settings
    (security, ...). A topic the cluster does not have is skipped and named in ``missing``;
    none at all is an error naming the prefix (most likely the wrong one)."""

    def __init__(
        self, bootstrap: str, topic_prefix: str | None = None, topics: Sequence[str] | None = None,
        kafka_config: Mapping[str, str] | None = None,
    ) -> None:
        unknown = sorted(set(topics or ()) - set(DLQ_TOPICS))
        if unknown:
            raise ValueError(f"not a dead-letter topic: {', '.join(unknown)} (known: {', '.join(DLQ_TOPICS)})")
        if topic_prefix is None:
            topic_prefix = os.environ.get("ONCEFLOW_TOPIC_PREFIX", "")
        self.bootstrap = bootstrap
        self.prefix = topic_prefix
        self._kafka = _kafka()
        self._consumer = self._kafka.Consumer({
            "bootstrap.servers": bootstrap,
            # Never joins it: partitions are assigned by hand and no offset is committed.
            "group.id": f"onceflow-dlq-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
            **dict(kafka_config or {}),
        })
        metadata = self._consumer.list_topics(timeout=10)
        self.partitions: dict[str, list[int]] = {}
        self.missing: list[str] = []
        for name in topics or DLQ_TOPICS:
            found = metadata.topics.get(topic_prefix + name)
            if found is None or found.error is not None or not found.partitions:
                self.missing.append(name)
            else:
                self.partitions[name] = sorted(found.partitions)
        if not self.partitions:
            self._consumer.close()
            raise ValueError(
                f"no dead-letter topic ({', '.join(topics or DLQ_TOPICS)}) with prefix {topic_prefix!r} on {bootstrap}: "
                f"is the pipeline's topic prefix {topic_prefix!r}? (ONCEFLOW_TOPIC_PREFIX, --prefix)"
            )

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> DeadLetters:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _assign(self, start: Mapping[tuple[str, int], int]) -> None:
        self._consumer.assign([
            self._kafka.TopicPartition(self.prefix + topic, partition, offset)
            for (topic, partition), offset in start.items()
        ])

    def _letter(self, message: Any) -> Letter:
        return Letter.of(message.topic()[len(self.prefix):], message.partition(), message.offset(), message.value() or b"")

    def _poll(self, timeout_s: float, at_end: set[tuple[str, int]]) -> list[Letter]:
        letters = []
        for message in self._consumer.consume(num_messages=500, timeout=timeout_s):
            error = message.error()
            topic = (message.topic() or "")[len(self.prefix):]
            if error is not None:
                if error.code() == self._kafka.KafkaError._PARTITION_EOF:
                    at_end.add((topic, message.partition()))
                    continue
                raise RuntimeError(f"reading {message.topic()}: {error}")
            at_end.discard((topic, message.partition()))
            try:
                letters.append(self._letter(message))
            except DecodeError:
                # Not a DeadLetter: shown as one whose original is the value, not skipped.
                letters.append(Letter(topic, message.partition(), message.offset(), DeadLetter(
                    stage="?", error_class="NotADeadLetter", message="this value is not a DeadLetter",
                    original=message.value() or b""), None))
        return letters

    def list(self, keep: LetterFilter | None = None, timeout_s: float = 30.0) -> list[Letter]:
        """Every committed letter there is now (up to each partition's end when called), in
        topic order then offset order, that ``keep`` keeps."""
        keep = keep or LetterFilter()
        every = [(topic, p) for topic, partitions in self.partitions.items() for p in partitions]
        self._assign({tp: self._kafka.OFFSET_BEGINNING for tp in every})
        at_end: set[tuple[str, int]] = set()
        letters: list[Letter] = []
        deadline = time.monotonic() + timeout_s
        while not at_end >= set(every):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the dead-letter topics took over {timeout_s} s")
            letters += self._poll(0.5, at_end)
        order = {topic: index for index, topic in enumerate(DLQ_TOPICS)}
        letters.sort(key=lambda letter: (order[letter.topic], letter.partition, letter.offset))
        return [letter for letter in letters if keep(letter)]

    def get(self, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> Letter:
        """The letter at ``topic`` (without the prefix) ``partition``@``offset``; LookupError
        when there is none there (out of range, or a transaction marker)."""
        if partition not in self.partitions.get(topic, []):
            raise LookupError(f"no partition {partition} of {self.prefix}{topic}")
        self._assign({(topic, partition): offset})
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not at_end:
            letters = self._poll(0.5, at_end)
            found = [letter for letter in letters if letter.offset == offset]
            if found:
                return found[0]
            if any(letter.offset > offset for letter in letters):
                break  # the offset holds no letter: a transaction marker or an aborted write
        raise LookupError(f"no dead letter at {self.prefix}{topic} {partition}@{offset}")

    def tail(
        self, keep: LetterFilter | None = None, most: int | None = None, timeout_s: float | None = None,
    ) -> Iterator[Letter]:
        """Letters committed from now on, as they come: forever, or until ``most`` were yielded
        or ``timeout_s`` passed. "Now" is each partition's end when this is called (not when the
        iteration starts), so a letter committed after the call returns is never missed."""
        keep = keep or LetterFilter()
        ends = {}
        for topic, partitions in self.partitions.items():
            for partition in partitions:
                tp = self._kafka.TopicPartition(self.prefix + topic, partition)
                _low, high = self._consumer.get_watermark_offsets(tp, timeout=10)
                ends[(topic, partition)] = high
        self._assign(ends)
        return self._follow(keep, most, None if timeout_s is None else time.monotonic() + timeout_s)

    def _follow(self, keep: LetterFilter, most: int | None, deadline: float | None) -> Iterator[Letter]:
        yielded = 0
        at_end: set[tuple[str, int]] = set()
        while most is None or yielded < most:
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                return
            for letter in self._poll(wait, at_end):
                if keep(letter):
                    yield letter
                    yielded += 1
                    if most is not None and yielded >= most:
                        return
