"""A Sentinel failover under a running pipeline, on a stack of its own: Kafka, a Redis primary,
its replica and a Sentinel, all started by `onceflow infra up --redis sentinel`. The primary is
killed with kill -9 while records flow; Sentinel promotes the replica, which may lack the last
writes (replication is asynchronous). Every service follows the failover through the
redis+sentinel:// URL, finds whatever was lost by its continuity check, rebuilds from Kafka, and
the checker then finds the pipeline exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.config import repo_root
from onceflow_tools.process import free_port
from tests.conftest import COMPUTE_NOT_UNDER_TEST

# A stack of its own (Kafka, a primary, its replica, Sentinel and the pipeline): about 140 s of a
# worker, so it runs in `make test-extended`. Redis rolled back under the suite's pipeline is
# proven in make test by the verify campaign's Redis faults and the sabotaged build that trusts Redis.
pytestmark = [pytest.mark.redis, pytest.mark.integration, pytest.mark.fault, pytest.mark.extended]


def onceflow(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", *args], cwd=repo_root(), env=env, capture_output=True, text=True,
        timeout=timeout_s,
    )


def test_a_sentinel_failover_and_a_rollback_under_load_hold_exactly_once(tmp_path: Path) -> None:
    sentinel = free_port()
    env = {
        **os.environ,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(free_port()),
        "ONCEFLOW_REDIS_TOPOLOGY": "sentinel",
        "ONCEFLOW_REDIS_PORT": str(free_port(span=2)),  # the replica takes the next port
        "ONCEFLOW_REDIS_SENTINEL_PORT": str(sentinel),
        "ONCEFLOW_REDIS_URL": f"redis+sentinel://127.0.0.1:{sentinel}/onceflow/0",
        **COMPUTE_NOT_UNDER_TEST,  # Redis is under test; the campaign's reference answer still runs on Spark
    }
    try:
        up = onceflow(env, "infra", "up", "--redis", "sentinel", timeout_s=240)
        assert up.returncode == 0, up.stdout + up.stderr
        status = onceflow(env, "infra", "status", timeout_s=60)
        assert "redis-replica" in status.stdout and "redis-sentinel" in status.stdout, status.stdout
        done = onceflow(
            env, "verify", "--json", "--workload", "keyed-count", "--faults", "redis-failover,redis-rollback",
            "--duration", "40s", "--rate", "150", "--fault-every", "8", "--seed", "11", "--settle", "120",
            timeout_s=900,
        )
        assert done.stdout.strip(), done.stderr[-5000:]
        verdict = json.loads(done.stdout)
        assert verdict["faults_injected"].get("redis-failover", 0) >= 1, verdict["faults_injected"]
        assert done.returncode == 0 and verdict["ok"], json.dumps(verdict)
        assert verdict["lost"] == verdict["duplicated"] == 0 and verdict["sink_matches_batch"], verdict
        assert verdict["dedup_store_matches_changelog"] and verdict["undrained"] == [], verdict
        assert verdict["redis_repairs"] > 0 and verdict["late_resends"] > 0, verdict
        status = onceflow(env, "infra", "status", timeout_s=60)
        assert status.returncode == 0, status.stdout + status.stderr  # the old primary rejoined
    finally:
        down = onceflow(env, "infra", "down", timeout_s=180)
        assert down.returncode == 0, down.stdout + down.stderr
