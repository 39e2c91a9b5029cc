"""``onceflow dlq redrive``: chosen dead letters back into the pipeline, exactly once
(docs/decisions/0026).

A letter becomes a record again, written to ``ingest.records`` in a transaction of the tool's own
(as a spout: with the INIT that starts its tree), and the gate deduplicates it like any other:

- **A compute job's letter** (``compute.dlq``, the map hop's: a record the job refused). Its
  record passed the gate, and the stream's other jobs took it. It goes back to that job alone
  (``Envelope.redrive_job``: the other jobs pass it over) under a record of its own, identified
  by (stream, record_id, job, the letter's redrive count + 1). A second redrive of the same
  letter is a copy, dropped. If the job refuses it again, the new letter's count is one
  higher, so it can be re-driven once more, after another fix; nothing re-drives by itself.
- **A gate letter** (``dedup.dlq`` with a record: its stream's topic had gone). The record never
  passed the gate: it goes back under its own identity, so a copy a client sent meanwhile
  counts once, and a second redrive changes nothing.
- Every other letter is refused, with what to do instead: ingest's (the record took no effect:
  send it again under its record_id), the source's (a raw value: fix it in the topic),
  ``compute.late`` (late by design), the merge hop's and the sink's (not records).

A fix replaces a record's payload: ``fixes`` maps a record_id to its corrected payload.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from onceflow import spout, streams
from onceflow.codec import now_ms
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import latest_by_key, partitions_of, read_committed
from onceflow.kafka.topics import ensure_topics, shared_specs
from onceflow.topology import Topic
from onceflow.txn.producer import TransactionalProducer, TxnOutcome
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client.dlq import Letter

log = logging.getLogger(__name__)

TRANSACTION_RECORDS = 500
TREE_TIMEOUT_MS = 30_000  # as ingest's default (ONCEFLOW_INGEST_TREE_TIMEOUT_MS)
LIMITS = spout.Limits(max_payload_bytes=900 * 1024, max_key_bytes=64 * 1024)
ATTEMPTS = 5

_REFUSED_TOPICS = {
    Topic.INGEST_DLQ: "ingest gave up on it, so it took no effect: send it again through ingest under its record_id",
    Topic.SOURCE_DLQ: "a source letter holds the user's raw value: fix the record in the source topic, or send it through ingest",
    Topic.COMPUTE_LATE: "late by design: raise the job's allowed lateness and reprocess (docs/jobs.md)",
    Topic.SINK_DLQ: "a sink letter is a result change, not a record",
    Topic.ACKER_DLQ: "an acker letter is an ack, not a record",
}


@dataclass
class Plan:
    """What a redrive would write, and the letters it leaves, with why."""

    records: list[IngestRecord] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)  # the letter each record comes from (ledger keys)
    targets: Counter[str] = field(default_factory=Counter)  # job (or "every job of the stream") -> records
    refused: list[tuple[Letter, str]] = field(default_factory=list)
    fixed: int = 0

    def refusals(self) -> Counter[str]:
        return Counter(reason for _letter, reason in self.refused)


def letter_key(letter: Letter) -> str:
    """A letter's place, which names it for good: its key in ``dlq.redriven``."""
    return f"{letter.topic}/{letter.partition}/{letter.offset}"


def plan(letters: Iterable[Letter], fixes: Mapping[str, bytes] | None = None, done: Mapping[str, str] | None = None) -> Plan:
    """The records the letters become (pure: nothing is read or written). ``done``: the letters
    re-driven already (``redriven``), left as they are; ``fixes``: corrected payloads by record_id,
    refused for a record_id whose letters come from more than one stream or producer."""
    letters = list(letters)
    out = Plan()
    scopes: dict[str, set[tuple[str, str]]] = {}
    for letter in letters:
        if isinstance(letter.original, Envelope):
            scopes.setdefault(letter.original.record_id, set()).add((streams.canonical(letter.original.stream), letter.original.producer))
    for letter in letters:
        reason = _refusal(letter)
        if not reason and done is not None and letter_key(letter) in done:
            reason = f"re-driven already ({done[letter_key(letter)]}; {Topic.DLQ_REDRIVEN.value})"
        original = letter.original
        if not reason and fixes is not None and isinstance(original, Envelope) and original.record_id in fixes:
            if len(scopes[original.record_id]) > 1:
                reason = (f"the fix for record_id {original.record_id!r} would reach letters of more than one stream or producer: "
                          "narrow the letters (--stream, --job)")
        if reason:
            out.refused.append((letter, reason))
            continue
        assert isinstance(original, Envelope)
        if letter.topic == Topic.COMPUTE_DLQ:
            job, count = letter.job or "", original.redrive_count + 1
        else:  # a gate letter goes back under its own identity, a re-driven record's included
            job, count = original.redrive_job, original.redrive_count
        payload = original.payload
        if fixes is not None and original.record_id in fixes:
            payload = fixes[original.record_id]
            out.fixed += 1
        record = IngestRecord(
            record_id=original.record_id.encode(),
            key=original.key,
            payload=payload,
            event_time_ms=original.event_time_ms,
            headers=dict(original.headers),
            stream=original.stream.encode(),
            redrive_job=job,
            redrive_count=count if job else 0,
            producer=original.producer,  # the record stays in its producer's id space (docs/decisions/0027)
        )
        invalid = spout.check_record(0, record, LIMITS, field_prefix="letter", redrive=True)
        if invalid is not None:
            out.refused.append((letter, f"as a record it is invalid: {invalid}"))
            continue
        out.records.append(record)
        out.letters.append(letter_key(letter))
        out.targets[job or f"every job of stream {streams.display(original.stream)}"] += 1
    return out


