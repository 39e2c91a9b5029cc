"""The Faust bridge (`onceflow_client.faust`, examples/faust_forwarder.py) against a real pipeline
(`pytest -m source`): a Faust worker forwards a pre-filled topic into onceflow and is killed -9
twice mid-stream. Faust is at-least-once, so each restart reads events again whose offsets it had
not committed; the gate must drop every second copy. Judged once the table equals the fold of
the topic and every group has read to the end: each event counted exactly once, and the gate
seen dropping the re-sent copies (without them this test would prove nothing)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.config import CommonSettings, repo_root
from onceflow.v1 import dedup_pb2, dedup_pb2_grpc
from onceflow_client import QueryClient
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually

pytestmark = [pytest.mark.source, pytest.mark.fault, pytest.mark.integration, pytest.mark.xdist_group("faust")]
EVENTS = 4000
KILL_AFTER = (900, 900)  # events forwarded by the running worker before each kill -9
_FORWARDED = re.compile(r"forwarded \d+ events \((\d+) in all\)")


@pytest.fixture
def pipeline(infra: None, tmp_path: Path) -> Iterator[tuple[Supervisor, CommonSettings]]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    (tmp_path / "pipeline").mkdir()
    supervisor = Supervisor(
        prefix, tmp_path / "pipeline",
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            **COMPUTE_NOT_UNDER_TEST,
        },
    )
    try:
        supervisor.start_all()
        yield supervisor, common
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def fill_topic(bootstrap: str, topic: str, events: list[KeyedRecord]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event in events:
        producer.produce(topic, event.payload, key=event.user.encode())
    assert producer.flush(60) == 0


def forwarded_by_this_start(worker: ServiceProcess) -> int:
    """Events the running worker has sent (its log since its last start)."""
    text = worker.log_path.read_text(errors="replace").rsplit("===== start #", 1)[-1]
    counts = _FORWARDED.findall(text)
    return int(counts[-1]) if counts else 0


def test_a_faust_forwarder_killed_twice_mid_stream_counts_every_event_once(
    pipeline: tuple[Supervisor, CommonSettings], tmp_path: Path,
) -> None:
    supervisor, common = pipeline
    events = list(usersum.records(EVENTS, users=50, id_prefix="unused", seed=7))
    topic = f"{common.topic_prefix}orders"
    fill_topic(common.kafka_bootstrap, topic, events)
    worker = ServiceProcess(
        "faust-forwarder", "faust", args=["-A", "faust_forwarder", "worker", "-l", "info"],
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "FORWARD_TOPIC": topic,
            "FORWARD_APP_ID": f"{common.topic_prefix}forwarder", "ONCEFLOW_INGEST_ADDRESS": supervisor.address("ingest"),
            # Each batch waits until its effect is in the table: slow enough to kill mid-stream.
            "FORWARD_WAIT": "processed", "FORWARD_BATCH": "100",
        },
        log_dir=tmp_path, cwd=repo_root() / "examples",
    )
    worker.start()
    try:
        for kill_after in KILL_AFTER:
            eventually(lambda: forwarded_by_this_start(worker) >= kill_after or not worker.alive(), 240,
                       f"the forwarder to send {kill_after} events", interval_s=0.2)
            assert worker.alive(), worker.log_tail()
            worker.kill9()
            worker.start()
        answer = usersum.fold_answer(events)

        def table() -> dict[str, dict]:
            with QueryClient(supervisor.address("sink")) as query:
                return {key: json.loads(value) for key, value in query.scan(usersum.JOB)}

        eventually(lambda: table() == answer, 300, "the table to equal the fold of every event once", interval_s=2)
        eventually(lambda: not undrained(common, usersum.JOB), 120, "the pipeline to drain", interval_s=2)
        assert table() == answer
        assert worker.alive(), worker.log_tail()
    finally:
        worker.ensure_dead()
    with grpc.insecure_channel(supervisor.address("dedup")) as channel:
        stats = dedup_pb2_grpc.DedupAdminStub(channel).Stats(dedup_pb2.DedupStatsRequest(), timeout=5)
    assert stats.dropped > 0, "no event was sent twice: the kills fell where Faust had committed, so nothing was tested"
