"""The admin plane over real gRPC: ingest, the acker and the dedup gate as real processes (started
once for the module), every Admin call of every service, token auth on mutations, health,
reflection, each service's own read-only calls, `onceflow admin status --all` with services
down or hung, and TLS / mutual TLS with certificates made by openssl."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from onceflow.admin import ClientTLS, channel, fleet
from onceflow_client import IngestClient
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import consumed_everything
from onceflow.topology import Topic
from onceflow.v1 import (
    acker_pb2,
    acker_pb2_grpc,
    admin_pb2,
    admin_pb2_grpc,
    dedup_pb2,
    dedup_pb2_grpc,
    ingest_pb2,
    ingest_pb2_grpc,
)
from onceflow_tools.infra.certs import CertAuthority
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from tests.conftest import Pipeline, eventually, free_port
from tests.harness.process import ServiceProcess
from tests.harness.workload import ingest_records, items

pytestmark = [pytest.mark.admin, pytest.mark.integration]

SERVICES = ("ingest", "acker", "dedup", "sink")
OWN_SERVICE = {
    "ingest": "onceflow.v1.Ingest", "acker": "onceflow.v1.AckerAdmin", "dedup": "onceflow.v1.DedupAdmin",
    "sink": "onceflow.v1.Query",
}
TOKEN = [("authorization", "Bearer test-token")]  # what the Pipeline env sets as ONCEFLOW_ADMIN_TOKEN
RECORDS = items("admin", 200)


@dataclass
class Stack:
    pipe: Pipeline
    processes: dict[str, ServiceProcess]
    addresses: dict[str, str]

    def channel(self, service: str) -> grpc.Channel:
        return channel(self.addresses[service])


@pytest.fixture(scope="module")
def stack(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """ingest (acking on) -> dedup (trees end at the gate) with an acker, on their own topics,
    with RECORDS sent through and passed by the gate."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    pipe = Pipeline(common, tmp_path_factory.mktemp("admin"))
    processes, addresses = {}, {}
    for name, extra in (
        ("acker", {}), ("dedup", {"ONCEFLOW_DEDUP_ACK_MODE": "terminal"}), ("ingest", {}), ("sink", {}),
    ):
        port = free_port()
        env = {f"ONCEFLOW_{name.upper()}_PORT": str(port), f"ONCEFLOW_{name.upper()}_METRICS_PORT": "0", **extra}
        processes[name] = pipe.process(name, f"onceflow_{name}", **env)
        addresses[name] = f"127.0.0.1:{port}"
    try:
        for proc in processes.values():  # all at once: startup is mostly imports
            proc.start()
        for name, proc in processes.items():
            proc.wait_healthy(addresses[name])
        with IngestClient(addresses["ingest"]) as client:
            assert client.ingest(ingest_records(RECORDS)).accepted == len(RECORDS)
        eventually(
            lambda: consumed_everything(common, common.topic("onceflow-dedup"), common.topic(Topic.INGEST_RECORDS)),
            120, "the gate to pass the records", interval_s=0.5,
        )
        yield Stack(pipe, processes, addresses)
        for proc in processes.values():
            assert proc.terminate() == 0, proc.log_tail()
    finally:
        for proc in processes.values():
            proc.ensure_dead()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def _status(stack: Stack, service: str) -> admin_pb2.StatusReply:
    with stack.channel(service) as chan:
        return admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=5)


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _cli(*args: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", *args], capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, **env},
    )


def test_status_reports_each_service(stack: Stack) -> None:
    for service in SERVICES:
        status = _status(stack, service)
        assert (status.service, status.instance, status.state) == (service, f"{service}-0", "RUNNING")
        assert status.version and status.uptime_seconds > 0
    ingest = _status(stack, "ingest")
    assert ingest.records_in == len(RECORDS) and ingest.transactions_committed >= 1
    assert ingest.gauges["max_pending"] > 0 and not ingest.partitions  # ingest consumes nothing
    # Partitions and lag are sampled by the loop between batches: give it one more.
    gate = eventually(lambda: (g := _status(stack, "dedup")).partitions and not sum(p.lag for p in g.partitions) and g,
                      10, "the gate to report its partitions caught up", 0.2)
    assert sorted(p.partition for p in gate.partitions) == [0, 1, 2, 3]
    assert {p.topic for p in gate.partitions} == {stack.pipe.topic(Topic.INGEST_RECORDS)}
    assert gate.records_in >= len(RECORDS) and gate.gauges["passed"] == len(RECORDS)
    acker = eventually(lambda: (a := _status(stack, "acker")).partitions and a, 10, "the acker's partitions", 0.2)
    assert {p.topic for p in acker.partitions} == {stack.pipe.topic(Topic.ACKER_ACKS)}
    assert acker.records_in > 0 and acker.transactions_committed > 0


