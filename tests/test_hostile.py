"""Hostile and broken clients against real running services (issue 39): no caller, with or
without a token, can stall a port, grow a service's memory at will, or make one call do
unbounded work. Each test attacks a service started as a process, and asserts outcomes: health
and Admin answer within a second under the attack, the attacker gets a precise status, and
what was committed is exactly what the answer says."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from onceflow.config import CommonSettings
from onceflow.redis_client import connect
from onceflow.topology import Topic
from onceflow.v1 import admin_pb2, admin_pb2_grpc, ingest_pb2, ingest_pb2_grpc, sink_pb2, sink_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client import QueryClient
from onceflow_sink import tables as sink_tables
from onceflow_sink.tables import ResultTables
from tests.conftest import Pipeline, eventually, free_port
from tests.harness import checker
from tests.harness.process import ServiceProcess

pytestmark = [pytest.mark.hostile, pytest.mark.integration]

SERVING = health_pb2.HealthCheckResponse.SERVING


def _start(pipe: Pipeline, service: str, **env: str) -> tuple[ServiceProcess, str]:
    port = free_port()
    prefix = f"ONCEFLOW_{service.upper()}_"
    proc = pipe.process(f"{service}-{len(pipe.processes)}", f"onceflow_{service}",
                        **{f"{prefix}PORT": str(port), f"{prefix}METRICS_PORT": "0", **env})
    address = f"127.0.0.1:{port}"
    proc.start()
    proc.wait_healthy(address)
    return proc, address


def _answering(address: str, times: int = 3) -> None:
    """Health/Check and Admin/Status, on a fresh connection, each within a second."""
    with grpc.insecure_channel(address) as channel:
        health, admin = health_pb2_grpc.HealthStub(channel), admin_pb2_grpc.AdminStub(channel)
        for _ in range(times):
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == SERVING
            assert admin.Status(admin_pb2.StatusRequest(), timeout=1).service
            time.sleep(0.2)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


# -- item 1: idle streams ------------------------------------------------------------------------


def test_idle_watch_and_reflection_streams_leave_health_and_admin_answering(pipeline: Pipeline) -> None:
    """100 idle Health/Watch streams and 30 idle reflection streams, none with a token, against
    an acker (a pool of 32 threads). Every Watch is answered (it holds no thread); reflection
    streams past the stream pool's 8 are refused at once with RESOURCE_EXHAUSTED; and Check and
    Status answer within a second throughout."""
    proc, address = _start(pipeline, "acker")
    channels = [grpc.insecure_channel(address) for _ in range(10)]
    hold = threading.Event()

    def idle_requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        hold.wait(60)

    try:
        watches = [
            health_pb2_grpc.HealthStub(channels[i % 10]).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            for i in range(100)
        ]
        reflections = [
            reflection_pb2_grpc.ServerReflectionStub(channels[i % 10]).ServerReflectionInfo(idle_requests(), timeout=60)
            for i in range(30)
        ]
        _answering(address, times=3)
        # Each Watch answers its first status at once: it is non-blocking, so it needs no thread.
        assert all(next(watch).status == SERVING for watch in watches)
        refused = lambda: [r for r in reflections if r.done() and r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]  # noqa: E731
        eventually(lambda: len(refused()) == 30 - 8, 20, "the reflection streams past the stream pool refused")
        assert all("blocking streams already open on this server, the limit" in r.details() for r in refused())
        _answering(address, times=5)
        assert not any(w.done() for w in watches)  # still open
    finally:
        hold.set()
        for chan in channels:
            chan.close()
    _answering(address, times=1)
    assert proc.terminate() == 0, proc.log_tail()


# -- item 2: ingest's per-stream caps ----------------------------------------------------------


def test_ingest_streams_are_capped_in_rejections_messages_and_age(pipeline: Pipeline) -> None:
    """A million empty (invalid) records on one stream: the stream ends with INVALID_ARGUMENT at
    the rejection cap, and ingest's RSS (sampled throughout) grows by a bounded amount, where
    it kept every rejection before. Then the message cap and the age cap, each ending its stream
    with RESOURCE_EXHAUSTED that says exactly what was committed."""
    proc, address = _start(
        pipeline, "ingest", ONCEFLOW_INGEST_ACKING="false", ONCEFLOW_INGEST_STREAM_MAX_MESSAGES="150",
        ONCEFLOW_INGEST_STREAM_MAX_AGE_S="8",
    )
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)])
    stub = ingest_pb2_grpc.IngestStub(channel)
    empty = ingest_pb2.IngestRequest(records=[IngestRecord()] * 10_000)
    before, peak, sampling = _rss_bytes(proc.pid), [0], threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], _rss_bytes(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with pytest.raises(grpc.RpcError) as flood:
        stub.IngestStream(iter([empty] * 100), timeout=40)
    time.sleep(0.5)
    sampling.set()
    sampler.join()
    growth = max(peak[0], _rss_bytes(proc.pid)) - before
    assert flood.value.code() == grpc.StatusCode.INVALID_ARGUMENT, flood.value.details()
    assert "more than 1000 invalid records, the limit per stream" in flood.value.details()
    assert "the 0 valid records before stream index 0 were committed, none from index 0 on" in flood.value.details()
    assert growth < 24 * 1024 * 1024, f"ingest grew by {growth / 2**20:.0f} MiB"
    _answering(address, times=1)

    def valid(tag: str, count: int) -> ingest_pb2.IngestRequest:
        return ingest_pb2.IngestRequest(records=[IngestRecord(record_id=f"{tag}{i}".encode(), payload=b"p") for i in range(count)])

    # 150 messages are allowed: 10 records, then 149 empty messages; the 151st ends the stream.
    messages = [valid("m", 10), *[ingest_pb2.IngestRequest()] * 149, valid("late", 10)]
    with pytest.raises(grpc.RpcError) as many:
        stub.IngestStream(iter(messages), timeout=30)
    assert many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert many.value.details() == (
        "stream: message 151 is past the limit of 150 messages per stream; the 10 valid records before stream "
        "index 10 were committed, none from index 10 on; send the rest on a new stream"
    )

    def slow() -> Iterator[ingest_pb2.IngestRequest]:
        yield valid("a", 5)
        time.sleep(9)
        yield valid("too-old", 5)

    with pytest.raises(grpc.RpcError) as old:
        stub.IngestStream(slow(), timeout=30)
    assert old.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "past the limit of 8 s per stream; the 5 valid records before stream index 5 were committed" in old.value.details()
    committed = sorted(checker.record_id(r) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS)))
    assert committed == sorted([f"m{i}" for i in range(10)] + [f"a{i}" for i in range(5)])
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()


# -- item 3: event time from the future ---------------------------------------------------------


def test_ingest_refuses_an_event_time_from_the_future_and_takes_one_from_the_past(pipeline: Pipeline) -> None:
    """One far-future record per partition used to hold every windowed job's watermark there
    for good. Ingest now refuses it, naming the field; a far-past one is only late, and taken
    (compute's lateness rule decides what it counts in)."""
    proc, address = _start(pipeline, "ingest", ONCEFLOW_INGEST_ACKING="false", ONCEFLOW_EVENT_TIME_MAX_AHEAD_MS="60000")
    stub = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(address))
    future = int(time.time() * 1000) + 10 * 365 * 86_400_000
    with pytest.raises(grpc.RpcError) as refused:
        stub.Ingest(ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"f", payload=b"p", event_time_ms=future)]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("records[0].event_time_ms: ") and "the limit is 60000" in refused.value.details()
    past = ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"p", payload=b"p", event_time_ms=1)])
    assert stub.Ingest(past, timeout=10).accepted == 1
    reply = stub.IngestStream(iter([ingest_pb2.IngestRequest(records=[
        IngestRecord(record_id=b"s0", payload=b"p", event_time_ms=future), IngestRecord(record_id=b"s1", payload=b"p"),
    ])]), timeout=10)
    assert reply.accepted == 1 and [(r.index, r.field) for r in reply.rejected] == [(0, "stream[0].event_time_ms")]
    committed = sorted(checker.record_id(r) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS)))
    assert committed == ["p", "s1"]
    assert proc.terminate() == 0, proc.log_tail()


