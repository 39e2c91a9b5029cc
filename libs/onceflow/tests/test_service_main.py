"""The service binaries' command line: ``--help`` describes and never starts the service,
stray arguments are refused, and bad settings end with exit 2 naming the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import service_main
from onceflow.config import CommonSettings



class _ToySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_TOY_")
    max_pending: int = 100
    common: CommonSettings = Field(default_factory=CommonSettings)


def _never_run(_settings: _ToySettings) -> int:
    raise AssertionError("the service was started")


def _main(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as ended:
        service_main.main("toy", "A toy service.", _ToySettings, _never_run, argv=argv)
    return int(ended.value.code or 0)


def test_help_lists_every_variable_with_its_default_and_starts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: onceflow-toy" in out and "A toy service." in out
    assert "ONCEFLOW_TOY_MAX_PENDING" in out and "[100]" in out
    assert "ONCEFLOW_LOG_LEVEL" in out  # the nested common group, under its own prefix


def test_version_and_unexpected_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("onceflow-toy ")
    assert _main(["--port", "9"]) == service_main.EXIT_USAGE
    assert "unexpected argument(s) --port 9" in capsys.readouterr().err


def test_an_invalid_variable_is_named_without_a_traceback(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ONCEFLOW_TOY_MAX_PENDING", "lots")
    assert _main([]) == service_main.EXIT_USAGE
    err = capsys.readouterr().err
    assert "ONCEFLOW_TOY_MAX_PENDING='lots'" in err and "Traceback" not in err


@pytest.mark.parametrize("service", ["ingest", "acker", "dedup", "compute", "sink"])
def test_every_service_binary_answers_help_without_starting(service: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"onceflow_{service}", "--help"], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: onceflow-{service}" in done.stdout and "ONCEFLOW_KAFKA_BOOTSTRAP" in done.stdout


def test_print_settings_shows_the_effective_values_with_secrets_masked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ONCEFLOW_TOY_MAX_PENDING", "7")
    monkeypatch.setenv("ONCEFLOW_ADMIN_TOKEN", "hunter2")
    monkeypatch.setenv("ONCEFLOW_REDIS_URL", "redis://app:s3cret@127.0.0.1:6379/0")
    assert _main(["--print-settings"]) == 0
    out = capsys.readouterr().out
    assert "ONCEFLOW_TOY_MAX_PENDING" in out and " 7\n" in out
    assert "ONCEFLOW_ADMIN_TOKEN" in out and "(set, hidden)" in out
    assert "redis://(credentials hidden)@127.0.0.1:6379/0" in out
    assert "hunter2" not in out and "s3cret" not in out
