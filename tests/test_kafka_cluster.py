"""The pipeline on a 3-node KRaft cluster of its own (`onceflow infra up --brokers 3`): topics
with 3 replicas and 2 in sync, and exactly-once through kill -9 of the node leading a written
partition, of the one coordinating a live transaction and of the active controller, and through
a paused broker, under load, judged by verify's checker on the drained pipeline; and a broken
build that the same checker fails on the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from onceflow.config import repo_root
from onceflow_tools.process import free_port
from tests.conftest import CAMPAIGNS, SHORT_LIVED_COMPUTE

# One worker takes the whole module (its cluster fixture is started once), in turn with the
# other whole-pipeline campaigns.
pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.fault, CAMPAIGNS]


def onceflow(env: dict[str, str], *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", *args], cwd=repo_root(), env=env, capture_output=True, text=True,
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


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A 3-node cluster and a Redis of this module's own: the suite's shared broker stays untouched."""
    broker, controller = cluster_ports()
    env = {
        **os.environ,
        "ONCEFLOW_HOME": str(tmp_path_factory.mktemp("cluster") / "home"),
        "ONCEFLOW_KAFKA_BROKERS": "3",
        # A dead first node must not stop a client finding the cluster: every node is listed.
        "ONCEFLOW_KAFKA_BOOTSTRAP": ",".join(f"127.0.0.1:{broker + step}" for step in (0, 10, 20)),
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(controller),
        "ONCEFLOW_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        **SHORT_LIVED_COMPUTE,
    }
    try:
        up = onceflow(env, "infra", "up", "--brokers", "3", timeout_s=300)
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        down = onceflow(env, "infra", "down", timeout_s=240)
        assert down.returncode == 0, down.stdout + down.stderr


def verify(env: dict[str, str], *args: str) -> tuple[int, dict]:
    done = onceflow(env, "verify", "--json", "--workload", "keyed-count", *args, timeout_s=900)
    assert done.stdout.strip(), done.stderr[-5000:]
    print(done.stderr[-6000:])  # verify's notes (faults, stacks of a pipeline that would not drain): shown on failure
    return done.returncode, json.loads(done.stdout)


def test_exactly_once_holds_through_leader_coordinator_and_controller_kills_and_a_paused_broker(
    cluster_env: dict[str, str],
) -> None:
    """Each fault aimed where it hurts, found from the cluster itself: the leader of a partition
    the run writes, the coordinator of a live service's transactional.id, the active controller
    (each kill -9, then restarted), and a broker frozen for 20-40 s, then woken. First, the
    cluster as `infra` reports it."""
    status = onceflow(cluster_env, "infra", "status", timeout_s=60)
    assert status.returncode == 0, status.stdout
    assert status.stdout.count("active controller") == 1 and "0 under-replicated" in status.stdout, status.stdout
    topics = onceflow(cluster_env, "infra", "topics", timeout_s=120)
    assert "3 (min in sync 2)" in topics.stdout, topics.stdout + topics.stderr
    faults = ("leader-kill9", "coordinator-kill9", "controller-kill9", "broker-pause")
    code, verdict = verify(
        cluster_env, "--faults", ",".join(faults), "--duration", "40s", "--rate", "150", "--fault-every", "5",
        "--seed", "13", "--settle", "240",
    )
    assert all(verdict["faults_injected"].get(kind, 0) >= 1 for kind in faults), verdict["faults_injected"]
    assert code == 0 and verdict["ok"], json.dumps(verdict)
    assert verdict["records"] == verdict["distinct"] == 40 * 150
    assert verdict["lost"] == verdict["duplicated"] == verdict["aborted_reads"] == verdict["hanging_transactions"] == 0
    assert verdict["sink_matches_batch"] and verdict["undrained"] == [], verdict


@pytest.mark.extended
def test_a_broken_build_fails_verification_on_the_cluster(cluster_env: dict[str, str]) -> None:
    """The checker can fail here too: offsets committed outside the transaction lose the batches
    that crashes abort (at the gate: ids lost; in compute: rows wrong), and consumers reading
    uncommitted data take in what aborted transactions wrote. Marked extended: `make
    test-cluster` runs it (the suite's sabotaged campaigns run on one broker, test_verify)."""
    code, verdict = verify(
        cluster_env, "--sabotage", "offsets_outside_txn,read_uncommitted", "--faults", "crash_in_txn,leader-kill9",
        "--duration", "40s", "--rate", "150", "--fault-every", "4", "--seed", "5", "--settle", "20",
    )
    assert verdict["faults_injected"].get("crash_in_txn", 0) >= 2, verdict["faults_injected"]
    assert verdict["faults_injected"].get("leader-kill9", 0) >= 1, verdict["faults_injected"]
    assert code == 1 and not verdict["ok"], verdict
    assert not verdict["sink_matches_batch"], verdict


def test_a_topic_with_fewer_replicas_than_declared_is_an_error_not_accepted(cluster_env: dict[str, str]) -> None:
    """One topic made by hand with 1 replica where topics.toml declares 3 on this cluster:
    `infra topics` refuses it, naming the topic and both counts, and creates nothing."""
    from confluent_kafka.admin import NewTopic

    from onceflow.kafka.clients import plain_config
    from onceflow_tools.infra.topics import load_specs

    bootstrap, prefix = cluster_env["ONCEFLOW_KAFKA_BOOTSTRAP"], "short-replicas."
    spec = load_specs()[0]
    admin = AdminClient(plain_config(bootstrap))
    admin.create_topics([NewTopic(prefix + spec.name, num_partitions=spec.partitions, replication_factor=1)])[
        prefix + spec.name
    ].result(30)
    done = onceflow(cluster_env, "infra", "topics", "--prefix", prefix, "--bootstrap", bootstrap, timeout_s=120)
    assert done.returncode == 1, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert f"{prefix}{spec.name} has 1 replica(s), declared 3" in message, message
    existing = set(admin.list_topics(timeout=30).topics)
    assert {t for t in existing if t.startswith(prefix)} == {prefix + spec.name}  # nothing else created
    admin.delete_topics([prefix + spec.name])
