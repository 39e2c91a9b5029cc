"""The acker as a stage of the shared loop: acker.acks in, decisions out, trees in the
changelog-backed store. Decisions, changelog and offsets commit in one transaction."""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Gauge, Histogram

from onceflow.acks import root_key
from onceflow.kafka.records import partition_of
from onceflow.state.overlay import StateTransaction
from onceflow.state.store import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, TreeEvent

from onceflow_acker.trees import (
    Decision,
    Outcome,
    SweepClock,
    Tree,
    apply,
    decide,
    encode_new_init,
    expired,
    xor_pending,
)

log = logging.getLogger(__name__)

_OUTCOME = {
    Outcome.COMPLETED: TreeEvent.COMPLETED,
    Outcome.FAILED: TreeEvent.FAILED,
    Outcome.TIMED_OUT: TreeEvent.TIMED_OUT,
}
TREES = Counter("onceflow_acker_trees_total", "Trees decided, committed with their events", ["outcome"])
TREE_SECONDS = Histogram(
    "onceflow_acker_tree_seconds",
    "A completed tree's age when it completed: ingest's INIT to the last ack",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
PENDING = Gauge("onceflow_acker_pending_trees", "Trees in the stores of the partitions this acker owns")
GROUPS = Counter(
    "onceflow_acker_groups_total",
    "Groups (a transaction's outputs, docs/decisions/0016) decided on this acker's partitions",
    ["outcome"],
)

# The deadline sits at a fixed place in an encoded tree: the sweep reads only that.
_DEADLINE = struct.Struct("<q")
_DEADLINE_AT = 16


@dataclass
class AckerStats:
    acks: int = 0
    completed: int = 0
    failed: int = 0
    timed_out: int = 0
    latencies_ms: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    completions: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=120))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, acks: int, decisions: list[tuple[Outcome, int]]) -> None:
        with self.lock:
            self.acks += acks
            for outcome, latency in decisions:
                TREES.labels(outcome.name.lower()).inc()
                if outcome is Outcome.COMPLETED:
                    self.completed += 1
                    self.latencies_ms.append(latency)
                    TREE_SECONDS.observe(latency / 1000)
                elif outcome is Outcome.FAILED:
                    self.failed += 1
                else:
                    self.timed_out += 1
            self.completions.append((time.monotonic(), self.completed))

    def completed_per_second(self) -> float:
        with self.lock:
            if len(self.completions) < 2:
                return 0.0
            (t0, c0), (t1, c1) = self.completions[0], self.completions[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0

    def latency_percentiles(self) -> tuple[float, float]:
        with self.lock:
            values = sorted(self.latencies_ms)
        if not values:
            return 0.0, 0.0
        return float(values[len(values) // 2]), float(values[min(len(values) - 1, (len(values) * 99) // 100)])


class AckerStage:
    name = "acker"

    def __init__(self, events_topic: str, ingest_topic: str, default_timeout_ms: int, stats: AckerStats) -> None:
        self._events_topic = events_topic
        self._ingest_topic = ingest_topic
        self._default_timeout_ms = default_timeout_ms
        self.stats = stats
        self._event = TreeEvent()
        self._clock = SweepClock()
        self._groups_completed = 0  # in the batch being processed

    def process(self, batch: Batch[MemoryStore]) -> None:
        now = batch.now_ms
        decisions: list[tuple[Outcome, int]] = []
        acks = 0
        self._groups_completed = 0
        ack_kind, init_kind = AckerMessage.ACK, AckerMessage.INIT
        for record in batch.records:
            try:
                messages = AckerBatch.FromString(record.value() or b"").messages
            except DecodeError as exc:
                batch.dead_letter(record, exc)
                continue
            partition = partition_of(record)
            state = batch.state(partition)
            # acker.acks is stamped by the broker (LogAppendTime): deadlines count on its clock,
            # not on whichever ingest host wrote the INIT (docs/decisions/0022).
            stamp, appended = record.timestamp()
            appended = appended if stamp == TIMESTAMP_LOG_APPEND_TIME else 0
            self._clock.observe(partition, appended or record.timestamp()[1])
            acks += len(messages)
            for message in messages:
                root_id = message.root_id
                if not root_id:
                    batch.dead_letter(record, "acker message without root_id", message.SerializeToString())
                    continue
                key = root_key(root_id)
                raw = state.get(key)
                kind = message.kind
                if raw is not None and kind == ack_kind:
                    updated = xor_pending(raw, message.xor_value)
                    if updated is not None:  # the hot path: an ACK that does not finish its tree
                        state.put(key, updated)
                        continue
                elif raw is None and kind == init_kind:
                    created = encode_new_init(message, now, self._default_timeout_ms, appended)
                    if created is not None:  # the other hot path: a new tree's INIT
                        state.put(key, created)
                        continue
                try:
                    tree, decision = apply(Tree.decode(raw) if raw else None, message, now, self._default_timeout_ms, appended)
                except ValueError as exc:
                    batch.dead_letter(record, exc, message.SerializeToString())
                    continue
                if decision is None:
                    assert tree is not None  # apply() keeps a tree it has not decided
                    if kind == AckerMessage.GROUP:
                        tree.deadline_ms = max(tree.deadline_ms, self._members_deadline(state, tree.members))
                    state.put(key, tree.encode())
                else:
                    state.delete(key)
                    self._decided(batch, state, root_id, decision, now, decisions)
        if self._groups_completed:
            completed, self._groups_completed = self._groups_completed, 0
            batch.after_commit.append(lambda: GROUPS.labels("completed").inc(completed))
        batch.after_commit.append(lambda: self.stats.record(acks, decisions))

    @staticmethod
    def _members_deadline(state: StateTransaction[MemoryStore], members: tuple[int, ...]) -> int:
        """A group waits as long as the longest-lived member it continues: its trees (INIT's
        timeout) or upstream groups (theirs), not only the acker's default."""
        latest = 0
        for member in members:
            raw = state.get(root_key(member))
            if raw is not None:
                latest = max(latest, _DEADLINE.unpack_from(raw, _DEADLINE_AT)[0])
        return latest

    def _decided(
        self, batch: Batch[MemoryStore], state: StateTransaction[MemoryStore], node_id: int, decision: Decision, now: int,
        decisions: list[tuple[Outcome, int]],
    ) -> None:
        """A tree's decision becomes its event; a completed group acks its id on each member
        held here, which may complete them in turn (a tree, or an upstream group)."""
        if not decision.tree.group:
            decisions.append(self._emit(batch, node_id, decision, now))
            return
        completed = [(node_id, decision.tree.members)]
        while completed:
            group_id, members = completed.pop()
            self._groups_completed += 1
            for member in members:
                key = root_key(member)
                raw = state.get(key)
                if raw is None:
                    continue  # decided already: timed out (and replayed) or failed
                updated = xor_pending(raw, group_id)
                if updated is not None:
                    state.put(key, updated)
                    continue
                tree = Tree.decode(raw)
                tree.ack_val ^= group_id
                kept, outcome = decide(tree)
                if outcome is None:
                    assert kept is not None
                    state.put(key, kept.encode())
                    continue
                state.delete(key)
                if tree.group:
                    completed.append((member, tree.members))
                else:
                    decisions.append(self._emit(batch, member, outcome, now))

    def on_assign(self, partitions: list[int], stores: Mapping[int, MemoryStore]) -> None:
        self._clock.forget(partitions)

    def on_revoke(self, partitions: list[int]) -> None:
        self._clock.forget(partitions)

    def punctuate(self, batch: Batch[MemoryStore]) -> None:
        """Time out trees past their deadline: by processing time, or while this partition's
        input is behind, by how far it has been read (``SweepClock``)."""
        decisions: list[tuple[Outcome, int]] = []
        orphans = expired_groups = 0
        for partition in batch.owned_partitions:
            now = self._clock.now(partition, batch.now_ms, partition in batch.caught_up)
            state = batch.state(partition)
            due = [
                (key, value)
                for key, value in state.items()
                if _DEADLINE.unpack_from(value, _DEADLINE_AT)[0] <= now
            ]
            for key, value in due:
                tree = Tree.decode(value)
                if not tree.init_seen:
                    # Acks of a tree whose INIT never came: the INIT is committed with the record
                    # before any stage can ack it, so these are late acks of a tree already
                    # decided (e.g. a stage re-reading old input). Nothing to replay: drop them,
                    # as Storm's acker lets such entries expire silently.
                    state.delete(key)
                    orphans += 1
                    continue
                decision = expired(tree, now)
                if decision is None:
                    continue
                state.delete(key)
                if tree.group:
                    # Its members time out on their own (and are replayed); nothing to emit.
                    expired_groups += 1
                else:
                    decisions.append(self._emit(batch, int.from_bytes(key, "big"), decision, batch.now_ms))
        if decisions:
            batch.after_commit.append(lambda: self.stats.record(0, decisions))
        if expired_groups:
            batch.after_commit.append(lambda: GROUPS.labels("timed_out").inc(expired_groups))
            log.warning("%d group copies timed out (acks lost on the way, e.g. a sink crash): their trees time out on their own", expired_groups)
        if orphans:
            log.info("dropped %d expired entries of acks whose tree had no INIT (late acks of decided trees)", orphans)

    def _emit(self, batch: Batch[MemoryStore], root_id: int, decision: Decision, now: int) -> tuple[Outcome, int]:
        tree = decision.tree
        latency = max(0, now - tree.started_ms)
        # One reused message: building a fresh TreeEvent with its nested RecordRef costs about
        # twice as much, once per tree.
        event = self._event
        event.Clear()
        event.outcome = _OUTCOME[decision.outcome]
        event.root_id = root_id
        origin = event.origin
        origin.record_id = tree.record_id
        origin.topic = self._ingest_topic
        origin.partition = tree.origin_partition
        origin.offset = tree.origin_offset
        event.attempt = tree.attempt
        event.latency_ms = latency
        event.reason = decision.reason
        event.decided_at_ms = now
        batch.emit(self._events_topic, event.SerializeToString(), key=root_key(root_id))
        return decision.outcome, latency
