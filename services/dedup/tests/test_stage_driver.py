"""The gate's decisions on onceflow.testing.StageDriver: no broker, the real exact store
(``DedupStore``: fencing and continuity scripts included) on a private redis-server, and the
transactions' dead letters, acks and dedup.changelog in memory. An id passes once per stream
whether its copies come in one batch, in later ones, after an aborted batch, or after Redis lost
what it held (the store is rebuilt from the changelog); the horizon, GC, Forget, the ack modes and
the broker's clock behave as docs/architecture.md, "Dedup gate", says.

There is no in-memory store of the gate's kind (``onceflow.state`` has MemoryStore only, which
has no Bloom filters or buckets), so the exact store here is the real one on a real Redis."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from onceflow import topology
from onceflow.acks import reader_edge
from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.state.store import StoreDiverged
from onceflow.testing import Record, StageDriver, Transaction
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import AckerMessage
from onceflow.v1.envelope_pb2 import Envelope

from onceflow_dedup import store as exact
from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.gate import AckMode, DedupGate, ForgetRequest

pytestmark = pytest.mark.dedup

SPEC = BucketSpec(bucket_ms=1000, horizon_ms=5000, expected_per_bucket=1000, false_positive_rate=0.01)
PASSED = Topic.DEDUP_RECORDS.value
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A redis-server of this module's own, on a Unix socket, keeping nothing on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server (Debian's redis-server, which `onceflow infra` installs) is not on PATH")
    home: Path = tmp_path_factory.mktemp("redis")
    socket = home / "redis.sock"
    server = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(socket), "--save", "", "--appendonly", "no", "--dir", str(home)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(unix_socket_path=str(socket))
    try:
        deadline = time.monotonic() + 10
        while not socket.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.02)
        client.ping()
        yield client
    finally:
        client.close()
        server.terminate()
        server.wait(10)


@pytest.fixture
def client(redis_server: redis.Redis) -> redis.Redis:
    redis_server.flushdb()
    return redis_server


def gate_driver(
    client: redis.Redis, gate: DedupGate | None = None, use_filters: bool = True
) -> tuple[DedupGate, StageDriver[exact.DedupStore]]:
    gate = gate or DedupGate("", AckMode.FORWARD, rekey=True)
    store = lambda partition: exact.DedupStore(client, "", partition, SPEC, use_filters=use_filters)  # noqa: E731
    return gate, StageDriver.for_hop(topology.DEDUP, gate, store=store)


def envelope(record_id: str, ingest_time_ms: int, key: bytes = b"") -> Envelope:
    return Envelope(
        record_id=record_id, root_id=new_id(), edge_id=new_id(), attempt=1,
        event_time_ms=ingest_time_ms, ingest_time_ms=ingest_time_ms, key=key, payload=b"p",
    )


def arrived(items: Sequence[Envelope | bytes], appended_ms: int | None = None) -> list[Record]:
    """ingest.records as the gate reads it; ``appended_ms``: stamped by the broker, else by nobody
    (a topic from before LogAppendTime: the gate then goes by the envelopes' ingest time)."""
    return [
        Record(item if isinstance(item, bytes) else encode_envelope(item), b"k", timestamp_ms=appended_ms,
               log_append_time=appended_ms is not None)
        for item in items
    ]


def passed(done: Transaction[exact.DedupStore]) -> list[str]:
    return [decode_envelope(record.value).record_id for record in done.topic(PASSED)]


def test_duplicates_within_one_batch_are_caught(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    done = driver.process(arrived([envelope("a", 1000), envelope("b", 1000), envelope("a", 1100), envelope("a", 1200)]))
    assert passed(done) == ["a", "b"]
    assert gate.counts.dropped == 2 and gate.counts.store_reads == 0  # the batch's own overlay answered


def test_duplicates_across_batches_need_the_store_and_are_dropped(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope(f"id-{i}", 1000) for i in range(100)]))
    again = driver.process(arrived([envelope(f"id-{i}", 2000) for i in range(100)] + [envelope("fresh", 2000)]))
    assert passed(again) == ["fresh"]
    assert (gate.counts.passed, gate.counts.dropped) == (101, 100)
    assert gate.counts.store_reads >= 100  # every duplicate was a "maybe" confirmed by Redis
    assert client.hlen(exact.StoreKeys.of("", 0).ids) == 101 == len(driver.changelog(0))


def test_forwarded_records_get_a_child_edge_that_balances_the_ack(client: redis.Redis) -> None:
    _gate, driver = gate_driver(client)
    original = envelope("x", 1000, key=b"group-7")
    first = driver.process(arrived([original]))
    (out,) = first.topic(PASSED)
    forwarded = decode_envelope(out.value)
    assert out.key == b"group-7"  # re-keyed by the grouping key
    assert forwarded.root_id == original.root_id and forwarded.edge_id != original.edge_id
    (ack,) = first.acks
    assert ack.kind == AckerMessage.ACK and ack.xor_value == original.edge_id ^ forwarded.edge_id
    duplicate = envelope("x", 2000)
    (drop_ack,) = driver.process(arrived([duplicate])).acks
    assert drop_ack.xor_value == duplicate.edge_id  # the duplicate's tree ends at the gate


