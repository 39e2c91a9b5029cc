"""`onceflow infra up | status | down` on a second, throwaway stack (its own ports and data
folder), so the session's shared broker is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.foundation, pytest.mark.integration]


def _onceflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow", "infra", *args], env=env, capture_output=True, text=True, timeout=180
    )


def test_status_is_healthy_after_up_and_not_after_down(tmp_path: Path) -> None:
    kafka, controller, redis = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka}",
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(controller),
        "ONCEFLOW_REDIS_URL": f"redis://127.0.0.1:{redis}/0",
    }
    try:
        up = _onceflow(env, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        status = _onceflow(env, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert str(kafka) in status.stdout and str(redis) in status.stdout
    finally:
        down = _onceflow(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    status = _onceflow(env, "status")
    assert status.returncode == 1, status.stdout + status.stderr