def _refusal(letter: Letter) -> str:
    try:
        topic: Topic | None = Topic(letter.topic)
    except ValueError:
        topic = None
    if topic is not None and topic in _REFUSED_TOPICS:
        return _REFUSED_TOPICS[topic]
    if not isinstance(letter.original, Envelope):
        return "its original is not a record (a merge hop's partial, or bytes that never decoded)"
    if topic is Topic.COMPUTE_DLQ and not letter.letter.job:
        return "a compute letter that names no job (written before letters named their job): fix and send it through ingest"
    if topic is Topic.DEDUP_DLQ and letter.error_class == "ReplayBeyondHorizon":
        return ("the gate could not tell whether its original took effect (beyond the dedup horizon): re-driving it could "
                "count it twice; look for it in the table, and send it through ingest if it is missing")
    if topic is Topic.DEDUP_DLQ and not letter.message.startswith("no stream "):
        return "a gate letter whose stream was there: only a record whose stream had gone is re-driven"
    return ""


def redriven(common: CommonSettings) -> dict[str, str]:
    """The letters re-driven already: ledger key -> when and to what."""
    ensure_topics(common.kafka_bootstrap, common.topic_prefix, [s for s in shared_specs() if s.name == Topic.DLQ_REDRIVEN])
    records = read_committed(common, common.topic(Topic.DLQ_REDRIVEN), timeout_s=30)
    return {key.decode(): value.decode() for (_p, key), value in latest_by_key(records).items()}


def redrive(common: CommonSettings, chosen: Plan, acking: bool = True) -> int:
    """Write the plan's records to ``ingest.records``, and each one's letter to ``dlq.redriven``,
    in transactions of the tool's own; returns how many were written. A transaction whose
    outcome is unknown is written again: the gate drops what the first one wrote."""
    records = chosen.records
    directory = streams.directory(common)
    for record in records:
        if not directory.exists(record.stream.decode()):
            raise ValueError(streams.missing_stream(record.stream.decode()))
    topic, ledger = common.topic(Topic.INGEST_RECORDS), common.topic(Topic.DLQ_REDRIVEN)
    redriven(common)  # the ledger exists before the first transaction writes to it
    inits = None
    if acking:
        acks_topic = common.topic(Topic.ACKER_ACKS)
        inits = spout.Inits(acks_topic, len(partitions_of(common, acks_topic)), TREE_TIMEOUT_MS)
    producer = TransactionalProducer(common, common.topic("onceflow-redrive"))
    written = 0
    for start in range(0, len(records), TRANSACTION_RECORDS):
        chunk = records[start : start + TRANSACTION_RECORDS]
        keys = chosen.letters[start : start + TRANSACTION_RECORDS]
        for attempt in range(1, ATTEMPTS + 1):
            now = now_ms()
            new = [spout.new_record(record, now) for record in chunk]

            def write(new: list[spout.NewRecord] = new, now: int = now, chunk: list[IngestRecord] = chunk, keys: list[str] = keys) -> None:
                spout.produce_new_records(producer, topic, new, inits)
                for key, record in zip(keys, chunk, strict=True):
                    note = f"at {now} ms to {record.redrive_job or 'its stream'}"
                    producer.produce(ledger, note.encode(), key=key.encode())

            result = producer.transact(write)
            if result.outcome is TxnOutcome.COMMITTED:
                written += len(chunk)
                break
            log.warning("redrive: transaction %s (%s); writing it again (%d/%d)", result.outcome.value, result.error, attempt, ATTEMPTS)
        else:
            raise RuntimeError(f"redrive: {len(records) - written} records not written after {ATTEMPTS} attempts")
    return written
