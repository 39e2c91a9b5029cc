"""The admin client without a service: each RPC's method, request, deadline and token against a
channel stand-in; what a failed call becomes (CallFailed), and what `onceflow admin` prints for
one. Against real services: tests/test_admin.py and tests/test_console.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from typer.testing import CliRunner

from onceflow.admin.tls import ClientTLS
from onceflow.v1 import acker_pb2, admin_pb2, compute_pb2, dedup_pb2, sink_pb2
from onceflow_tools import admin_client
from onceflow_tools.admin_client import NO_CHANNEL, CallFailed
from onceflow_tools.cli import admin as admin_cli

pytestmark = pytest.mark.admin


@dataclass
class Sent:
    method: str
    request: Message
    timeout: float | None
    metadata: tuple[tuple[str, str], ...]


@dataclass
class FakeChannel:
    """What a generated stub needs of a channel: each call is recorded and answered empty."""

    sent: list[Sent] = field(default_factory=list)

    def unary_unary(self, method: str, request_serializer: Any, response_deserializer: Any, **_: Any) -> Callable[..., Message]:
        def invoke(request: Message, timeout: float | None = None, metadata: Any = ()) -> Message:
            self.sent.append(Sent(method, request, timeout, tuple(metadata or ())))
            return response_deserializer(b"")

        return invoke

    def last(self) -> Sent:
        return self.sent[-1]


class FakeRpcError(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return "missing or wrong bearer token"


BEARER = (("authorization", "Bearer s3cret"),)


@pytest.mark.parametrize(
    ("rpc", "method", "request_", "timeout"),
    [
        (lambda ch: admin_client.status(ch, 5), "/onceflow.v1.Admin/Status", admin_pb2.StatusRequest(), 5),
        (lambda ch: admin_client.acker_stats(ch, 1), "/onceflow.v1.AckerAdmin/Stats", acker_pb2.AckerStatsRequest(), 1),
        (lambda ch: admin_client.get_tree(ch, 5, root_id=7), "/onceflow.v1.AckerAdmin/GetTree", acker_pb2.GetTreeRequest(root_id=7), 5),
        (
            lambda ch: admin_client.get_tree(ch, 5, record_id="r1"),
            "/onceflow.v1.AckerAdmin/GetTree", acker_pb2.GetTreeRequest(record_id="r1"), 5,
        ),
        (
            lambda ch: admin_client.list_pending(ch, 5, 20, 100),
            "/onceflow.v1.AckerAdmin/ListPending", acker_pb2.ListPendingRequest(limit=20, older_than_ms=100), 5,
        ),
        (lambda ch: admin_client.dedup_stats(ch, 1), "/onceflow.v1.DedupAdmin/Stats", dedup_pb2.DedupStatsRequest(), 1),
        (
            lambda ch: admin_client.dedup_check(ch, 5, "r1", "orders", "p1"),
            "/onceflow.v1.DedupAdmin/Check", dedup_pb2.CheckRequest(record_id="r1", stream="orders", producer="p1"), 5,
        ),
        (lambda ch: admin_client.compute_stats(ch, 1), "/onceflow.v1.ComputeAdmin/Stats", compute_pb2.ComputeStatsRequest(), 1),
        (lambda ch: admin_client.list_jobs(ch, 5), "/onceflow.v1.ComputeAdmin/ListJobs", compute_pb2.ListJobsRequest(), 5),
        (
            lambda ch: admin_client.get_state(ch, 5, "sales", "k"),
            "/onceflow.v1.ComputeAdmin/GetState", compute_pb2.GetStateRequest(job="sales", key="k"), 5,
        ),
        (
            lambda ch: admin_client.scan_rows(ch, 5, "sales", "p", 10, b"t"),
            "/onceflow.v1.Query/Scan", sink_pb2.ScanRowsRequest(job="sales", prefix="p", limit=10, page_token=b"t"), 5,
        ),
    ],
)
def test_a_read_asks_its_method_within_its_deadline_with_no_token_of_its_own(
    rpc: Callable[[FakeChannel], Message], method: str, request_: Message, timeout: float
) -> None:
    chan = FakeChannel()
    rpc(chan)
    assert chan.last() == Sent(method, request_, timeout, ())


@pytest.mark.parametrize(
    ("rpc", "method", "request_", "timeout"),
    [
        (lambda ch, t: admin_client.pause(ch, 5, t), "/onceflow.v1.Admin/Pause", admin_pb2.PauseRequest(), 5),
        (lambda ch, t: admin_client.resume(ch, 5, t), "/onceflow.v1.Admin/Resume", admin_pb2.ResumeRequest(), 5),
        # The service waits up to 30 s for its in-flight work; the call waits that and its own 5 s.
        (lambda ch, t: admin_client.drain(ch, 30, 5, t), "/onceflow.v1.Admin/Drain", admin_pb2.DrainRequest(timeout_seconds=30), 35),
        (
            lambda ch, t: admin_client.forget(ch, 40, t, "r1", "orders"),
            "/onceflow.v1.DedupAdmin/Forget", dedup_pb2.ForgetRequest(record_id="r1", stream="orders"), 40,
        ),
    ],
)
def test_a_mutation_carries_the_token_it_is_given_and_none_without_one(
    rpc: Callable[[FakeChannel, str], Message], method: str, request_: Message, timeout: float
) -> None:
    chan = FakeChannel()
    rpc(chan, "s3cret")
    assert chan.last() == Sent(method, request_, timeout, BEARER)
    rpc(chan, "")  # none of its own: the channel's read token goes, which the service refuses
    assert chan.last().metadata == ()


def test_the_stats_fleet_query_adds_are_each_services_own() -> None:
    chan = FakeChannel()
    for service, stats in sorted(admin_client.STATS.items()):
        stats(chan, 1.5)  # type: ignore[arg-type]
        assert chan.last().method.endswith("Admin/Stats") and service in chan.last().method.lower()
        assert chan.last().timeout == 1.5


def test_a_failed_call_names_the_service_the_status_and_why() -> None:
    def refused(_chan: grpc.Channel) -> None:
        raise FakeRpcError()

    with pytest.raises(CallFailed) as failed:
        admin_client.call("127.0.0.1:1", None, refused, reads=admin_client.no_token)
    assert failed.value == CallFailed("127.0.0.1:1", "UNAUTHENTICATED", "missing or wrong bearer token")
    assert str(failed.value) == "127.0.0.1:1: UNAUTHENTICATED: missing or wrong bearer token"


def test_an_unreadable_tls_or_token_file_fails_the_call_before_any_rpc() -> None:
    called: list[grpc.Channel] = []
    with pytest.raises(CallFailed) as failed:
        admin_client.call("127.0.0.1:1", ClientTLS("/no/such/ca.pem"), called.append, reads=admin_client.no_token)
    assert failed.value.code == NO_CHANNEL and "cannot read TLS file /no/such/ca.pem" in failed.value.details

    def unreadable_token() -> str:
        raise ValueError("cannot read ONCEFLOW_READ_TOKEN_FILE")

    with pytest.raises(CallFailed) as failed:
        admin_client.call("127.0.0.1:1", None, called.append, reads=unreadable_token)
    assert failed.value == CallFailed("127.0.0.1:1", NO_CHANNEL, "cannot read ONCEFLOW_READ_TOKEN_FILE")
    assert called == []


def test_what_the_call_does_not_decide_passes_through() -> None:
    def stops(_chan: grpc.Channel) -> None:
        raise KeyError("the caller's own")

    with pytest.raises(KeyError):
        admin_client.call("127.0.0.1:1", None, stops, reads=admin_client.no_token)


def test_the_cli_prints_a_failed_call_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_READ_TOKEN", raising=False)
    monkeypatch.delenv("ONCEFLOW_ADMIN_TOKEN", raising=False)

    def refused(_chan: grpc.Channel, _timeout_s: float) -> None:
        raise FakeRpcError()

    monkeypatch.setattr(admin_client, "status", refused)
    result = CliRunner().invoke(admin_cli.app, ["status", "-a", "127.0.0.1:1"])
    assert result.exit_code == 2 and "127.0.0.1:1: UNAUTHENTICATED: missing or wrong bearer token" in result.output
    result = CliRunner().invoke(admin_cli.app, ["--tls-ca", "/no/such/ca.pem", "status", "-a", "127.0.0.1:1"])
    assert result.exit_code == 2 and "127.0.0.1:1: cannot read TLS file /no/such/ca.pem" in result.output