def test_each_job_reading_a_stream_gets_its_own_edge_so_the_tree_waits_for_all(client: redis.Redis) -> None:
    """docs/decisions/0028: each named reader acks an edge of its own; one job's ack does not end
    the tree, and a letter re-driven to a job goes back to that job's versions alone."""
    on_stream = {"": ("picky", "usersum@2")}
    _gate, driver = gate_driver(client, DedupGate("", AckMode.FORWARD, rekey=True, readers_of=lambda s: on_stream.get(s, ())))
    original = envelope("x", 1000)
    redriven = Envelope(record_id="back", root_id=9, edge_id=90, ingest_time_ms=1000, redrive_job="usersum", redrive_count=1)
    first = driver.process(arrived([original, redriven]))
    forwarded, back = (decode_envelope(record.value) for record in first.topic(PASSED))
    assert list(forwarded.readers) == ["picky", "usersum@2"] and list(back.readers) == ["usersum@2"]
    tree = original.edge_id ^ first.acks[0].xor_value  # the INIT, then the gate's ack
    mine = {reader: reader_edge(forwarded.edge_id, reader) for reader in forwarded.readers}
    assert tree == mine["picky"] ^ mine["usersum@2"] and len(set(mine.values())) == 2
    assert tree ^ mine["picky"] != 0 and tree ^ mine["usersum@2"] != 0
    on_stream.clear()  # no reader known: one edge, as before
    (alone,) = (decode_envelope(record.value) for record in driver.process(arrived([envelope("y", 1000)])).topic(PASSED))
    assert not alone.readers


def test_terminal_and_off_ack_modes(client: redis.Redis) -> None:
    _gate, terminal = gate_driver(client, DedupGate("", AckMode.TERMINAL, rekey=True))
    item = envelope("t", 1000)
    (ack,) = terminal.process(arrived([item])).acks
    assert ack.xor_value == item.edge_id
    client.flushdb()
    _gate, off = gate_driver(client, DedupGate("", AckMode.OFF, rekey=True))
    assert off.process(arrived([envelope("o", 1000), envelope("o", 1000)])).acks == []


def test_poison_goes_to_the_dlq_with_its_reason_and_the_rest_of_the_batch_passes(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    nameless = encode_envelope(Envelope(payload=b"no id"))
    done = driver.process(arrived([envelope("good-1", 1000), b"\xff\xfenot protobuf", nameless, envelope("good-2", 1000)]))
    assert passed(done) == ["good-1", "good-2"]
    letters = done.dead_letters()
    assert [(d.stage, d.source_offset) for d in letters] == [("dedup", 1), ("dedup", 2)]
    assert letters[0].original == b"\xff\xfenot protobuf" and "not an Envelope" in letters[0].message
    assert letters[1].message == "envelope without record_id" and gate.counts.dead_letters == 2


def test_a_record_of_a_stream_gone_since_ingest_is_a_dead_letter_and_its_tree_ends(client: redis.Redis) -> None:
    _gate, driver = gate_driver(client, DedupGate("", AckMode.FORWARD, rekey=True, stream_exists=lambda s: s != "gone"))
    item = envelope("s", 1000)
    item.stream = "gone"
    done = driver.process(arrived([item]))
    (letter,) = done.dead_letters()
    assert "gone" in letter.message and "record 's'" in letter.message and done.topic(PASSED) == []
    assert [a.xor_value for a in done.acks] == [item.edge_id]


def test_gc_tombstones_buckets_past_the_horizon(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope(f"old-{i}", 1000) for i in range(10)]))
    driver.process(arrived([envelope("recent", 5500)]), punctuate=True)
    assert gate.counts.expired_ids == 0  # bucket 1000 + 5000 > bucket of 5500
    done = driver.process(arrived([envelope("newest", 6100)]), punctuate=True)
    assert sorted(k for k, v in done.changes[0].items() if v is None) == sorted(f"old-{i}".encode() for i in range(10))
    assert gate.counts.expired_ids == 10
    keys = exact.StoreKeys.of("", 0)
    assert sorted(client.hkeys(keys.ids)) == [b"newest", b"recent"] and not client.exists(keys.bucket(1000))
    assert driver.store(0).filters.buckets == [5000, 6000]
    # Past the horizon an id is not recognised: it passes again (the documented contract).
    assert passed(driver.process(arrived([envelope("old-3", 6200)]))) == ["old-3"]


def test_a_record_older_than_the_horizon_passes_unremembered(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope("now", 10_000)]))
    done = driver.process(arrived([envelope("ancient", 1000)]))
    assert passed(done) == ["ancient"] and gate.counts.beyond_horizon == 1
    assert done.changes == {}


def test_forget_commits_a_tombstone_and_lets_the_record_through_again(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope("redo", 1000)]))
    forget, unknown = ForgetRequest("redo"), ForgetRequest("never-seen")
    gate.forget_requests.put(forget)
    gate.forget_requests.put(unknown)
    assert driver.punctuate().changes == {0: {b"redo": None}}
    assert forget.done.result(0) == (True, 0) and unknown.done.result(0) == (False, -1)
    assert passed(driver.process(arrived([envelope("redo", 1100)]))) == ["redo"]