def test_pause_resume_drain_with_the_token(stack: Stack) -> None:
    for service in SERVICES:
        with stack.channel(service) as chan:
            admin = admin_pb2_grpc.AdminStub(chan)
            assert admin.Pause(admin_pb2.PauseRequest(), metadata=TOKEN, timeout=5).state == "PAUSED"
            eventually(lambda: _status(stack, service).state == "PAUSED", 10, f"{service} to pause", 0.1)
            if service == "ingest":  # a paused ingest refuses records rather than queueing them
                request = ingest_pb2.IngestRequest(records=ingest_records(items("paused", 1)))
                refused = _code(lambda: ingest_pb2_grpc.IngestStub(chan).Ingest(request, timeout=5))
                assert refused == grpc.StatusCode.UNAVAILABLE
            assert admin.Resume(admin_pb2.ResumeRequest(), metadata=TOKEN, timeout=5).state == "RUNNING"
            eventually(lambda: _status(stack, service).state == "RUNNING", 10, f"{service} to resume", 0.1)
            drained = admin.Drain(admin_pb2.DrainRequest(timeout_seconds=10), metadata=TOKEN, timeout=15)
            assert (drained.state, drained.drained) == ("DRAINED", True)
            eventually(lambda: _status(stack, service).state == "DRAINED", 10, f"{service} to report DRAINED", 0.1)
            assert admin.Resume(admin_pb2.ResumeRequest(), metadata=TOKEN, timeout=5).state == "RUNNING"
            eventually(lambda: _status(stack, service).state == "RUNNING", 10, f"{service} to resume", 0.1)
    # The CLI: refused without the token; drain and resume with it (from ONCEFLOW_ADMIN_TOKEN).
    gate = stack.addresses["dedup"]
    refused = _cli("admin", "pause", "-a", gate, ONCEFLOW_ADMIN_TOKEN="")
    assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stdout
    drained = _cli("admin", "drain", "-a", gate, "--wait", "10", "--json", ONCEFLOW_ADMIN_TOKEN="test-token")
    assert drained.returncode == 0 and json.loads(drained.stdout) == {"state": "DRAINED", "drained": True}
    resumed = _cli("admin", "resume", "-a", gate, "--json", ONCEFLOW_ADMIN_TOKEN="test-token")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["state"] == "RUNNING"
    # Resumed for real: ingest takes records again and the gate passes them.
    with IngestClient(stack.addresses["ingest"]) as client:
        assert client.ingest(ingest_records(items("resumed", 10))).accepted == 10
    common = stack.pipe.common
    eventually(
        lambda: consumed_everything(common, common.topic("onceflow-dedup"), common.topic(Topic.INGEST_RECORDS)),
        60, "the resumed gate to pass the new records",
    )


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong-token"),), (("authorization", "Basic test-token"),)],
                         ids=["no-token", "wrong-token", "wrong-scheme"])
