"""Ingest against the real broker: what it accepts is committed, what it refuses is refused
precisely, and a kill -9 with retrying clients loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onceflow import topology
from onceflow.admin.tls import ClientTLS
from onceflow.codec import decode_envelope
from onceflow_client import IngestClient, RetryPolicy
from onceflow_tools.infra.certs import CertAuthority
from onceflow.topology import Topic
from onceflow.v1 import admin_pb2, admin_pb2_grpc, ingest_pb2, ingest_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from tests.conftest import Pipeline, eventually, free_port
from tests.harness import checker
from tests.harness.process import ServiceProcess
from tests.harness.workload import ingest_records, items

pytestmark = [pytest.mark.foundation, pytest.mark.integration]

INGEST = "onceflow_ingest"


def _ingest(pipe: Pipeline, health_tls: ClientTLS | None = None, **env: str) -> tuple[ServiceProcess, str]:
    port = free_port()
    # No acker in these tests: acking off, so max_pending counts uncommitted records only.
    env = {"ONCEFLOW_INGEST_ACKING": "false", **env}
    proc = pipe.process(f"ingest-{len(pipe.processes)}", INGEST, ONCEFLOW_INGEST_PORT=str(port),
                        ONCEFLOW_INGEST_METRICS_PORT="0", **env)
    address = f"127.0.0.1:{port}"
    proc.start()
    proc.wait_healthy(address, tls=health_tls)
    return proc, address


def _committed(pipe: Pipeline) -> list[checker.TopicRecord]:
    return checker.read_committed(pipe.common, pipe.topic(Topic.INGEST_RECORDS))


def test_ten_thousand_records_are_all_readable_read_committed(pipeline: Pipeline) -> None:
    proc, address = _ingest(pipeline)
    batch = items("ten-k", 10_000)
    with IngestClient(address) as client:
        for start in range(0, len(batch), 500):
            reply = client.ingest(ingest_records(batch[start : start + 500]))
            assert reply.accepted == 500
        assert client.retries == 0
    report = checker.DeliveryReport.of(_committed(pipeline), [i.record_id for i in batch])
    report.assert_exactly_once()
    assert checker.hanging_transactions(pipeline.common, [pipeline.topic(Topic.INGEST_RECORDS)]) == {}
    assert proc.terminate() == 0, proc.log_tail()


class RetryingSender(threading.Thread):
    """A client that keeps sending batches and retries each until ingest confirms it."""

    def __init__(self, address: str, batch: list, size: int, pause_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.pause_s = pause_s
        self.client = IngestClient(address, RetryPolicy(max_attempts=200, backoff_s=0.05, call_timeout_s=20))
        self.batches = [batch[i : i + size] for i in range(0, len(batch), size)]
        self.acknowledged: list[str] = []
        self.retried: set[str] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in self.batches:
                before = self.client.retries
                self.client.ingest(ingest_records(chunk))
                ids = [i.record_id for i in chunk]
                if self.client.retries != before:
                    self.retried.update(ids)
                self.acknowledged.extend(ids)
                time.sleep(self.pause_s)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            self.error = exc


@pytest.mark.fault
def test_kill9_mid_stream_with_retrying_client_loses_nothing(pipeline: Pipeline) -> None:
    proc, address = _ingest(pipeline)
    batch = items("kill9", 6000)
    # Paced so that the stream is certainly still running when the kill comes.
    sender = RetryingSender(address, batch, size=100, pause_s=0.02)
    sender.start()
    eventually(lambda: len(sender.acknowledged) >= 1000, 60, "ingest to accept 1000 records", interval_s=0.05)
    assert sender.is_alive()
    assert proc.kill9() == -9
    time.sleep(0.5)
    proc.start()
    sender.join(180)
    assert not sender.is_alive() and sender.error is None, sender.error
    assert sender.client.retries > 0, "the kill should have forced at least one retry"
    report = checker.DeliveryReport.of(_committed(pipeline), sender.acknowledged, allowed_duplicates=sender.retried)
    report.assert_at_least_once()
    assert len(sender.acknowledged) == len(batch)
    assert checker.hanging_transactions(pipeline.common, [pipeline.topic(Topic.INGEST_RECORDS)], wait_s=30) == {}
    assert proc.terminate() == 0, proc.log_tail()


def _expect(code: grpc.StatusCode, text: str, call, *args) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details(), info.value.details()


@pytest.mark.security
def test_bad_requests_get_precise_errors_and_lose_nothing_valid(pipeline: Pipeline) -> None:
    proc, address = _ingest(
        pipeline, ONCEFLOW_INGEST_MAX_PAYLOAD_BYTES="1000", ONCEFLOW_INGEST_MAX_REQUEST_RECORDS="5",
        ONCEFLOW_INGEST_MAX_REQUEST_BYTES="2000000",
    )
    channel = grpc.insecure_channel(address)
    stub = ingest_pb2_grpc.IngestStub(channel)
    ok = IngestRecord(record_id=b"fine", payload=b"p")
    bad = {
        "records[1].record_id: required": IngestRecord(payload=b"no id"),
        "records[1].record_id: 257 bytes, the limit is 256": IngestRecord(record_id=b"x" * 257),
        "records[1].record_id: not valid UTF-8": IngestRecord(record_id=b"bad\xc3("),
        "records[1].payload: 1001 bytes, the limit is 1000": IngestRecord(record_id=b"big", payload=b"p" * 1001),
        # Near Kafka's message limit: refused alone, before it can fail a group commit it shares.
        "records[1].headers['trace']: 900000 bytes, the limit is 16384": IngestRecord(record_id=b"hdr", headers={"trace": "v" * 900_000}),
    }
    for message, record in bad.items():
        request = ingest_pb2.IngestRequest(records=[ok, record])
        _expect(grpc.StatusCode.INVALID_ARGUMENT, message, stub.Ingest, request)
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "records: empty batch", stub.Ingest, ingest_pb2.IngestRequest())
    _expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "needs acking",
        stub.Ingest,
        ingest_pb2.IngestRequest(records=[ok], wait=ingest_pb2.WAIT_FOR_PROCESSED),
    )
    # A unary batch is all or nothing: none of the refused batches' valid "fine" record landed.
    assert stub.Ingest(ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"after")]), timeout=10).accepted == 1

    # A stream is record by record: the valid ones commit, the invalid ones are listed.
    stream = [
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"s0"), IngestRecord(record_id=b"")]),
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"\xff"), IngestRecord(record_id=b"s3")]),
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"s4", payload=b"p" * 5000)]),
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"s5")]),
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"s6", headers={"h": "v" * 20_000}), IngestRecord(record_id=b"s7")]),
    ]
    reply = stub.IngestStream(iter(stream), timeout=30)
    assert reply.accepted == 4
    assert [(r.index, r.field) for r in reply.rejected] == [
        (1, "stream[1].record_id"),
        (2, "stream[2].record_id"),
        (4, "stream[4].payload"),
        (6, "stream[6].headers['h']"),
    ]
    # A stream message past the per-message cap ends the stream, naming what it had committed.
    too_many = [
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"t0")]),
        ingest_pb2.IngestRequest(records=[IngestRecord(record_id=f"t{i}".encode()) for i in range(1, 7)]),
    ]
    _expect(
        grpc.StatusCode.INVALID_ARGUMENT, "a message of 6 records, the limit per message is 5 (1 records of this stream",
        stub.IngestStream, iter(too_many),
    )
    # A request over the byte cap is refused by gRPC before ingest reads it.
    huge = ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"huge", payload=b"p" * 3_000_000)])
    _expect(grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max", stub.Ingest, huge)
    channel.close()
    ids = sorted(checker.record_id(r) for r in _committed(pipeline))
    assert ids == ["after", "s0", "s3", "s5", "s7", "t0"]
    assert proc.alive()
    assert proc.terminate() == 0, proc.log_tail()


def test_backpressure_answers_resource_exhausted_with_a_retry_hint(pipeline: Pipeline, broker) -> None:
    proc, address = _ingest(pipeline, ONCEFLOW_INGEST_MAX_PENDING="100")
    channel = grpc.insecure_channel(address)
    stub = ingest_pb2_grpc.IngestStub(channel)
    admin = admin_pb2_grpc.AdminStub(channel)
    stub.Ingest(ingest_pb2.IngestRequest(records=ingest_records(items("warm", 10))), timeout=30)
    results: list = []
    broker_pid = broker.pid()
    import os
    import signal

    os.kill(broker_pid, signal.SIGSTOP)  # commits now hang, so records stay pending
    try:
        blocked = threading.Thread(
            target=lambda: results.append(stub.Ingest(ingest_pb2.IngestRequest(records=ingest_records(items("held", 100))), timeout=120)),
            daemon=True,
        )
        blocked.start()
        eventually(
            lambda: admin.Status(admin_pb2.StatusRequest(), timeout=5).gauges["pending"] == 100, 30, "100 pending"
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Ingest(ingest_pb2.IngestRequest(records=ingest_records(items("extra", 1))), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_pending is 100" in info.value.details()
        assert dict(info.value.trailing_metadata())["retry-after-ms"] == "200"
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    blocked.join(120)
    assert results and results[0].accepted == 100
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.security
def test_admin_status_pause_needs_token_and_sigterm_is_clean(pipeline: Pipeline) -> None:
    proc, address = _ingest(pipeline)
    channel = grpc.insecure_channel(address)
    admin = admin_pb2_grpc.AdminStub(channel)
    stub = ingest_pb2_grpc.IngestStub(channel)
    status = admin.Status(admin_pb2.StatusRequest(), timeout=5)
    assert (status.service, status.state, status.instance) == ("ingest", "RUNNING", "ingest-0")

    with pytest.raises(grpc.RpcError) as info:
        admin.Pause(admin_pb2.PauseRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        admin.Pause(admin_pb2.PauseRequest(), timeout=5, metadata=(("authorization", "Bearer wrong"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    token = (("authorization", "Bearer test-token"),)
    assert admin.Pause(admin_pb2.PauseRequest(), timeout=5, metadata=token).state == "PAUSED"
    request = ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"while-paused")])
    _expect(grpc.StatusCode.UNAVAILABLE, "paused", stub.Ingest, request)
    assert admin.Resume(admin_pb2.ResumeRequest(), timeout=5, metadata=token).state == "RUNNING"
    assert stub.Ingest(request, timeout=10).accepted == 1
    assert admin.Status(admin_pb2.StatusRequest(), timeout=5).transactions_committed >= 1
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()
    assert "stopped cleanly" in proc.log_tail()


@pytest.mark.security
def test_open_streams_past_the_call_limit_are_refused_and_health_and_admin_still_answer(pipeline: Pipeline) -> None:
    """Slow calls (idle streams here, wait=PROCESSED in production) cannot take the threads that
    health checks and Admin calls need: past max_concurrent_calls a call is refused at once."""
    proc, address = _ingest(pipeline, ONCEFLOW_INGEST_MAX_CONCURRENT_CALLS="2")
    channel = grpc.insecure_channel(address)
    stub = ingest_pb2_grpc.IngestStub(channel)
    release = threading.Event()

    def idle_stream(name: str) -> Iterator[ingest_pb2.IngestRequest]:
        yield ingest_pb2.IngestRequest(records=[IngestRecord(record_id=name.encode())])
        release.wait(60)

    streams = [stub.IngestStream.future(idle_stream(f"open{i}"), timeout=90) for i in range(2)]
    try:
        eventually(lambda: len(_committed(pipeline)) == 2, 30, "both streams' first records committed")
        _expect(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "2 calls already in progress, the limit", stub.Ingest,
            ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"third")]),
        )
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5).state == "RUNNING"
    finally:
        release.set()
    assert [stream.result().accepted for stream in streams] == [1, 1]
    assert stub.Ingest(ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"later")]), timeout=10).accepted == 1
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.security
def test_slow_processed_waits_past_the_call_limit_leave_health_and_admin_answering_within_a_second(pipeline: Pipeline) -> None:
    """No acker runs here, so every wait=PROCESSED call waits for a tree nobody completes: the
    slowest call a client can make. Twice the call limit of them at once: those past the limit
    are refused at once, and health and Admin answer within a second all along."""
    limit = 4
    proc, address = _ingest(
        pipeline, ONCEFLOW_INGEST_ACKING="true", ONCEFLOW_INGEST_MAX_CONCURRENT_CALLS=str(limit),
        ONCEFLOW_INGEST_PROCESSED_WAIT_S="15",
    )
    channel = grpc.insecure_channel(address)
    stub = ingest_pb2_grpc.IngestStub(channel)
    calls = [
        stub.Ingest.future(
            ingest_pb2.IngestRequest(records=[IngestRecord(record_id=f"slow{i}".encode())], wait=ingest_pb2.WAIT_FOR_PROCESSED),
            timeout=60,
        )
        for i in range(2 * limit)
    ]
    refused = lambda: [c for c in calls if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]  # noqa: E731
    eventually(lambda: len(refused()) == limit, 30, f"{limit} calls past the limit refused")
    assert all("calls already in progress, the limit" in c.details() for c in refused())
    health, admin = health_pb2_grpc.HealthStub(channel), admin_pb2_grpc.AdminStub(channel)
    for _ in range(5):
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING
        assert admin.Status(admin_pb2.StatusRequest(), timeout=1).state == "RUNNING"
        time.sleep(0.5)
    held = [c for c in calls if c not in refused()]
    assert not any(c.done() for c in held)  # still waiting for their trees
    eventually(lambda: all(c.done() for c in held), 40, "the held calls to reach ingest's processed wait")
    assert {c.code() for c in held} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert all("committed (commit" in c.details() for c in held)
    assert sorted(checker.record_id(r) for r in _committed(pipeline)) == sorted(
        f"slow{i}" for i, c in enumerate(calls) if c in held
    )
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.security
def test_a_megabyte_header_among_other_clients_records_is_refused_alone(pipeline: Pipeline) -> None:
    """Eight clients send at once, so their records share group commits; one record carries a
    1 MB header (past Kafka's message limit, were it produced). Only that call is refused,
    naming the header; every other record commits."""
    proc, address = _ingest(pipeline)
    channel = grpc.insecure_channel(address)
    stub = ingest_pb2_grpc.IngestStub(channel)
    start = threading.Barrier(9)
    accepted: list[int] = []

    def client(n: int) -> None:
        start.wait()
        for batch in range(5):
            records = [IngestRecord(record_id=f"c{n}-{batch}-{i}".encode(), payload=b"p") for i in range(20)]
            accepted.append(stub.Ingest(ingest_pb2.IngestRequest(records=records), timeout=30).accepted)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(8)]
    for thread in threads:
        thread.start()
    start.wait()
    huge = IngestRecord(record_id=b"huge-header", payload=b"p", headers={"trace": "v" * 1_000_000})
    _expect(grpc.StatusCode.INVALID_ARGUMENT, "records[0].headers['trace']: 1000000 bytes", stub.Ingest,
            ingest_pb2.IngestRequest(records=[huge]))
    for thread in threads:
        thread.join(60)
    assert accepted == [20] * 40
    ids = [checker.record_id(r) for r in _committed(pipeline)]
    assert len(ids) == len(set(ids)) == 800 and "huge-header" not in ids
    channel.close()
    assert proc.terminate() == 0, proc.log_tail()


_RECORD_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "record_id": st.binary(max_size=300),
        "payload": st.binary(max_size=1200),
        "key": st.binary(max_size=300),
        "event_time_ms": st.integers(min_value=-(2**63), max_value=2**63 - 1),
        "headers": st.dictionaries(st.text(max_size=300), st.text(max_size=40), max_size=40),
    },
)


def _parsed(raw: bytes) -> IngestRecord:
    """Arbitrary bytes as a record where they parse (unknown fields and all); else a valid
    record with those bytes appended as they are, which may or may not still parse."""
    for candidate in (raw, IngestRecord(record_id=b"r", payload=b"p").SerializeToString() + raw):
        try:
            return IngestRecord.FromString(candidate)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
            continue
    return IngestRecord()


@pytest.mark.security
def test_ingest_validation_fuzzed_answers_ok_or_invalid_argument_and_never_crashes(pipeline: Pipeline) -> None:
    """Hypothesis over whole requests of arbitrary records (field values, and raw bytes that
    parse as a record), then over arbitrary request bytes: every call is OK or INVALID_ARGUMENT, never INTERNAL or UNKNOWN, and
    the service stays up. What was accepted is exactly what was committed."""
    proc, address = _ingest(pipeline, ONCEFLOW_INGEST_MAX_PAYLOAD_BYTES="1000", ONCEFLOW_INGEST_MAX_REQUEST_RECORDS="5")
    stub = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(address))
    accepted: list[str] = []

    any_record = st.one_of(_RECORD_FIELDS.map(lambda f: IngestRecord(**f)), st.binary(max_size=400).map(_parsed))
    valid_record = st.builds(
        IngestRecord, record_id=st.text(min_size=1, max_size=60).map(str.encode), payload=st.binary(max_size=1000),
        key=st.binary(max_size=100), event_time_ms=st.integers(0, 2**63 - 1),
    )

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(st.lists(any_record, max_size=7), st.lists(valid_record, min_size=1, max_size=5)))
    def call(records: list[IngestRecord]) -> None:
        try:
            reply = stub.Ingest(ingest_pb2.IngestRequest(records=records), timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details(), records)
            assert exc.details(), records
            return
        assert reply.accepted == len(records)
        accepted.extend(record.record_id.decode() for record in records)

    # Whole requests as arbitrary bytes, most of which do not parse at all: INVALID_ARGUMENT
    # naming the method (the servers' parse interceptor), never grpcio's INTERNAL.
    raw_ingest = grpc.insecure_channel(address).unary_unary("/onceflow.v1.Ingest/Ingest")

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.binary(max_size=600))
    def raw_call(raw: bytes) -> None:
        try:
            request = ingest_pb2.IngestRequest.FromString(raw)
        except Exception:  # noqa: BLE001 - does not parse: the server must say so
            request = None
        assume(request is None or request.wait == ingest_pb2.WAIT_FOR_COMMITTED)  # no acker runs here
        try:
            raw_ingest(raw, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details(), raw)
            if request is None:
                assert "/onceflow.v1.Ingest/Ingest: the request does not parse" in exc.details(), exc.details()
            return
        assert request is not None, raw
        accepted.extend(record.record_id.decode() for record in request.records)

    call()
    raw_call()
    # A stream whose second message does not parse (make fuzz found grpcio's INTERNAL here): the
    # call is refused naming the message; the first, committed as it came, stays (docs/client.md).
    raw_stream = grpc.insecure_channel(address).stream_unary("/onceflow.v1.Ingest/IngestStream")
    first = ingest_pb2.IngestRequest(records=[IngestRecord(record_id=b"stream-ok", payload=b"{}")]).SerializeToString()
    with pytest.raises(grpc.RpcError) as refused:
        raw_stream(iter([first, b"\x84"]), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (refused.value.code(), refused.value.details())
    assert "IngestStream: message 1 does not parse" in (refused.value.details() or "")
    accepted.append("stream-ok")
    assert proc.alive(), proc.log_tail()
    assert accepted, "no example was valid: the fuzz never reached the commit path"
    committed = sorted(checker.record_id_of_bytes(r.value) for r in _committed(pipeline))
    assert committed == sorted(accepted)


def test_a_replayer_stuck_outside_its_group_ends_ingest_with_exit_4_from_the_shared_driver(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ingest's replayer is a consume/commit loop on the shared driver, so it takes the driver's
    stuck-consumer rule (exit 4, a new process joins) with no copy of its own, and ingest passes
    the code on and stops serving rather than serving on with no replays (issue 21's drift bug).
    Everything is real (broker, committer, gRPC server, replayer) except the group's answer to
    "is this member in?", the one thing a live broker cannot be made to get wrong on demand."""
    from onceflow import runner
    from onceflow.txn import driver
    from onceflow.txn.errors import EXIT_RESTART, ConsumerStuck
    from onceflow_ingest import service as ingest_service
    from onceflow_ingest.config import IngestSettings

    port = free_port()
    for name, value in pipeline.env.items():
        monkeypatch.setenv(name, value)
    settings = IngestSettings(port=port, metrics_port=0, instance=f"ingest-stuck-{port}")
    real_watch = driver.watch_membership

    class Evicted:
        """The membership watch's verdict on a member the group has dropped for good."""

        def observe(self, _consumer: object) -> None:
            raise ConsumerStuck(f"group {settings.group_id_of(topology.INGEST_REPLAYER)}: this member is outside the group")

    def watch(common, group_id: str):  # noqa: ANN001, ANN202 - the driver's own signature
        return Evicted() if group_id == settings.group_id_of(topology.INGEST_REPLAYER) else real_watch(common, group_id)

    monkeypatch.setattr(driver, "watch_membership", watch)
    monkeypatch.setattr(runner, "on_stop_signals", lambda _stop: None)  # pytest keeps its own handlers
    ingest = ingest_service.IngestService(settings)
    exit_code: list[int] = []
    runner = threading.Thread(target=lambda: exit_code.append(ingest.run()), name="ingest-under-test", daemon=True)
    runner.start()
    runner.join(120)
    assert not runner.is_alive(), "ingest served on after its replayer got stuck"
    assert exit_code == [EXIT_RESTART]
    assert ingest.replayer is not None and "outside the group" in ingest.replayer.stats.last_error
    with pytest.raises(grpc.RpcError):  # its server is down: a supervisor restarts the process
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)


