"""A record's story from the services and from Kafka: its pending tree (the acker's GetTree), its
decided trees (acker.events: the acker forgets a tree once it is decided), whether the gate has
seen it and until when (Check), and its dead letters. Kafka is read to the end of each topic,
so a lookup costs a pass over acker.events and the dead-letter topics, bounded in time."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from onceflow import topology
from onceflow.admin.tls import ClientTLS
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import TopicRecord, find_committed
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow_tools.admin_client import CallFailed, as_dict
from onceflow_tools.console import grpc_calls

MAX_RECORD_ID_BYTES = 256  # what ingest accepts (docs/services/ingest.md)


def check_record_id(record_id: str) -> str:
    """The problem with ``record_id`` as a lookup key, or "" when it is one ingest could accept."""
    if not record_id:
        return "give a record_id"
    if len(record_id.encode()) > MAX_RECORD_ID_BYTES:
        return f"a record_id is at most {MAX_RECORD_ID_BYTES} bytes; this one has {len(record_id.encode())}"
    return ""


def when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds") if ms > 0 else ""


@dataclass
class RecordStory:
    record_id: str
    pending: list[dict[str, Any]] = field(default_factory=list)
    decided: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, Any] | None = None
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    # What could not be asked or read: the answer above may then be partial.
    problems: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        seen = self.gate is not None and self.gate.get("seen")
        return bool(self.pending or self.decided or seen or self.dead_letters)


def _decided(record: TopicRecord, record_id: str) -> bool:
    event = TreeEvent.FromString(record.value or b"")
    return event.origin.record_id == record_id


def _letter_of(record: TopicRecord, record_id: str) -> bool:
    try:
        return Envelope.FromString(DeadLetter.FromString(record.value or b"").original).record_id == record_id
    except Exception:  # noqa: BLE001 - a sink dead letter holds a result change, not an envelope
        return False


def _event_view(record: TopicRecord) -> dict[str, Any]:
    event = TreeEvent.FromString(record.value or b"")
    return {
        "outcome": TreeEvent.Outcome.Name(event.outcome),
        "root_id": f"{event.root_id:016x}",
        "attempt": event.attempt,
        "latency_ms": event.latency_ms,
        "reason": event.reason,
        "decided_at": when(event.decided_at_ms),
        "origin": f"{event.origin.topic}[{event.origin.partition}]@{event.origin.offset}",
    }


def _letter_view(topic: str, record: TopicRecord) -> dict[str, Any]:
    letter = DeadLetter.FromString(record.value or b"")
    return {
        "topic": topic,
        "stage": letter.stage,
        "error_class": letter.error_class,
        "message": letter.message,
        "source": f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
        "failed_at": when(letter.failed_at_ms),
    }


def look_up(
    record_id: str, common: CommonSettings, acker: list[str], dedup: list[str], tls: ClientTLS | None,
    call_timeout_s: float, kafka_timeout_s: float,
) -> RecordStory:
    story = RecordStory(record_id)
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-lookup") as pool:
        events = pool.submit(
            find_committed, common, common.topic(Topic.ACKER_EVENTS), lambda r: _decided(r, record_id), kafka_timeout_s
        )
        letters = {
            dlq: pool.submit(find_committed, common, common.topic(dlq), lambda r: _letter_of(r, record_id), kafka_timeout_s)
            for dlq in topology.DLQS
        }
        for address in acker:
            try:
                story.pending += [
                    {**as_dict(tree), "root_id": f"{tree.root_id:016x}", "started_at": when(tree.started_ms),
                     "deadline": when(tree.deadline_ms)}
                    for tree in grpc_calls.pending_trees(address, tls, record_id, call_timeout_s)
                ]
            except CallFailed as exc:
                story.problems.append(f"acker {exc}")
        for address in dedup:
            # Every instance answers; the one owning the id's partition knows.
            try:
                reply = grpc_calls.gate_check(address, tls, record_id, call_timeout_s)
            except CallFailed as exc:
                story.problems.append(f"dedup {exc}")
                continue
            if reply.owned or story.gate is None:
                story.gate = {**as_dict(reply), "expires_at": when(reply.expires_at_ms), "bucket_start": when(reply.bucket_start_ms)}
        try:
            story.decided = [_event_view(r) for r in sorted(events.result(), key=lambda r: (r.partition, r.offset))]
        except Exception as exc:  # noqa: BLE001 - a timeout or a broker error: said, not raised
            story.problems.append(f"{Topic.ACKER_EVENTS}: {exc}")
        for dlq, future in letters.items():
            try:
                story.dead_letters += [_letter_view(str(dlq), r) for r in future.result()]
            except Exception as exc:  # noqa: BLE001
                story.problems.append(f"{dlq}: {exc}")
    return story
