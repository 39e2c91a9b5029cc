"""The gate's decisions and the fenced exact store, against the real Redis (no Kafka: batches are
built by hand and "commit" is the loop's post-commit apply, called directly)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message

from onceflow.acks import reader_edge
from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.topology import Topic
from onceflow.txn.batch import Batch
from onceflow.txn.errors import FencedError
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope

from onceflow_dedup import store as exact
from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.gate import AckMode, DedupGate, ForgetRequest

pytestmark = [pytest.mark.dedup, pytest.mark.integration]

SPEC = BucketSpec(bucket_ms=1000, horizon_ms=5000, expected_per_bucket=1000, false_positive_rate=0.01)


class Stores:
    """What a Batch needs of PartitionStores."""

    def __init__(self, stores: dict[int, exact.DedupStore]) -> None:
        self._stores = stores

    def __getitem__(self, partition: int) -> exact.DedupStore:
        return self._stores[partition]

    @property
    def partitions(self) -> list[int]:
        return sorted(self._stores)


@pytest.fixture
def client(infra: None) -> Iterator[redis.Redis]:
    conn = connect(CommonSettings().redis_url)
    yield conn
    conn.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    prefix = f"g{uuid.uuid4().hex[:8]}."
    yield prefix
    delete_prefix(client, prefix)


def envelope(record_id: str, ingest_time_ms: int, key: bytes = b"") -> Envelope:
    return Envelope(
        record_id=record_id, root_id=new_id(), edge_id=new_id(), attempt=1,
        event_time_ms=ingest_time_ms, ingest_time_ms=ingest_time_ms, key=key, payload=b"p",
    )


def message(value: bytes, partition: int = 0, offset: int = 0, appended_ms: int | None = None) -> Message:
    """A consumed record; ``appended_ms``: stamped by the broker (LogAppendTime), else by its writer."""
    if appended_ms is None:
        return Message(topic=Topic.INGEST_RECORDS, partition=partition, offset=offset, key=b"k", value=value)
    return Message(topic=Topic.INGEST_RECORDS, partition=partition, offset=offset, key=b"k", value=value,
                   timestamp=(TIMESTAMP_LOG_APPEND_TIME, appended_ms))


class Harness:
    def __init__(self, client: redis.Redis, prefix: str, ack_mode: AckMode = AckMode.FORWARD, use_filters: bool = True) -> None:
        self.client = client
        self.prefix = prefix
        self.gate = DedupGate("", ack_mode, rekey=True)
        self.stores = Stores({0: exact.DedupStore(client, prefix, 0, SPEC, use_filters=use_filters)})
        self.offset = 0

    def run(self, envelopes: list[Envelope | bytes], punctuate: bool = False, appended_ms: int | None = None) -> Batch:
        records = []
        for item in envelopes:
            value = item if isinstance(item, bytes) else encode_envelope(item)
            records.append(message(value, offset=self.offset, appended_ms=appended_ms))
            self.offset += 1
        batch = Batch(records, self.stores, Topic.DEDUP_DLQ, "dedup", Topic.ACKER_ACKS)  # type: ignore[arg-type]
        if records:
            self.gate.process(batch)
        if punctuate:
            self.gate.punctuate(batch)
        batch.seal()
        self.commit(batch)
        return batch

    def commit(self, batch: Batch) -> None:
        """What the loop does once the transaction committed."""
        for partition, overlay in batch.overlays.items():
            self.stores[partition].apply(overlay.changes, self.offset)
        for callback in batch.after_commit:
            callback()


def passed_ids(batch: Batch) -> list[str]:
    return [decode_envelope(o.value).record_id for o in batch.outputs if o.topic == Topic.DEDUP_RECORDS]


def acks(batch: Batch) -> list[AckerMessage]:
    return [m for o in batch.outputs if o.topic == Topic.ACKER_ACKS for m in AckerBatch.FromString(o.value).messages]


def test_duplicates_within_one_batch_are_caught(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    batch = gate.run([envelope("a", 1000), envelope("b", 1000), envelope("a", 1100), envelope("a", 1200)])
    assert passed_ids(batch) == ["a", "b"]
    assert gate.gate.counts.dropped == 2
    assert gate.gate.counts.store_reads == 0  # the batch's own overlay answered


def test_duplicates_across_batches_need_the_store_and_are_dropped(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    gate.run([envelope(f"id-{i}", 1000) for i in range(100)])
    again = gate.run([envelope(f"id-{i}", 2000) for i in range(100)] + [envelope("fresh", 2000)])
    assert passed_ids(again) == ["fresh"]
    counts = gate.gate.counts
    assert (counts.passed, counts.dropped) == (101, 100)
    assert counts.store_reads >= 100  # every duplicate was a "maybe" confirmed by Redis
    assert client.hlen(exact.StoreKeys.of(prefix, 0).ids) == 101


def test_forwarded_records_get_a_child_edge_that_balances_the_ack(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    original = envelope("x", 1000, key=b"group-7")
    first = gate.run([original])
    (out,) = [o for o in first.outputs if o.topic == Topic.DEDUP_RECORDS]
    forwarded = decode_envelope(out.value)
    assert out.key == b"group-7"  # re-keyed by the grouping key
    assert forwarded.root_id == original.root_id and forwarded.edge_id != original.edge_id
    (ack,) = acks(first)
    assert ack.kind == AckerMessage.ACK and ack.xor_value == original.edge_id ^ forwarded.edge_id
    duplicate = envelope("x", 2000)
    (drop_ack,) = acks(gate.run([duplicate]))
    assert drop_ack.xor_value == duplicate.edge_id  # the duplicate's tree ends at the gate


def test_each_job_reading_a_stream_gets_its_own_edge_so_the_tree_waits_for_all(client: redis.Redis, prefix: str) -> None:
    """Two jobs on one stream each acked the one forwarded edge: XOR cancelled it and no tree
    completed (docs/decisions/0028). Each named reader now acks an edge of its own."""
    gate = Harness(client, prefix)
    on_stream = {"": ("picky", "usersum@2")}
    gate.gate = DedupGate("", AckMode.FORWARD, rekey=True, readers_of=lambda s: on_stream.get(s, ()))
    original = envelope("x", 1000)
    first = gate.run([original, Envelope(record_id="back", root_id=9, edge_id=90, ingest_time_ms=1000, redrive_job="usersum",
                                         redrive_count=1)])
    forwarded, redriven = (decode_envelope(o.value) for o in first.outputs if o.topic == Topic.DEDUP_RECORDS)
    assert list(forwarded.readers) == ["picky", "usersum@2"]
    assert list(redriven.readers) == ["usersum@2"]  # a letter goes back to its job's versions alone
    gate_ack, _redriven_ack = acks(first)
    c = forwarded.edge_id
    tree = original.edge_id ^ gate_ack.xor_value  # the INIT, then the gate's ack
    mine = {reader: reader_edge(c, reader) for reader in forwarded.readers}
    assert tree == mine["picky"] ^ mine["usersum@2"] and len(set(mine.values())) == 2
    assert tree ^ mine["picky"] != 0 and tree ^ mine["usersum@2"] != 0  # one job's ack does not end it
    assert tree ^ mine["picky"] ^ mine["usersum@2"] == 0
    assert tree ^ c ^ c != 0  # the bug: both acking the one edge cancels it out
    on_stream.clear()  # no reader known: one edge, as before
    (alone,) = (decode_envelope(o.value) for o in gate.run([envelope("y", 1000)]).outputs if o.topic == Topic.DEDUP_RECORDS)
    assert not alone.readers


def test_terminal_and_off_ack_modes(client: redis.Redis, prefix: str) -> None:
    terminal = Harness(client, prefix, AckMode.TERMINAL)
    item = envelope("t", 1000)
    (ack,) = acks(terminal.run([item]))
    assert ack.xor_value == item.edge_id
    off = Harness(client, prefix + "off.", AckMode.OFF)
    assert acks(off.run([envelope("o", 1000), envelope("o", 1000)])) == []


def test_poison_goes_to_the_dlq_and_the_rest_of_the_batch_passes(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    batch = gate.run([envelope("good-1", 1000), b"\xff\xfenot protobuf", encode_envelope(Envelope(payload=b"no id")), envelope("good-2", 1000)])
    assert passed_ids(batch) == ["good-1", "good-2"]
    letters = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.DEDUP_DLQ]
    assert len(letters) == 2 and letters[1].message == "envelope without record_id"
    assert letters[0].original == b"\xff\xfenot protobuf" and letters[0].stage == "dedup"
    assert gate.gate.counts.dead_letters == 2


def test_gc_tombstones_buckets_past_the_horizon(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    gate.run([envelope(f"old-{i}", 1000) for i in range(10)])
    gate.run([envelope("recent", 5500)], punctuate=True)
    assert gate.gate.counts.expired_ids == 0  # bucket 1000 + 5000 > bucket of 5500
    batch = gate.run([envelope("newest", 6100)], punctuate=True)
    tombstones = [k for k, v in batch.overlays[0].changes.items() if v is None]
    assert sorted(tombstones) == sorted(f"old-{i}".encode() for i in range(10))
    assert gate.gate.counts.expired_ids == 10
    keys = exact.StoreKeys.of(prefix, 0)
    assert sorted(client.hkeys(keys.ids)) == [b"newest", b"recent"]
    assert not client.exists(keys.bucket(1000))
    assert gate.stores[0].filters.buckets == [5000, 6000]
    # Past the horizon an id is not recognised: it passes again (the documented contract).
    assert passed_ids(gate.run([envelope("old-3", 6200)])) == ["old-3"]


def test_a_record_older_than_the_horizon_passes_unremembered(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    gate.run([envelope("now", 10_000)])
    batch = gate.run([envelope("ancient", 1000)])
    assert passed_ids(batch) == ["ancient"] and gate.gate.counts.beyond_horizon == 1
    assert b"ancient" not in batch.overlays[0].changes


def test_forget_commits_a_tombstone_and_lets_the_record_through_again(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    gate.run([envelope("redo", 1000)])
    forget, unknown = ForgetRequest("redo"), ForgetRequest("never-seen")
    gate.gate.forget_requests.put(forget)
    gate.gate.forget_requests.put(unknown)
    gate.run([], punctuate=True)
    assert forget.done.result(0) == (True, 0) and unknown.done.result(0) == (False, -1)
    assert passed_ids(gate.run([envelope("redo", 1100)])) == ["redo"]


def test_a_new_owner_fences_the_old_one_out_of_the_store(client: redis.Redis, prefix: str) -> None:
    old = exact.DedupStore(client, prefix, 0, SPEC)
    old.apply({b"a": b"1000"}, checkpoint=1)
    new = exact.DedupStore(client, prefix, 0, SPEC)  # the replacement takes the partition
    assert new.token > old.token and new.checkpoint == 1
    assert new.might_contain("a")  # filters rebuilt from the exact store
    with pytest.raises(FencedError, match="stale"):
        old.apply({b"zombie": b"1000", b"a": None}, checkpoint=2)
    assert exact.rejected_writes(client, prefix, 0) == 1
    assert client.hget(new.keys.ids, b"zombie") is None and client.hget(new.keys.ids, b"a") == b"1000"
    new.apply({b"b": b"2000"}, checkpoint=2)
    assert new.checkpoint == 2 and client.hget(new.keys.meta, "checkpoint") == b"2"


def test_the_checkpoint_never_moves_back_and_large_applies_are_chunked(client: redis.Redis, prefix: str) -> None:
    store = exact.DedupStore(client, prefix, 0, SPEC)
    many = {f"id-{i}".encode(): b"1000" for i in range(exact.APPLY_CHUNK * 2 + 5)}
    store.apply(many, checkpoint=10)
    store.apply({}, checkpoint=5)
    assert client.hget(store.keys.meta, "checkpoint") == b"10"
    assert client.hlen(store.keys.ids) == len(many) and client.scard(store.keys.bucket(1000)) == len(many)


def test_without_filters_every_lookup_reads_the_store(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix, use_filters=False)
    gate.run([envelope(f"n-{i}", 1000) for i in range(50)])
    assert gate.gate.counts.store_reads == 50 and gate.gate.counts.fast_path == 0


# -- time from one clock, and replays it can no longer judge (issue 46) -------------------------

HOUR_MS = 3_600_000


@pytest.mark.edges
def test_a_host_clock_behind_by_an_hour_cannot_push_its_records_past_the_horizon(client: redis.Redis, prefix: str) -> None:
    """An ingest host an hour slow stamps ingest_time an hour back; the broker's append time is
    what files the id, so it is remembered and its retry is dropped. On writer time (the old
    rule) it was beyond the horizon: passed unremembered, and the retry passed again."""
    gate = Harness(client, prefix)
    now = 10 * HOUR_MS
    gate.run([envelope("early", now - 1000)], appended_ms=now - 1000)
    first = gate.run([envelope("slow-host", now - HOUR_MS)], appended_ms=now)
    retry = gate.run([envelope("slow-host", now + 500 - HOUR_MS)], appended_ms=now + 500)
    assert passed_ids(first) == ["slow-host"] and passed_ids(retry) == []
    assert gate.gate.counts.beyond_horizon == 0
    assert gate.gate.skew.behind_ms >= HOUR_MS - 1000  # measured, not obeyed


@pytest.mark.edges
def test_a_host_clock_an_hour_ahead_cannot_expire_every_bucket(client: redis.Redis, prefix: str) -> None:
    gate = Harness(client, prefix)
    now = 10 * HOUR_MS
    gate.run([envelope(f"id-{i}", now) for i in range(20)], appended_ms=now)
    gate.run([envelope("fast-host", now + HOUR_MS)], appended_ms=now + 100, punctuate=True)
    again = gate.run([envelope(f"id-{i}", now + 200) for i in range(20)], appended_ms=now + 200, punctuate=True)
    assert passed_ids(again) == []
    assert gate.gate.counts.expired_ids == 0
    assert gate.gate.skew.ahead_ms >= HOUR_MS - 200


@pytest.mark.edges
def test_a_replay_whose_original_is_past_the_horizon_is_refused_with_the_reason(client: redis.Redis, prefix: str) -> None:
    """The gate forgot the original (GC past the horizon): a replay of it may apply it twice,
    so it is dead-lettered with the reason and its tree ends here, instead of passing."""
    gate = Harness(client, prefix)
    start = 10 * HOUR_MS
    original = envelope("r", start)
    gate.run([original], appended_ms=start)
    later = start + SPEC.horizon_ms + 3 * SPEC.bucket_ms
    gate.run([envelope("later", later)], appended_ms=later, punctuate=True)
    assert gate.gate.counts.expired_ids == 1  # the original's id is gone from the store
    replay = Envelope()
    replay.CopyFrom(original)
    replay.root_id, replay.edge_id, replay.attempt, replay.first_appended_ms = new_id(), new_id(), 2, start
    batch = gate.run([replay], appended_ms=later + 10)
    assert passed_ids(batch) == []
    (letter,) = [DeadLetter.FromString(o.value) for o in batch.outputs if o.topic == Topic.DEDUP_DLQ]
    assert letter.error_class == "ReplayBeyondHorizon" and "beyond the dedup horizon" in letter.message
    (ack,) = acks(batch)
    assert ack.xor_value == replay.edge_id  # settled: the tree ends at the gate
    assert gate.gate.counts.replays_refused == 1

    # A first attempt as old (a client's own late re-send) is the documented horizon contract;
    # and a replay the gate can still judge is judged: here, a duplicate.
    fresh = envelope("fresh", later)
    gate.run([fresh], appended_ms=later)
    known = Envelope()
    known.CopyFrom(fresh)
    known.root_id, known.edge_id, known.attempt, known.first_appended_ms = new_id(), new_id(), 2, later
    assert passed_ids(gate.run([known], appended_ms=later + 20)) == []
    assert gate.gate.counts.replays_refused == 1 and gate.gate.counts.dropped == 1
