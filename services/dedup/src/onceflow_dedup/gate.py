"""The gate: a stage of the shared loop over ingest.records. Each record_id passes once per
stream, into its stream's topic (``dedup.records`` for the default stream; docs/decisions/0025).

Per record: a record_id this batch already let through is a duplicate; otherwise, if no Bloom
filter says "maybe", the record is new without a store read (the fast path); otherwise the
exact store decides (present: duplicate; absent: a false positive, so new). New ids go into the
transaction's state overlay, hence into ``dedup.changelog`` with the outputs and offsets.

Time is the broker's: ``ingest.records`` stamps each record with its log-append time, so no
client or ingest host's clock moves the horizon (docs/architecture.md, "Where identity and time
come from"). A replay whose original is beyond the horizon is refused, not passed: the gate can
no longer tell whether the original took effect (docs/decisions/0022).

Punctuation does the writes that are not driven by records: GC of buckets past the horizon
and operators' Forget requests, both as changelog tombstones in a transaction of their own.
"""

from __future__ import annotations

import enum
import logging
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from onceflow import acks, streams
from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.kafka.records import partition_of
from onceflow.txn.batch import Batch
from onceflow.v1.envelope_pb2 import Envelope

from onceflow_dedup import metrics
from onceflow_dedup.store import DedupStore, encode_bucket

log = logging.getLogger(__name__)


class AckMode(str, enum.Enum):
    """What the gate tells the acker about each record."""

    FORWARD = "forward"  # new records go on as a child edge that a later stage acks
    TERMINAL = "terminal"  # the tree ends here: a new record's ack has no children
    OFF = "off"  # nothing tracks the trees (ingest runs with acking off)


@dataclass
class GateCounts:
    passed: int = 0
    dropped: int = 0
    fast_path: int = 0
    store_reads: int = 0
    false_positives: int = 0
    beyond_horizon: int = 0
    replays_refused: int = 0
    expired_ids: int = 0
    forgotten: int = 0
    dead_letters: int = 0

    def add(self, other: GateCounts) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class ForgetRequest:
    record_id: str
    done: Future[tuple[bool, int]] = field(default_factory=Future)


class ReplayBeyondHorizon(Exception):
    """A replay whose original is older than the horizon: passing it could apply it twice."""


@dataclass
class ClockSkew:
    """How far writers' clocks (each envelope's ``ingest_time_ms``) stood from the broker's
    log-append time: ``ahead_ms`` the most ahead, ``behind_ms`` the most behind (both >= 0;
    commit latency shows as a little 'behind'). Only measured: neither moves the horizon."""

    ahead_ms: int = 0
    behind_ms: int = 0

    def widen(self, other: ClockSkew) -> None:
        self.ahead_ms = max(self.ahead_ms, other.ahead_ms)
        self.behind_ms = max(self.behind_ms, other.behind_ms)


SKEW_WINDOW_MS = 60_000  # the reported skew is the widest of the current window