# -- item 9: Query.Scan's work per call ----------------------------------------------------------

JOB = "hostile"


def test_scan_of_a_big_table_does_bounded_work_per_call_and_pages_to_exactly_the_matching_rows(pipeline: Pipeline) -> None:
    """300,000 rows, 37 of them under "match-". Scan with limit=1 and a prefix that matches
    nothing answers within a second (it used to step through the whole table, one field at a
    time) with a page token; paging on returns exactly the matching rows; and health and Admin
    answer within a second while four clients page through the table at once."""
    proc, address = _start(pipeline, "sink", ONCEFLOW_SINK_ACKING="false", ONCEFLOW_SINK_INSTANCE="a")
    redis = connect(pipeline.common.redis_url)
    key = ResultTables(redis, pipeline.common.topic_prefix).table_key(JOB)
    for start in range(0, 300_000, 20_000):
        redis.hset(key, mapping={f"k{i:06d}": b"v" for i in range(start, start + 20_000)})
    matching = {f"match-{i:02d}": f"m{i}".encode() for i in range(37)}
    redis.hset(key, mapping=matching)
    with grpc.insecure_channel(address) as channel:
        query = sink_pb2_grpc.QueryStub(channel)
        first = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, prefix="nothing-", limit=1), timeout=1)
        assert not first.rows and first.next_page_token
        errors: list[BaseException] = []

        def page_through(prefix: str) -> None:
            try:
                with QueryClient(address) as client:
                    assert dict(client.scan(JOB, prefix, page_size=1)) == ({} if prefix == "nothing-" else matching)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        readers = [threading.Thread(target=page_through, args=(p,)) for p in ("nothing-", "match-", "match-", "nothing-")]
        for reader in readers:
            reader.start()
        _answering(address, times=3)
        for reader in readers:
            reader.join(40)
        assert not errors, errors
    with QueryClient(address) as client:
        assert dict(client.scan(JOB, "match-1")) == {k: v for k, v in matching.items() if k.startswith("match-1")}
    assert proc.terminate() == 0, proc.log_tail()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.text(alphabet="ab*?[]\\", max_size=3), limit=st.integers(1, 7))
def test_scan_pages_that_stop_early_still_return_exactly_the_matching_rows(
    infra: None, monkeypatch: pytest.MonkeyPatch, prefix: str, limit: int
) -> None:
    """Every call takes one small step (a deadline already passed): pages come back short or
    empty with tokens, and following the tokens yields each row under the prefix exactly once."""
    monkeypatch.setattr(sink_tables, "SCAN_STEP_COUNT", 1)
    redis = connect(CommonSettings().redis_url)
    tables = ResultTables(redis, "hostile-scan.")
    # 196 fields: past Redis' listpack size, so HSCAN steps through buckets, a few at a time.
    rows = {a + b + c: (a + b + c).encode() for a in "ab*?[]\\" for b in "ab*?[]\\" for c in "ab[]"}
    redis.hset(tables.table_key(JOB), mapping=rows)
    seen: list[str] = []
    token = b""
    while True:
        page, token = tables.scan(JOB, prefix, limit, token, deadline=0.0)
        assert len(page) <= limit
        seen += [k for k, _ in page]
        if not token:
            break
    assert sorted(seen) == sorted(k for k in rows if k.startswith(prefix))
