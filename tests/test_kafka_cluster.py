"""The pipeline on a 3-node KRaft cluster of its own (`onceflow infra up --brokers 3`): topics
with 3 replicas and 2 in sync, and exactly-once through kill -9 and clean restarts of single
nodes (each the leader of some partitions, of some transaction coordinators, or the active
controller) under load, judged by verify's checker on the drained pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.config import repo_root
from onceflow.process import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.fault]


def onceflow(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow", *args], cwd=repo_root(), env=env, capture_output=True, text=True,
        timeout=timeout_s,
    )


def cluster_ports() -> tuple[int, int]:
    """A broker and a controller port whose +10 and +20 neighbours are free too."""
    while True:
        broker, controller = free_port(), free_port()
        ports = [p + step for p in (broker, controller) for step in (0, 10, 20)]
        if max(ports) < 65536 and len(set(ports)) == 6 and all(_free(p) for p in ports):
            return broker, controller


def _free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_three_brokers_hold_exactly_once_through_node_kills_and_restarts(tmp_path: Path) -> None:
    broker, controller = cluster_ports()
    bootstrap = ",".join(f"127.0.0.1:{broker + step}" for step in (0, 10, 20))
    env = {
        **os.environ,
        "ONCEFLOW_HOME": str(tmp_path / "home"),
        "ONCEFLOW_KAFKA_BROKERS": "3",
        "ONCEFLOW_KAFKA_BOOTSTRAP": bootstrap,
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(controller),
        "ONCEFLOW_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    try:
        up = onceflow(env, "infra", "up", "--brokers", "3", timeout_s=300)
        assert up.returncode == 0, up.stdout + up.stderr
        status = onceflow(env, "infra", "status", timeout_s=60)
        assert status.returncode == 0, status.stdout
        assert "active controller" in status.stdout and "0 under-replicated" in status.stdout, status.stdout
        topics = onceflow(env, "infra", "topics", timeout_s=120)
        assert "3 (min in sync 2)" in topics.stdout, topics.stdout + topics.stderr
        done = onceflow(
            env, "verify", "--json", "--workload", "keyed-count", "--faults", "broker,kill9",
            "--duration", "40s", "--rate", "150", "--fault-every", "6", "--seed", "13", "--settle", "180",
            timeout_s=900,
        )
        assert done.stdout.strip(), done.stderr[-5000:]
        verdict = json.loads(done.stdout)
        assert verdict["faults_injected"].get("broker", 0) >= 2, verdict["faults_injected"]
        assert done.returncode == 0 and verdict["ok"], json.dumps(verdict)
        assert verdict["lost"] == verdict["duplicated"] == verdict["aborted_reads"] == verdict["hanging_transactions"] == 0
        assert verdict["sink_matches_batch"] and verdict["undrained"] == [], verdict
    finally:
        down = onceflow(env, "infra", "down", timeout_s=240)
        assert down.returncode == 0, down.stdout + down.stderr
