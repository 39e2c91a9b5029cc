"""Settings a hostile or careless environment can give (issue 39, items 5 and 6): the
exactly-once guard holds whatever spelling turns the guarantee down, and a refused setting never
prints a secret beside it."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import faults, service_main
from onceflow.admin import FixedControls, ServiceServer, Tokens
from onceflow.config import CommonSettings
from onceflow.txn.producer import open_producer
from onceflow.v1 import admin_pb2, admin_pb2_grpc

pytestmark = pytest.mark.hostile


class _ToySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_TOY_", extra="ignore")  # as the services'
    instance: str = "t"
    common: CommonSettings = Field(default_factory=CommonSettings)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (faults.ENV, faults.SABOTAGE_ENV, faults.ALLOW_ENV, faults.GUARANTEE_ENV, faults.CLOCK_SKEW_ENV,
                 "ONCEFLOW_ADMIN_TOKEN", "ONCEFLOW_REDIS_PASSWORD", "ONCEFLOW_TLS_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(faults, "_parsed_guarantee", None, raising=False)
    monkeypatch.setattr(service_main.logs, "setup", lambda *_args: None)  # the root logger stays the test's
    SEEN.clear()
    yield


SEEN: list[str] = []  # the last Status' test_switches


def _status_switches(_settings: _ToySettings) -> int:
    """A service's start as far as its server: the guard, then Status."""
    server = ServiceServer(service="toy", instance="t", host="127.0.0.1", port=0, controls=FixedControls("RUNNING"), tokens=Tokens())
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            reply = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=5)
    finally:
        server.stop(0)
    SEEN[:] = reply.test_switches
    return 0


SPELLINGS = [
    ("ONCEFLOW_PROCESSING_GUARANTEE", "at_least_once"),
    ("onceflow_processing_guarantee", "at_least_once"),
    ("ONCEFLOW_TOY_COMMON", '{"processing_guarantee": "at_least_once"}'),
]


@pytest.mark.parametrize(("name", "value"), SPELLINGS, ids=["upper", "lower", "group-json"])
def test_every_spelling_of_at_least_once_is_refused_unless_allowed_and_shown_in_status(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str,
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(faults.SwitchesNotAllowed, match="at_least_once.*ONCEFLOW_ALLOW_TEST_SWITCHES=1"):
        service_main.main("toy", "A toy service.", _ToySettings, _status_switches, argv=[])
    monkeypatch.setenv(faults.ALLOW_ENV, "1")
    with pytest.raises(SystemExit):
        service_main.main("toy", "A toy service.", _ToySettings, _status_switches, argv=[])
    assert SEEN == ["ONCEFLOW_PROCESSING_GUARANTEE=at_least_once"]


def test_the_producer_refuses_a_weaker_guarantee_however_the_settings_were_made(monkeypatch: pytest.MonkeyPatch) -> None:
    common = CommonSettings(processing_guarantee="at_least_once", kafka_bootstrap="127.0.0.1:1")
    with pytest.raises(faults.SwitchesNotAllowed):
        open_producer(common, "toy-tx")


def test_exactly_once_shows_no_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("onceflow_processing_guarantee", "exactly_once")
    with pytest.raises(SystemExit):
        service_main.main("toy", "A toy service.", _ToySettings, _status_switches, argv=[])
    assert SEEN == []


SECRETS = {"ONCEFLOW_ADMIN_TOKEN": "admin-s3cret-tok", "ONCEFLOW_REDIS_PASSWORD": "redis-s3cret-pw"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ONCEFLOW_TLS_CERT_FILE", "cert.pem"),  # a group check: its error's input is the whole group
        ("ONCEFLOW_REDIS_WAIT_REPLICAS", "lots"),  # one field, next to the secrets
        ("ONCEFLOW_TOY_COMMON", '{"admin_token": "admin-s3cret-tok", "redis_url": 5}'),  # a group's JSON
        ("ONCEFLOW_TOY_COMMON", '{"admin_token": "admin-s3cret-tok",'),  # JSON that does not parse
    ],
    ids=["group-check", "field", "group-json", "broken-json"],
)
def test_a_bad_setting_next_to_a_secret_never_prints_the_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, value: str,
) -> None:
    for secret_name, secret in SECRETS.items():
        monkeypatch.setenv(secret_name, secret)
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as ended:
        service_main.main("toy", "A toy service.", _ToySettings, _status_switches, argv=[])
    assert ended.value.code == service_main.EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid settings" in err and "Traceback" not in err
    for secret in SECRETS.values():
        assert secret not in err


def test_a_plain_bad_value_is_still_named(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ONCEFLOW_TOY_COMMON", '{"log_level": 5}')
    with pytest.raises(SystemExit):
        service_main.main("toy", "A toy service.", _ToySettings, _status_switches, argv=[])
    assert "ONCEFLOW_TOY_COMMON_LOG_LEVEL='5'" in capsys.readouterr().err
