"""Who may call what: every RPC is open, read or mutating; reads need the read token once one
is set; mutating calls need the admin token and are refused outright without one; a method
nobody classified is mutating. Decided without a network, then once over a real gRPC port."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from onceflow.admin import FixedControls, ServiceServer, Tokens, channel
from onceflow.admin.auth import OPEN_METHODS, READ_METHODS, Access, TokenAuthInterceptor, access
from onceflow.config import CommonSettings
from onceflow.v1 import acker_pb2, admin_pb2, admin_pb2_grpc, compute_pb2, dedup_pb2, ingest_pb2, sink_pb2

pytestmark = [pytest.mark.foundation, pytest.mark.admin, pytest.mark.security]

PASSED = object()


def _decide(tokens: Tokens, method: str, presented: str = "") -> bool:
    metadata = (("authorization", presented),) if presented else ()
    details = SimpleNamespace(method=method, invocation_metadata=metadata)
    return TokenAuthInterceptor(tokens).intercept_service(lambda _d: PASSED, details) is PASSED


def _all_methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for module in (acker_pb2, admin_pb2, compute_pb2, dedup_pb2, ingest_pb2, sink_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_onceflow_rpc_is_classified_and_only_the_listed_ones_are_not_mutating() -> None:
    mutating = {m for m in _all_methods() if access(m) is Access.MUTATING}
    assert mutating == {
        "/onceflow.v1.Admin/Pause", "/onceflow.v1.Admin/Resume", "/onceflow.v1.Admin/Drain", "/onceflow.v1.DedupAdmin/Forget",
    }
    assert access("/onceflow.v1.Admin/SomethingNew") is Access.MUTATING  # protected by default
    assert not (OPEN_METHODS & READ_METHODS)


def test_reads_are_open_until_a_read_token_is_set() -> None:
    assert _decide(Tokens(admin="a"), "/onceflow.v1.Query/Get")
    guarded = Tokens(admin="a", read="r")
    assert not _decide(guarded, "/onceflow.v1.Query/Get")
    assert not _decide(guarded, "/onceflow.v1.DedupAdmin/Check", "Bearer wrong")
    assert _decide(guarded, "/onceflow.v1.AckerAdmin/GetTree", "Bearer r")
    assert _decide(guarded, "/onceflow.v1.Admin/Status", "bearer a")  # the admin token reads too
    assert _decide(guarded, "/grpc.health.v1.Health/Check")  # supervisors probe without a token
    assert _decide(guarded, "/onceflow.v1.Ingest/Ingest")


def test_mutating_calls_need_the_admin_token_and_are_off_without_one() -> None:
    tokens = Tokens(admin="a", read="r")
    assert _decide(tokens, "/onceflow.v1.Admin/Pause", "Bearer a")
    assert not _decide(tokens, "/onceflow.v1.Admin/Pause", "Bearer r")  # the read token is not enough
    assert not _decide(tokens, "/onceflow.v1.Admin/Drain")
    assert not _decide(Tokens(), "/onceflow.v1.Admin/Resume", "Bearer ")
    assert not _decide(Tokens(read="r"), "/onceflow.v1.DedupAdmin/Forget", "Bearer r")


def test_tokens_come_from_files_and_an_unreadable_file_is_a_settings_error(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "admin").write_text("from-file\n")
    monkeypatch.setenv("ONCEFLOW_ADMIN_TOKEN", "from-env")
    monkeypatch.setenv("ONCEFLOW_ADMIN_TOKEN_FILE", str(tmp_path / "admin"))
    assert Tokens.from_settings(CommonSettings()).admin == "from-file"
    monkeypatch.setenv("ONCEFLOW_READ_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="ONCEFLOW_READ_TOKEN_FILE .*missing"):
        CommonSettings()


def test_a_real_port_refuses_reads_without_the_read_token_and_the_client_sends_it_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ONCEFLOW_READ_TOKEN", "ONCEFLOW_ADMIN_TOKEN", "ONCEFLOW_READ_TOKEN_FILE", "ONCEFLOW_ADMIN_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    server = ServiceServer(service="acker", instance="t", host="127.0.0.1", port=0, controls=FixedControls("RUNNING"), tokens=Tokens("a", "r"))
    server.start()
    try:
        with channel(server.address) as chan:
            with pytest.raises(grpc.RpcError) as refused:
                admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "needs the read token" in refused.value.details()
            health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        monkeypatch.setenv("ONCEFLOW_READ_TOKEN", "r")
        with channel(server.address) as chan:
            assert admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=5).state == "RUNNING"
            with pytest.raises(grpc.RpcError) as refused:
                admin_pb2_grpc.AdminStub(chan).Pause(admin_pb2.PauseRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)


def test_a_request_that_does_not_parse_is_invalid_argument_not_internal() -> None:
    server = ServiceServer(service="acker", instance="t", host="127.0.0.1", port=0, controls=FixedControls("RUNNING"), tokens=Tokens("", ""))
    server.start()
    try:
        with channel(server.address) as chan:
            raw_status = chan.unary_unary("/onceflow.v1.Admin/Status")  # bytes in, bytes out
            with pytest.raises(grpc.RpcError) as refused:
                raw_status(b"\x0a\xff\xff\xff\xff", timeout=5)  # field 1, length-delimited, length past the end
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert "/onceflow.v1.Admin/Status: the request does not parse" in refused.value.details()
            # A well-formed request still gets its answer, through the same interceptor.
            assert admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=5).state == "RUNNING"
            health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(0)
