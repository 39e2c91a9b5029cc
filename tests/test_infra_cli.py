"""`onceflow infra up | status | down` on a second, throwaway stack (its own ports and data
folder), so the session's shared broker is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import hanging_transactions, read_committed
from onceflow.topology import Topic
from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.infra.topics import TopicReplicationError, delete_topics, ensure_topics, load_specs
from tests.conftest import free_port

pytestmark = [pytest.mark.foundation, pytest.mark.integration]


def _onceflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", "infra", *args], env=env, capture_output=True, text=True, timeout=180
    )


# A stack of its own up and down (about 50 s): every test's stack runs `infra up` already; this
# checks the CLI's status output around it, in make test-extended (the suite's time, issue 45).
@pytest.mark.extended
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


def test_compose_topics_job_works_against_any_bootstrap_list(infra: None) -> None:
    """The exact command compose's `topics` job runs, given a bootstrap list with a dead broker
    named first: it must reach the live one, not a loopback guess."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    live = CommonSettings().kafka_bootstrap
    env = {**os.environ, "ONCEFLOW_KAFKA_BOOTSTRAP": f"127.0.0.2:9,{live}", "ONCEFLOW_TOPIC_PREFIX": prefix}
    try:
        done = _onceflow(env, "topics")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{prefix}ingest.records" in done.stdout and "created" in done.stdout
        again = _onceflow(env, "topics", "--bootstrap", live)
        assert again.returncode == 0 and "created" not in again.stdout, again.stdout + again.stderr
        # More replicas than the cluster has brokers: refused with the reason, nothing half made.
        spec = next(s for s in load_specs() if s.name == Topic.INGEST_RECORDS)
        with pytest.raises(TopicReplicationError, match="declares 3 replicas; the cluster has 1 broker"):
            ensure_topics(live, prefix + "x.", [replace(spec, replication_factor=3)])
    finally:
        delete_topics(live, prefix)


def test_a_cluster_node_in_a_fresh_home_installs_the_shared_jars(tmp_path: Path) -> None:
    """A cluster's nodes share one jar folder (``libs_home``); in a fresh home the first node to
    start assembles it there, without `infra install` having run (verify --brokers 3 starts a
    cluster this way)."""
    node = KafkaBroker(
        port=free_port(), controller_port=free_port(), home=tmp_path / "kafka-cluster" / "node-1", node_id=1,
        voters="1@127.0.0.1:1", libs_home=tmp_path / "kafka",
    )
    assert node.install() and node.is_installed()
    assert any((tmp_path / "kafka" / "libs").glob("kafka-clients-*.jar")), sorted((tmp_path / "kafka").rglob("*"))[:10]


def test_abort_hanging_names_an_open_transaction_and_aborts_it_only_when_told(infra: None) -> None:
    """`onceflow infra abort-hanging` (issue 39, KIP-664) through Kafka's own TransactionsCommand:
    a producer that began a transaction and went quiet holds the partition's last stable offset
    back. Found and named; left alone without --abort --force (its coordinator knows it: not
    hanging); aborted with them, after which read_committed readers go on and see none of it."""
    common = CommonSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.")
    topic = common.topic("held")
    admin = clients.admin(common)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    # The broker's cap (60 s): the coordinator would abort it then; both commands fit well inside.
    producer = clients.transactional_producer(common, f"{common.topic_prefix}quiet", **{"transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, f"r{n}".encode(), b"k")
    assert producer.flush(30) == 0
    env = {**os.environ, "ONCEFLOW_TOPIC_PREFIX": common.topic_prefix}
    try:
        found = _onceflow(env, "abort-hanging", "--topic", topic, "--older-than", "2", "--abort")
        assert found.returncode == 1, found.stdout + found.stderr  # not hanging: --abort leaves it
        assert f"{topic}[0]: producer" in found.stdout and "from offset 0: open: its coordinator knows it" in found.stdout, found.stdout
        assert "aborted" not in found.stdout and hanging_transactions(common, [topic]) == {topic: [0]}
        done = _onceflow(env, "abort-hanging", "--topic", topic, "--older-than", "2", "--abort", "--force")
        assert done.returncode == 0 and "aborted" in done.stdout, done.stdout + done.stderr
        assert hanging_transactions(common, [topic], wait_s=10) == {}
        assert read_committed(common, topic, timeout_s=10) == []
        again = _onceflow(env, "abort-hanging", "--topic", topic, "--older-than", "1")
        assert again.returncode == 0 and "no partition" in again.stdout, again.stdout
    finally:
        delete_topics(common.kafka_bootstrap, prefix=common.topic_prefix)
