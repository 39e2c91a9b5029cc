"""With ONCEFLOW_SECURE=1 every CLI command, not only `infra up`, reaches the secure stack with the
settings `infra up --secure` prints (docs/admin.md); found trying the secure stack as a new user:
`onceflow stream create` spoke plaintext to the SASL_SSL listener."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onceflow_tools.cli import app


@pytest.mark.parametrize("secure", [True, False])
def test_every_command_takes_the_secure_settings_when_asked(secure: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_HOME", str(tmp_path))
    for name in ("ONCEFLOW_KAFKA_SECURITY_PROTOCOL", "ONCEFLOW_KAFKA_SASL_USERNAME", "ONCEFLOW_SECURE"):
        monkeypatch.delenv(name, raising=False)
    if secure:
        monkeypatch.setenv("ONCEFLOW_SECURE", "1")
    saved = dict(os.environ)  # the command sets the secure stack's settings in this process
    try:
        done = CliRunner().invoke(app, ["topology"])
        assert done.exit_code == 0, done.output
        assert os.environ.get("ONCEFLOW_KAFKA_SECURITY_PROTOCOL") == ("SASL_SSL" if secure else None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