def test_without_filters_every_lookup_reads_the_store(client: redis.Redis) -> None:
    gate, driver = gate_driver(client, use_filters=False)
    driver.process(arrived([envelope(f"n-{i}", 1000) for i in range(50)]))
    assert gate.counts.store_reads == 50 and gate.counts.fast_path == 0


def test_an_aborted_batch_remembers_nothing_and_its_records_pass_once_when_read_again(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope("kept", 1000)]))
    aborted = driver.process(arrived([envelope("a", 1000), envelope("kept", 1100)]), abort=True)
    assert passed(aborted) == ["a"]  # decided, then thrown away with its transaction
    assert client.hkeys(exact.StoreKeys.of("", 0).ids) == [b"kept"] and len(driver.changelog(0)) == 1
    assert (gate.counts.passed, gate.counts.dropped) == (1, 0)
    assert passed(driver.process(aborted.records)) == ["a"]
    assert passed(driver.process(arrived([envelope("a", 1200)]))) == []
    assert [decode_envelope(r.value).record_id for r in driver.topic(PASSED)] == ["kept", "a"]


def test_a_redis_that_lost_its_ids_is_rebuilt_from_the_changelog_before_anything_is_decided(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    driver.process(arrived([envelope(f"id-{i}", 1000) for i in range(20)]))
    client.flushdb()  # a failover to an empty replica: acknowledged writes lost
    copies = arrived([envelope(f"id-{i}", 2000) for i in range(20)])
    with pytest.raises(StoreDiverged):
        driver.process(copies)
    assert client.hlen(exact.StoreKeys.of("", 0).ids) == 20  # rebuilt from dedup.changelog
    assert passed(driver.process(copies)) == [] and gate.counts.dropped == 20


# -- time from one clock, and replays it can no longer judge (issue 46) -------------------------


@pytest.mark.edges
def test_a_host_clock_behind_by_an_hour_cannot_push_its_records_past_the_horizon(client: redis.Redis) -> None:
    """The broker's append time files the id, so the slow host's retry is dropped."""
    gate, driver = gate_driver(client)
    now = 10 * HOUR_MS
    driver.process(arrived([envelope("early", now - 1000)], appended_ms=now - 1000))
    first = driver.process(arrived([envelope("slow-host", now - HOUR_MS)], appended_ms=now))
    retry = driver.process(arrived([envelope("slow-host", now + 500 - HOUR_MS)], appended_ms=now + 500))
    assert passed(first) == ["slow-host"] and passed(retry) == []
    assert gate.counts.beyond_horizon == 0 and gate.skew.behind_ms >= HOUR_MS - 1000  # measured, not obeyed


@pytest.mark.edges
def test_a_host_clock_an_hour_ahead_cannot_expire_every_bucket(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    now = 10 * HOUR_MS
    driver.process(arrived([envelope(f"id-{i}", now) for i in range(20)], appended_ms=now))
    driver.process(arrived([envelope("fast-host", now + HOUR_MS)], appended_ms=now + 100), punctuate=True)
    again = driver.process(arrived([envelope(f"id-{i}", now + 200) for i in range(20)], appended_ms=now + 200), punctuate=True)
    assert passed(again) == [] and gate.counts.expired_ids == 0 and gate.skew.ahead_ms >= HOUR_MS - 200


def replay_of(original: Envelope, first_appended_ms: int) -> Envelope:
    replay = Envelope()
    replay.CopyFrom(original)
    replay.root_id, replay.edge_id, replay.attempt, replay.first_appended_ms = new_id(), new_id(), 2, first_appended_ms
    return replay


@pytest.mark.edges
def test_a_replay_whose_original_is_past_the_horizon_is_refused_with_the_reason(client: redis.Redis) -> None:
    gate, driver = gate_driver(client)
    start = 10 * HOUR_MS
    original = envelope("r", start)
    driver.process(arrived([original], appended_ms=start))
    later = start + SPEC.horizon_ms + 3 * SPEC.bucket_ms
    driver.process(arrived([envelope("later", later)], appended_ms=later), punctuate=True)
    assert gate.counts.expired_ids == 1  # the original's id is gone from the store
    replay = replay_of(original, start)
    done = driver.process(arrived([replay], appended_ms=later + 10))
    (letter,) = done.dead_letters()
    assert passed(done) == [] and letter.error_class == "ReplayBeyondHorizon" and "beyond the dedup horizon" in letter.message
    assert [a.xor_value for a in done.acks] == [replay.edge_id]  # settled: the tree ends at the gate
    # A replay the gate can still judge is judged: here, a duplicate.
    fresh = envelope("fresh", later)
    driver.process(arrived([fresh], appended_ms=later))
    assert passed(driver.process(arrived([replay_of(fresh, later)], appended_ms=later + 20))) == []
    assert gate.counts.replays_refused == 1 and gate.counts.dropped == 1
