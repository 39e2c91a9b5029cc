"""Test-only switches are never quiet: a service says which are on, lists them in Status, and
refuses a sabotaged build unless it was explicitly allowed."""

from __future__ import annotations

import grpc
import pytest

from onceflow import faults
from onceflow.admin import FixedControls, ServiceServer, Tokens
from onceflow.v1 import admin_pb2, admin_pb2_grpc


pytestmark = pytest.mark.security


def _server() -> ServiceServer:
    return ServiceServer(service="acker", instance="t", host="127.0.0.1", port=0, controls=FixedControls("RUNNING"), tokens=Tokens())


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (faults.ENV, faults.SABOTAGE_ENV, faults.ALLOW_ENV, faults.GUARANTEE_ENV, faults.CLOCK_SKEW_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("name", "value"),
    [(faults.SABOTAGE_ENV, "read_uncommitted"), (faults.ENV, "after_produce@2"), (faults.GUARANTEE_ENV, "at_least_once"),
     (faults.CLOCK_SKEW_ENV, "-3600000")],
)
def test_any_test_switch_refuses_to_start_unless_allowed(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(faults.SwitchesNotAllowed, match=f"{name}={value}.*ONCEFLOW_ALLOW_TEST_SWITCHES=1"):
        _server()
    monkeypatch.setenv(faults.ALLOW_ENV, "1")
    assert faults.guard_switches("acker") == [f"{name}={value}"]


def test_status_lists_the_switches_that_are_on(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(faults.ALLOW_ENV, "1")
    monkeypatch.setenv(faults.ENV, "after_produce@2")
    monkeypatch.setenv(faults.GUARANTEE_ENV, "at_least_once")
    server = _server()
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5)
    finally:
        server.stop(0)
    assert list(reply.test_switches) == ["ONCEFLOW_FAULT=after_produce@2", "ONCEFLOW_PROCESSING_GUARANTEE=at_least_once"]
    assert "runs with test-only switches" in caplog.text


def test_a_production_process_has_none(caplog: pytest.LogCaptureFixture) -> None:
    assert faults.guard_switches("acker") == []
    assert "test-only" not in caplog.text
