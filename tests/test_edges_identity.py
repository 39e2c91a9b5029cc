"""Issue 46, "Identity" (`pytest -m edges`): the Kafka source's default record id names the
record's place in the world, its cluster and its topic's id included, against the real pipeline
(usersum on the pandas engine, the sink's table, judged once the pipeline has drained).

- A topic copied, deleted, created again under its name and filled anew, then copied by the
  restarted source: the table counts both topics' records. With `topic/partition/offset` ids
  the new topic's records carried the old ones' ids and the dedup gate dropped them.
- Two same-named topics, one on the pipeline's cluster and one on a second cluster, both
  copied: the table counts both. The second one is then recreated on its cluster while its
  positions stay in `source.offsets`: the source says it was recreated and copies it from its
  start under its new identity.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import consumed_everything, end_offsets
from onceflow.kafka.topic_ids import read_topic_id
from onceflow.topology import SOURCE, Topic
from onceflow.txn.external import ExternalTopic, read_positions
from onceflow_client import QueryClient
from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually
from tests.harness.supervised import supervised

pytestmark = [pytest.mark.edges, pytest.mark.source, pytest.mark.integration, pytest.mark.xdist_group("source")]
JOB = usersum.JOB
N = 300  # records per topic: 3 partitions of ~100, each offset used by both topics


@dataclass
class Running:
    supervisor: Supervisor
    common: CommonSettings
    log_dir: Path

    def source(self, topic: str, instance: str, **env: str) -> ServiceProcess:
        process = pipeline_service(
            "source", f"127.0.0.1:{free_port()}", self.common.topic_prefix, instance, self.log_dir,
            log_name=f"source-{instance}", TOPIC=topic,
        )
        process.env.update({"ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS), **env})
        return process

    def copied(self, topic: str) -> bool:
        try:
            return consumed_everything(self.common, SOURCE.group_id(self.common.topic_prefix, job=topic), topic)
        except KafkaException:
            return False

    def rows(self, users: str) -> dict[str, dict]:
        """The table's rows of ``users`` (a key prefix); {} while the sink does not answer."""
        try:
            with QueryClient(self.supervisor.address("sink")) as query:
                return {key: json.loads(value) for key, value in query.scan(JOB, users)}
        except grpc.RpcError:
            return {}


@pytest.fixture(scope="module")
def running(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    log_dir = tmp_path_factory.mktemp("identity")
    for supervisor in supervised(log_dir, {}, COMPUTE_NOT_UNDER_TEST):
        yield Running(supervisor, CommonSettings(topic_prefix=supervisor.prefix), log_dir)


def create_topic(bootstrap: str, name: str) -> None:
    """Create ``name`` (3 partitions); after a delete, once the broker has let go of the old one."""
    admin = AdminClient(clients.plain_config(bootstrap))

    def created() -> bool:
        try:
            admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(30)
            return True
        except KafkaException as exc:
            if "already exists" in str(exc) or "marked for deletion" in str(exc):
                return False
            raise

    eventually(created, 60, f"topic {name} to be created")


def recreate_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient(clients.plain_config(bootstrap))
    before = read_topic_id(admin, name)
    admin.delete_topics([name])[name].result(30)
    eventually(lambda: name not in admin.list_topics(timeout=15).topics, 60, f"topic {name} to be gone")
    create_topic(bootstrap, name)

    def new_id() -> str:
        try:
            return read_topic_id(admin, name)
        except KafkaException:  # the broker's metadata does not know it yet
            return ""

    assert eventually(new_id, 30, f"topic {name}'s new id") != before


def fill(bootstrap: str, name: str, users: str, seed: int) -> list[KeyedRecord]:
    """N usersum records over the topic's 3 partitions, keyed by user."""
    rng = random.Random(seed)
    producer = Producer(clients.plain_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    records = [KeyedRecord(f"{seed}-{i}", f"{users}{rng.randrange(12)}", rng.randrange(1, 1000)) for i in range(N)]
    for record in records:
        producer.produce(name, record.payload, key=record.user.encode())
    assert producer.flush(30) == 0
    return records


def judge(running: Running, users: str, records: list[KeyedRecord]) -> None:
    """The table's rows of ``users`` are the fold of ``records``, on a drained pipeline."""
    answer = usersum.fold_answer(records)
    eventually(lambda: running.rows(users) == answer, 90, "the table to count every record of both topics", interval_s=1)
    eventually(lambda: not undrained(running.common, JOB), 90, "the pipeline to drain", interval_s=1)
    rows = running.rows(users)
    assert sum(r["count"] for r in rows.values()) == len(records), "records lost or counted twice"
    assert rows == answer


def test_a_recreated_topic_is_copied_again_under_its_new_identity(running: Running) -> None:
    bootstrap = running.common.kafka_bootstrap
    name = f"{running.common.topic_prefix}user.orders"
    create_topic(bootstrap, name)
    first = fill(bootstrap, name, "o", seed=1)
    source = running.source(name, "s").start()
    try:
        eventually(lambda: running.copied(name), 60, "the source to copy the first topic")
    finally:
        source.terminate()
    recreate_topic(bootstrap, name)
    second = fill(bootstrap, name, "o", seed=2)  # the same offsets again: 0.. on each partition
    source = running.source(name, "s").start()
    try:
        eventually(lambda: running.copied(name), 60, "the restarted source to copy the new topic")
        judge(running, "o", first + second)
    finally:
        source.terminate()


def test_same_named_topics_of_two_clusters_are_two_topics_and_a_recreated_one_is_said_and_copied_again(
    running: Running, other_cluster: KafkaBroker
) -> None:
    common, remote = running.common, other_cluster.bootstrap
    name = f"{common.topic_prefix}user.payments"
    create_topic(common.kafka_bootstrap, name)
    create_topic(remote, name)
    here, there = fill(common.kafka_bootstrap, name, "p", seed=3), fill(remote, name, "p", seed=4)
    cluster_id = AdminClient(clients.plain_config(remote)).list_topics(timeout=15).cluster_id
    external = ExternalTopic(remote, name, cluster_id)
    positions = common.topic(Topic.SOURCE_OFFSETS)

    def remote_copied() -> bool:
        ends = {p: high for p, (_lso, high) in end_offsets(CommonSettings(kafka_bootstrap=remote), name).items()}
        return read_positions(common, positions, external) == ends

    local = running.source(name, "local").start()
    far = running.source(name, "far", ONCEFLOW_SOURCE_BOOTSTRAP=remote).start()
    try:
        eventually(lambda: running.copied(name) and remote_copied(), 60, "both sources to copy their topic")
    finally:
        local.terminate()
        far.terminate()
    # Recreated on the second cluster: source.offsets still holds the old topic's positions.
    recreate_topic(remote, name)
    again = fill(remote, name, "p", seed=5)
    far = running.source(name, "far", ONCEFLOW_SOURCE_BOOTSTRAP=remote).start()
    try:
        eventually(remote_copied, 60, "the restarted source to copy the recreated topic")
        judge(running, "p", here + there + again)
        log = far.log_path.read_text(errors="replace")
        assert f"topic {name} was recreated (id " in log and "copying it from its start under its new identity" in log, log[-3000:]
    finally:
        far.terminate()
