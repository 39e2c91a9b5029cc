"""What ingest does with a tree that did not complete: a stage of the shared loop over
acker.events (docs/decisions/0022).

- By default nothing is replayed. Every hop commits its input offsets with its outputs, so a
  TIMED_OUT tree is late (a stalled gate, a restarting worker, an ack lost after the sink's
  apply), not lost: it is counted and logged, and the record takes effect once or lands in a
  dead-letter topic with the reason. A FAILED tree (a stage failed the record and forwarded
  nothing) goes to ingest.dlq.
- With ``replay`` (for stages outside the transactions that can lose records), the record is
  read back from ingest.records by offset and emitted again as attempt n+1 (with its INIT) in
  one transaction with the event's offset, carrying its original's log-append time so the gate
  can refuse a replay it can no longer judge; after max_attempts it goes to ingest.dlq."""

from __future__ import annotations

import logging
import time

from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition

from onceflow import acks
from onceflow.codec import decode_envelope, encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.state.store import KeyValueStore
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Original:
    value: bytes
    appended_ms: int  # the broker's log-append time; 0 on a topic stamped by its writers


class OriginalFetcher:
    """Reads one committed record of ingest.records by (partition, offset)."""

    def __init__(self, common: CommonSettings, topic: str, timeout_s: float = 10.0) -> None:
        self._topic = topic
        self._timeout_s = timeout_s
        # Each fetch re-assigns: a long fetch wait on the previous assignment would delay the
        # next one by fetch.wait.max.ms (500 ms by default).
        self._reader = clients.reader(common, **{"fetch.wait.max.ms": 5, "enable.partition.eof": False})

    def fetch(self, partition: int, offset: int) -> Original | None:
        self._reader.assign([TopicPartition(self._topic, partition, offset)])
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            message = self._reader.poll(0.05)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                log.warning("fetching %s[%d]@%d: %s", self._topic, partition, offset, error)
                continue
            if message.offset() == offset:
                kind, timestamp = message.timestamp()
                return Original(message.value() or b"", timestamp if kind == TIMESTAMP_LOG_APPEND_TIME else 0)
            return None  # compacted or deleted: the offset now holds a later record
        return None

    def close(self) -> None:
        self._reader.close()


class ReplayStage:
    name = "ingest-replayer"

    def __init__(
        self, fetcher: OriginalFetcher, ingest_topic: str, dlq_topic: str, acks_topic: str, max_attempts: int,
        timeout_ms: int, replay: bool = False,
    ) -> None:
        self._fetcher = fetcher
        self._ingest_topic = ingest_topic
        self._dlq_topic = dlq_topic
        self._acks_topic = acks_topic
        self._max_attempts = max_attempts if replay else 1
        self._replay = replay
        self._timeout_ms = timeout_ms
        self.replayed = 0
        self.dead_lettered = 0
        self.timed_out = 0

    def process(self, batch: Batch[KeyValueStore]) -> None:  # stateless: no store
        replayed = dead = late = 0
        for record in batch.records:
            event = TreeEvent.FromString(record.value() or b"")
            if event.outcome == TreeEvent.COMPLETED:
                continue
            if event.outcome == TreeEvent.TIMED_OUT and not self._replay:
                late += 1
                if late == 1:
                    log.warning(
                        "tree %#x of %r timed out (%s); not replayed: the record is committed at %s[%d]@%d and takes "
                        "effect once, or lands in a dead-letter topic with the reason (ONCEFLOW_INGEST_REPLAY)",
                        event.root_id, event.origin.record_id, event.reason, event.origin.topic, event.origin.partition,
                        event.origin.offset,
                    )
                continue
            if event.origin.partition < 0 or event.origin.offset < 0:
                # No origin to read back (an acker that predates dropping INIT-less trees).
                batch.dead_letter(record, f"tree {event.root_id:#x} has no origin to replay")
                continue
            original = self._fetcher.fetch(event.origin.partition, event.origin.offset)
            if original is None:
                batch.dead_letter(record, f"original of {event.origin.record_id} not found at "
                                          f"{event.origin.topic}[{event.origin.partition}]@{event.origin.offset}")
                continue
            if event.attempt < self._max_attempts:
                envelope = decode_envelope(original.value)
                attempt = event.attempt + 1
                envelope.root_id = acks.next_root_id(event.root_id, attempt)
                envelope.edge_id = new_id()
                envelope.attempt = attempt
                # The first attempt's own time: a replay of a replay keeps it.
                envelope.first_appended_ms = envelope.first_appended_ms or original.appended_ms
                batch.emit(self._ingest_topic, encode_envelope(envelope), key=envelope.record_id.encode())
                batch.init_tree(envelope.root_id, [envelope.edge_id], event.origin, attempt, self._timeout_ms)
                replayed += 1
            else:
                batch.emit(self._dlq_topic, self._letter(event, original.value).SerializeToString(),
                           key=event.origin.record_id.encode())
                dead += 1
        if late > 1:
            log.warning("%d trees timed out in all in this batch; none replayed", late)

        def count() -> None:
            self.replayed += replayed
            self.dead_lettered += dead
            self.timed_out += late

        batch.after_commit.append(count)

    def _letter(self, event: TreeEvent, original: bytes) -> DeadLetter:
        outcome = TreeEvent.Outcome.Name(event.outcome)
        if event.outcome == TreeEvent.FAILED and event.attempt == 1:
            message = f"{event.reason}; the record was failed and never forwarded, so it took no effect"
        else:
            # A copy of an earlier attempt may still be in flight: this letter is not proof of
            # "never applied" (docs/decisions/0022), so a re-drive must check the table first.
            message = (f"{event.reason}; gave up after {event.attempt} attempt(s); an earlier copy may still take "
                       f"effect: check before re-driving")
        return DeadLetter(
            stage="ingest",
            error_class=outcome,
            message=message,
            original=original,
            source_topic=event.origin.topic,
            source_partition=event.origin.partition,
            source_offset=event.origin.offset,
            failed_at_ms=now_ms(),
        )