@pytest.mark.security
def test_a_client_certificate_names_its_producer_under_mutual_tls(pipeline: Pipeline, tmp_path: Path) -> None:
    """Issue 39 (docs/decisions/0027): under mutual TLS a producers file entry may name its
    producer by the client certificate's common name, so that producer needs no token; a
    certificate the CA signed for no producer is UNAUTHENTICATED where producers are required."""
    ca = CertAuthority.create(tmp_path / "pki")
    server, edge, other = ca.issue("server", "serverAuth"), ca.issue("edge-client", "clientAuth"), ca.issue("other-client", "clientAuth")
    producers = tmp_path / "producers.toml"
    producers.write_text('[[producer]]\nname = "edge"\ncertificate_cn = "edge-client"\n')
    proc, address = _ingest(
        pipeline, ONCEFLOW_TLS_CERT_FILE=str(server.cert), ONCEFLOW_TLS_KEY_FILE=str(server.key),
        ONCEFLOW_TLS_CLIENT_CA_FILE=str(ca.cert), ONCEFLOW_INGEST_PRODUCERS_FILE=str(producers),
        ONCEFLOW_INGEST_REQUIRE_PRODUCER="true", health_tls=ClientTLS(str(ca.cert), str(edge.cert), str(edge.key)),
    )
    with IngestClient(address, tls=ClientTLS(str(ca.cert), str(edge.cert), str(edge.key))) as client:
        assert client.ingest([IngestRecord(record_id=b"mtls-1", payload=b"{}")]).accepted == 1
    with IngestClient(address, RetryPolicy(max_attempts=1), tls=ClientTLS(str(ca.cert), str(other.cert), str(other.key))) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.ingest([IngestRecord(record_id=b"mtls-2", payload=b"{}")])
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
    [written] = [decode_envelope(r.value) for r in _committed(pipeline) if checker.record_id_of_bytes(r.value) == "mtls-1"]
    assert written.producer == "edge"
    assert proc.alive()