class DedupGate:
    name = "dedup"

    def __init__(
        self, topic_prefix: str, ack_mode: AckMode, rekey: bool, gc_limit: int = 20_000,
        stream_exists: Callable[[str], bool] | None = None,
        readers_of: Callable[[str], tuple[str, ...]] | None = None,
    ) -> None:
        self._topic_prefix = topic_prefix
        # None (tests of the gate alone): every stream is taken to exist.
        self._stream_exists = stream_exists
        # The jobs reading each stream (onceflow.readers); None: none known, one edge per record.
        self._readers_of = readers_of
        self._ack_mode = ack_mode
        self._rekey = rekey
        self._gc_limit = gc_limit
        self.counts = GateCounts()
        self.skew = ClockSkew()
        self._skew_window_start = 0
        self._warned_create_time: set[int] = set()
        self.forget_requests: queue.Queue[ForgetRequest] = queue.Queue()

    # -- records -------------------------------------------------------------------------------

    def process(self, batch: Batch[DedupStore]) -> None:
        counts = GateCounts()
        skew = ClockSkew()
        for record in batch.records:
            self._gate(record, batch, counts, skew)
        self._count_after_commit(batch, counts, skew)

    def _clock_ms(self, record: Message, ingest_time_ms: int, now_ms: int, skew: ClockSkew) -> int:
        """The record's time on the one clock the gate trusts: the broker's log-append time.
        A topic created with CreateTime (before onceflow set LogAppendTime on ingest.records)
        has only the writer's clock: used as before, with a warning per partition."""
        kind, appended_ms = record.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME and appended_ms > 0:
            if ingest_time_ms:
                offset = ingest_time_ms - appended_ms
                if offset > skew.ahead_ms:
                    skew.ahead_ms = offset
                elif -offset > skew.behind_ms:
                    skew.behind_ms = -offset
            return int(appended_ms)
        partition = partition_of(record)
        if partition not in self._warned_create_time:
            self._warned_create_time.add(partition)
            log.warning(
                "%s[%d] has no log-append time: the horizon follows the ingest hosts' clocks; run `onceflow infra "
                "topics` to set message.timestamp.type=LogAppendTime on it", record.topic(), partition,
            )
        return ingest_time_ms or now_ms

    def _gate(self, record: Message, batch: Batch[DedupStore], counts: GateCounts, skew: ClockSkew) -> None:
        try:
            envelope = decode_envelope(record.value() or b"")  # checks record_id too
        except Exception as exc:  # noqa: BLE001 - any undecodable record is poison, not a crash
            batch.dead_letter(record, exc)
            counts.dead_letters += 1
            return
        if envelope.stream and self._stream_exists is not None and not self._stream_exists(envelope.stream):
            # Ingest checked it; the stream's topic has gone since. Its own letter, never a write
            # to a missing topic (which would hold the transaction until it timed out).
            counts.dead_letters += 1
            # The reason first, the record after: letters roll up by their message's head.
            batch.dead_letter(record, f"{streams.missing_stream(envelope.stream)}: record {envelope.record_id!r}")
            if self._ack_mode is not AckMode.OFF:
                batch.ack(envelope)
            return
        state = batch.state(partition_of(record))
        store = state.store
        identity = streams.identity(
            envelope.stream, envelope.record_id, envelope.redrive_job, envelope.redrive_count, envelope.producer
        )
        key = identity.encode()
        ingest_time = self._clock_ms(record, envelope.ingest_time_ms, batch.now_ms, skew)
        store.advance(ingest_time)

        if state.changes.get(key) is not None:
            duplicate = True  # let through earlier in this batch
        elif not store.might_contain(identity):
            duplicate = False
            counts.fast_path += 1
        else:
            counts.store_reads += 1
            duplicate = state.get(key) is not None
            counts.false_positives += not duplicate

        if duplicate:
            counts.dropped += 1
            if self._ack_mode is not AckMode.OFF:
                batch.ack(envelope)
            return

        if envelope.attempt > 1:
            # A replay the store does not know. Its original came first in this partition (both
            # are keyed by record_id), so it was seen: within the horizon it would have been
            # found; beyond it, it may well have taken effect. Refuse rather than guess.
            original_ms = envelope.first_appended_ms or envelope.ingest_time_ms
            if original_ms and store.beyond_horizon(original_ms):
                counts.replays_refused += 1
                counts.dead_letters += 1
                batch.dead_letter(record, ReplayBeyondHorizon(
                    f"beyond the dedup horizon: attempt {envelope.attempt} of {envelope.record_id!r}: its original (appended at "
                    f"{original_ms} ms) is older than the horizon, so the gate cannot tell whether it took effect; not passed"
                ))
                if self._ack_mode is not AckMode.OFF:
                    batch.ack(envelope)
                return

        counts.passed += 1
        if store.beyond_horizon(ingest_time):
            # Older than the horizon: let through but not remembered (the documented contract).
            counts.beyond_horizon += 1
        else:
            state.put(key, encode_bucket(store.filters.bucket_of(ingest_time)))
        child_edge = new_id()
        readers = self._readers(envelope)
        if self._ack_mode is AckMode.FORWARD:
            batch.ack(envelope, [acks.reader_edge(child_edge, r) for r in readers] or [child_edge])
        elif self._ack_mode is AckMode.TERMINAL:
            batch.ack(envelope)
        envelope.edge_id = child_edge
        del envelope.readers[:]
        if self._ack_mode is AckMode.FORWARD:
            envelope.readers.extend(readers)
        # The broker's clock rides along: compute bounds event time against it, whatever the
        # writing host's clock says (a replay keeps its original's).
        envelope.first_appended_ms = envelope.first_appended_ms or ingest_time
        out_key = envelope.key if self._rekey and envelope.key else record.key()
        batch.emit(self._topic_prefix + streams.topic_of(envelope.stream), encode_envelope(envelope), key=out_key)

    def _readers(self, envelope: Envelope) -> tuple[str, ...]:
        """Who acks the forwarded record (docs/decisions/0028): every job reading its stream, or
        only the versions of the job a re-driven letter goes back to (the others pass it over)."""
        if self._readers_of is None:
            return ()
        readers = self._readers_of(envelope.stream)
        if envelope.redrive_job:
            readers = tuple(r for r in readers if r.partition("@")[0] == envelope.redrive_job)  # job@n: a version
        return readers

    # -- punctuation: GC and Forget ------------------------------------------------------------

    def punctuate(self, batch: Batch[DedupStore]) -> None:
        counts = GateCounts()
        answered: list[tuple[ForgetRequest, bool, int]] = []
        for partition in batch.owned_partitions:
            state = batch.state(partition)
            store = state.store
            budget = self._gc_limit
            for bucket in store.expired_buckets():
                ids = store.bucket_ids(bucket, budget)
                for record_id in ids:
                    state.tombstone(record_id)
                counts.expired_ids += len(ids)
                budget -= len(ids)
                if budget <= 0:
                    break
        while True:
            try:
                request = self.forget_requests.get_nowait()
            except queue.Empty:
                break
            answered.append(self._forget(request, batch, counts))

        def settle() -> None:
            self.counts.add(counts)
            metrics.EXPIRED.inc(counts.expired_ids)
            for request, forgotten, partition in answered:
                request.done.set_result((forgotten, partition))

        batch.after_commit.append(settle)
        if counts.expired_ids:
            log.info("GC: tombstoning %d ids of buckets past the horizon", counts.expired_ids)

    def _forget(self, request: ForgetRequest, batch: Batch[DedupStore], counts: GateCounts) -> tuple[ForgetRequest, bool, int]:
        key = request.record_id.encode()
        for partition in batch.owned_partitions:
            state = batch.state(partition)
            if state.get(key) is not None:
                state.tombstone(key)
                counts.forgotten += 1
                log.info("forget %r in partition %d (operator request)", request.record_id, partition)
                return request, True, partition
        return request, False, -1

    def _count_after_commit(self, batch: Batch[DedupStore], counts: GateCounts, skew: ClockSkew) -> None:
        def count() -> None:
            self.counts.add(counts)
            if batch.now_ms - self._skew_window_start >= SKEW_WINDOW_MS:
                self.skew, self._skew_window_start = ClockSkew(), batch.now_ms
            self.skew.widen(skew)
            metrics.CLOCK_SKEW.labels("ahead").set(self.skew.ahead_ms / 1000)
            metrics.CLOCK_SKEW.labels("behind").set(self.skew.behind_ms / 1000)
            metrics.RECORDS.labels("replay_refused").inc(counts.replays_refused)
            metrics.RECORDS.labels("passed").inc(counts.passed)
            metrics.RECORDS.labels("dropped").inc(counts.dropped)
            metrics.FAST_PATH.inc(counts.fast_path)
            metrics.STORE_READS.inc(counts.store_reads)
            metrics.FALSE_POSITIVES.inc(counts.false_positives)

        batch.after_commit.append(count)