def test_mutations_without_the_right_token_are_refused(stack: Stack, metadata: tuple) -> None:
    for service in SERVICES:
        with stack.channel(service) as chan:
            admin = admin_pb2_grpc.AdminStub(chan)
            for call, request in ((admin.Pause, admin_pb2.PauseRequest()), (admin.Resume, admin_pb2.ResumeRequest()),
                                  (admin.Drain, admin_pb2.DrainRequest(timeout_seconds=1))):
                assert _code(lambda: call(request, metadata=metadata, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        assert _status(stack, service).state == "RUNNING"  # nothing happened
    with stack.channel("dedup") as chan:
        forget = dedup_pb2_grpc.DedupAdminStub(chan).Forget
        request = dedup_pb2.ForgetRequest(record_id=RECORDS[0].record_id)
        assert _code(lambda: forget(request, metadata=metadata, timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
        check = dedup_pb2.CheckRequest(record_id=RECORDS[0].record_id)
        assert dedup_pb2_grpc.DedupAdminStub(chan).Check(check, timeout=5).seen  # not forgotten


def test_health_and_reflection(stack: Stack) -> None:
    for service in SERVICES:
        own = OWN_SERVICE[service]
        with stack.channel(service) as chan:
            health = health_pb2_grpc.HealthStub(chan)
            for name in ("", own, "onceflow.v1.Admin"):
                reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
            unknown = health_pb2.HealthCheckRequest(service="no.Such")
            assert _code(lambda: health.Check(unknown, timeout=5)) == grpc.StatusCode.NOT_FOUND
            reflection = reflection_pb2_grpc.ServerReflectionStub(chan)
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=own),
            ]
            listed, described = reflection.ServerReflectionInfo(iter(requests), timeout=5)
        names = {s.name for s in listed.list_services_response.service}
        also = {"sink": {"onceflow.v1.JobAdmin"}}.get(service, set())  # the sink serves job versions too
        assert names == {own, *also, "onceflow.v1.Admin", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
        assert described.file_descriptor_response.file_descriptor_proto, f"{service}: no descriptor for {own}"


def test_read_only_calls_need_no_token(stack: Stack) -> None:
    sent = {i.record_id for i in RECORDS}
    with stack.channel("acker") as chan:
        acker = acker_pb2_grpc.AckerAdminStub(chan)

        def settled() -> acker_pb2.AckerStatsReply | None:
            stats = acker.Stats(acker_pb2.AckerStatsRequest(), timeout=5)
            return stats if stats.completed >= len(sent) and stats.pending == 0 else None

        # Terminal at the gate: every tree (these and any sent by earlier tests) completes.
        stats = eventually(settled, 60, "every tree to complete")
        assert stats.acks_processed > 0 and stats.failed == stats.timed_out == 0
        pending = acker.ListPending(acker_pb2.ListPendingRequest(limit=10), timeout=5)
        assert pending.total_pending == 0 and not pending.trees
        assert not acker.GetTree(acker_pb2.GetTreeRequest(record_id=RECORDS[0].record_id), timeout=5).trees  # decided
        too_many = acker_pb2.ListPendingRequest(limit=5000)
        assert _code(lambda: acker.ListPending(too_many, timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
    with stack.channel("dedup") as chan:
        dedup = dedup_pb2_grpc.DedupAdminStub(chan)
        stats = dedup.Stats(dedup_pb2.DedupStatsRequest(), timeout=5)
        assert stats.passed >= len(sent) and sorted(stats.partitions) == [0, 1, 2, 3]
        seen = dedup.Check(dedup_pb2.CheckRequest(record_id=RECORDS[0].record_id), timeout=5)
        assert seen.seen and seen.owned and seen.expires_at_ms > seen.bucket_start_ms > 0
        assert not dedup.Check(dedup_pb2.CheckRequest(record_id="never-sent"), timeout=5).seen


def _blackhole() -> socket.socket:
    """A port that accepts TCP connections and never speaks: a hung service."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def test_status_all_shows_down_and_hung_services_within_the_deadline(stack: Stack, tmp_path: Path) -> None:
    hung = _blackhole()
    hung_address = f"127.0.0.1:{hung.getsockname()[1]}"
    nothing = f"127.0.0.1:{free_port()}"
    config = tmp_path / "services.toml"
    entries = [*((s, stack.addresses[s]) for s in SERVICES), ("compute", nothing), ("hung", hung_address)]
    config.write_text("".join(f'[[service]]\nname = "{n}"\naddress = "{a}"\n\n' for n, a in entries))
    try:
        started = time.monotonic()
        results = fleet.query_all(fleet.load_endpoints(config), tls=None, timeout_s=1.0)
        assert time.monotonic() - started < 1.8, "the services were not queried in parallel under one deadline"
        by_name = {r.endpoint.name: r for r in results}
        assert [r.endpoint.name for r in results] == [n for n, _ in entries]
        assert by_name["compute"].health == fleet.DOWN and by_name["compute"].error.startswith("UNAVAILABLE")
        assert by_name["hung"].health == fleet.DOWN and by_name["hung"].error.startswith("DEADLINE_EXCEEDED")

        # The CLI answers although one service never speaks: its row says DEADLINE_EXCEEDED
        # (below), and the call returns within `_cli`'s bound. How fast is not asserted: the CLI's
        # own start took 12 s on a loaded fresh-clone run.
        cli = _cli("admin", "status", "--all", "--config", str(config), "--timeout", "2", "--json", timeout_s=30)
        assert cli.returncode == 1, cli.stderr  # not everything is SERVING
        rows = {row["service"]: row for row in json.loads(cli.stdout)}
        for service in SERVICES:
            assert rows[service]["health"] == "SERVING" and rows[service]["status"]["state"] == "RUNNING"
            assert rows[service]["status"]["instance"] == f"{service}-0"
        assert rows["compute"]["health"] == rows["hung"]["health"] == "DOWN"
        assert rows["compute"]["status"] is None and rows["hung"]["error"].startswith("DEADLINE_EXCEEDED")

        # The table, with the config from the environment (and a terminal wide enough for it).
        table = _cli("admin", "status", "--all", "--timeout", "1", ONCEFLOW_SERVICES_CONFIG=str(config), COLUMNS="160")
        assert table.returncode == 1
        rows_text, _, errors_text = table.stdout.partition("last errors:")
        lines = {line.split()[0]: line for line in rows_text.splitlines() if line.split()}
        for service in SERVICES:
            assert "SERVING" in lines[service] and "RUNNING" in lines[service]
        assert "DOWN" in lines["compute"] and "DOWN" in lines["hung"]
        assert "0-3" in lines["dedup"]  # its partitions
        assert "compute 127.0.0.1" in errors_text and "DEADLINE_EXCEEDED" in errors_text
    finally:
        hung.close()
    # The single-address form still works.
    one = _cli("admin", "status", "-a", stack.addresses["acker"], "--json")
    assert one.returncode == 0 and json.loads(one.stdout)["service"] == "acker"


def test_tls_and_mutual_tls(pipeline: Pipeline, tmp_path: Path) -> None:
    ca = CertAuthority.create(tmp_path / "pki")
    server = ca.issue("server", "serverAuth")
    client = ca.issue("client", "clientAuth")
    stranger = CertAuthority.create(tmp_path / "other", "stranger")
    server_env = {"ONCEFLOW_TLS_CERT_FILE": str(server.cert), "ONCEFLOW_TLS_KEY_FILE": str(server.key)}
    procs = {}
    for name, extra in (("tls", {}), ("mtls", {"ONCEFLOW_TLS_CLIENT_CA_FILE": str(ca.cert)})):
        port = free_port()
        proc = pipeline.process(
            f"acker-{name}", "onceflow_acker", ONCEFLOW_ACKER_PORT=str(port), ONCEFLOW_ACKER_METRICS_PORT="0",
            ONCEFLOW_ACKER_INSTANCE=name, **server_env, **extra,
        )
        procs[name] = (proc.start(), f"127.0.0.1:{port}")
    tls_address, mtls_address = procs["tls"][1], procs["mtls"][1]
    with_ca = ClientTLS(ca_file=str(ca.cert))
    with_cert = ClientTLS(str(ca.cert), str(client.cert), str(client.key))
    procs["tls"][0].wait_healthy(tls_address, tls=with_ca)
    procs["mtls"][0].wait_healthy(mtls_address, tls=with_cert)
    procs["tls"][0].wait_log("(TLS)", 10)
    procs["mtls"][0].wait_log("(mTLS)", 10)

    def status(address: str, tls: ClientTLS | None) -> admin_pb2.StatusReply:
        with channel(address, tls) as chan:
            return admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=5)

    assert status(tls_address, with_ca).instance == "tls"
    assert _code(lambda: status(tls_address, None)) == grpc.StatusCode.UNAVAILABLE  # plaintext
    assert _code(lambda: status(tls_address, ClientTLS(ca_file=str(stranger.cert)))) == grpc.StatusCode.UNAVAILABLE
    assert status(mtls_address, with_cert).instance == "mtls"
    assert _code(lambda: status(mtls_address, with_ca)) == grpc.StatusCode.UNAVAILABLE  # no client certificate
    assert _code(lambda: status(mtls_address, None)) == grpc.StatusCode.UNAVAILABLE

    # The CLI: `health` and every `admin` command take the same TLS options.
    assert _cli("health", tls_address, "--tls-ca", str(ca.cert)).returncode == 0
    plaintext = _cli("health", tls_address)
    assert plaintext.returncode == 1 and "unreachable" in plaintext.stdout
    config = tmp_path / "services.toml"
    config.write_text(f'[[service]]\nname = "acker"\naddress = "{mtls_address}"\n')
    fleet_cli = _cli(
        "admin", "--tls-ca", str(ca.cert), "--tls-cert", str(client.cert), "--tls-key", str(client.key),
        "status", "--all", "--config", str(config), "--json",
    )
    assert fleet_cli.returncode == 0, fleet_cli.stdout + fleet_cli.stderr
    assert json.loads(fleet_cli.stdout)[0]["status"]["instance"] == "mtls"
    one = _cli("admin", "--tls-ca", str(ca.cert), "acker", "stats", "-a", tls_address, "--json")
    assert one.returncode == 0 and "pending" in json.loads(one.stdout)
    for proc, _address in procs.values():
        assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.security
@pytest.mark.parametrize(
    ("switch", "value"), [("ONCEFLOW_SABOTAGE", "read_uncommitted"), ("ONCEFLOW_FAULT", "after_produce@2")],
)
def test_a_service_with_a_test_switch_and_no_allow_setting_refuses_to_start(
    pipeline: Pipeline, switch: str, value: str,
) -> None:
    """A leftover export must not turn a real pipeline into a broken one: the service exits
    non-zero naming the switch and the allow setting, and serves nothing."""
    proc = pipeline.process(
        f"acker-{switch.lower()}", "onceflow_acker", ONCEFLOW_ACKER_PORT=str(free_port()), ONCEFLOW_ACKER_METRICS_PORT="0",
        ONCEFLOW_ALLOW_TEST_SWITCHES="", **{switch: value},
    ).start()
    assert proc.wait_exit(120) not in (0, None), proc.log_tail()
    log = proc.log_path.read_text()
    assert f"{switch}={value}" in log and "ONCEFLOW_ALLOW_TEST_SWITCHES=1" in log, log[-3000:]
