"""Each service's real wiring against the topology (issue 40): every service is built as its
`run` builds it, against the real broker and Redis, and each hop it runs must read, dead-letter,
keep state in, join the group of and take the transactional id of exactly what
`onceflow.topology` declares for it. The topology builds the hops (`TransactionalLoop.for_hop`);
this proves no service wires one by hand, or wires the wrong one."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic

from onceflow import topology
from onceflow.config import CommonSettings, LoopSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import wait_partition_count
from onceflow.streams import topic_of
from onceflow.topology import Hop, job_topic
from onceflow.txn.driver import ConsumerDriver
from onceflow_tools.infra.topics import delete_topics, ensure_topics

pytestmark = [pytest.mark.foundation, pytest.mark.integration]

SERVED = {"port": "0", "metrics_port": "0"}


@pytest.fixture
def common(infra: None) -> Iterator[CommonSettings]:
    settings = CommonSettings(topic_prefix=f"w{uuid.uuid4().hex[:8]}.")
    ensure_topics(settings.kafka_bootstrap, prefix=settings.topic_prefix)
    yield settings
    delete_topics(settings.kafka_bootstrap, prefix=settings.topic_prefix)


def _check(loop: ConsumerDriver, hop: Hop, common: CommonSettings, instance: str, job: str = "", reads: str = "") -> None:
    prefix = common.topic_prefix
    assert hop.input is not None or reads, hop.name
    wanted = {
        "input": reads or common.topic(job_topic(hop.input, job)),  # type: ignore[arg-type]
        "group": hop.group_id(prefix, job),
        "transactional id": hop.transactional_id(prefix, instance, job),
        "dead letters": common.topic(hop.dlq),
    }
    wired = {
        "input": loop.input_topic, "group": loop.group_id, "transactional id": loop.transactional_id,
        "dead letters": getattr(loop, "dlq_topic"),
    }
    assert wired == wanted, f"{hop.name} is not wired as the topology declares it"
    stores = getattr(loop, "stores", None)
    if stores is not None:
        assert hop.changelog is not None and stores.changelog_topic == common.topic(job_topic(hop.changelog, job)), hop.name


def _env(monkeypatch: pytest.MonkeyPatch, common: CommonSettings, service: str, **settings: str) -> None:
    monkeypatch.setenv("ONCEFLOW_TOPIC_PREFIX", common.topic_prefix)
    for name, value in {**SERVED, "instance": f"{service}-w", **settings}.items():
        monkeypatch.setenv(f"ONCEFLOW_{service.upper()}_{name.upper()}", value)


def test_the_acker_dedup_and_sink_run_the_hops_the_topology_declares(
    common: CommonSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onceflow_acker import service as acker
    from onceflow_acker.config import AckerSettings
    from onceflow_dedup import service as dedup
    from onceflow_dedup.config import DedupSettings
    from onceflow_sink import service as sink
    from onceflow_sink.config import SinkSettings

    for name in ("acker", "dedup", "sink"):
        _env(monkeypatch, common, name)
    loop, server = acker.build(AckerSettings())
    _check(loop, topology.ACKER, common, "acker-w")
    server.stop(0)
    gate, server = dedup.build(DedupSettings())
    _check(gate, topology.DEDUP, common, "dedup-w")
    server.stop(0)
    worker, server, _follower = sink.build(SinkSettings())
    _check(worker, topology.SINK, common, "sink-w")
    server.stop(0)


def test_ingest_runs_its_replayer_as_declared(common: CommonSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow_ingest.config import IngestSettings
    from onceflow_ingest.service import IngestService

    _env(monkeypatch, common, "ingest")
    service = IngestService(IngestSettings())
    assert service.replayer is not None
    _check(service.replayer, topology.INGEST_REPLAYER, common, "ingest-w")
    assert service.settings.transactional_id == topology.INGEST.transactional_id(common.topic_prefix, "ingest-w")
    # Its controls reach the replayer too: a paused or drained ingest writes no replays either.
    asked: list[str] = []
    replayer = service.replayer
    monkeypatch.setattr(replayer, "pause", lambda: asked.append("pause"))
    monkeypatch.setattr(replayer, "resume", lambda: asked.append("resume"))
    monkeypatch.setattr(replayer, "drain", lambda _timeout: asked.append("drain") is None)
    assert (service.pause(), service.resume(), service.drain(0.1)) == ("PAUSED", "RUNNING", ("DRAINED", True))
    assert asked == ["pause", "resume", "pause", "drain"]
    service.server.stop(0)


@pytest.mark.parametrize("job", ["usersum", "nexmark_q5"])  # an aggregation; a windowed one (its map hop keeps event time)
def test_compute_runs_a_jobs_map_and_merge_hops_as_declared(
    common: CommonSettings, monkeypatch: pytest.MonkeyPatch, job: str
) -> None:
    from onceflow_compute import service as compute
    from onceflow_compute.config import ComputeSettings

    _env(monkeypatch, common, "compute", job=job, engine="pandas")
    loops, server, _engine = compute.build(ComputeSettings())
    map_loop, merge_loop = loops
    stream = common.topic(topic_of(""))  # the jobs read the default stream
    _check(map_loop, topology.COMPUTE_MAP, common, "compute-w", job, reads=stream)
    assert (getattr(map_loop, "stores") is not None) == (job == "nexmark_q5")
    _check(merge_loop, topology.COMPUTE_MERGE, common, "compute-w", job)
    server.stop(0)


def test_the_source_runs_its_hop_as_declared(common: CommonSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow_source import service as source
    from onceflow_source.config import SourceSettings

    topic = f"{common.topic_prefix}orders"
    admin = clients.admin(common)  # held: a freed AdminClient never completes its futures
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    wait_partition_count(common, topic, threading.Event())  # the source reads the topic's id at once
    _env(monkeypatch, common, "source", topic=topic)
    loop, server, _stage = source.build(SourceSettings())
    _check(loop, topology.SOURCE, common, "source-w", job=topic, reads=topic)
    server.stop(0)


def test_the_check_fails_a_hop_wired_by_hand(common: CommonSettings) -> None:
    """The control: a loop built with the wrong group (a hand-wired copy that drifted) fails."""
    from onceflow.txn import TransactionalLoop

    class _Nothing:
        name = "acker"

        def process(self, batch: object) -> None:
            pass

    loop = TransactionalLoop(
        stage=_Nothing(), common=common, settings=LoopSettings(), input_topic=common.topic(topology.Topic.ACKER_ACKS),  # type: ignore[arg-type]
        group_id=f"{common.topic_prefix}onceflow-acker-old", transactional_id=topology.ACKER.transactional_id(common.topic_prefix, "a"),
        dlq_topic=common.topic(topology.Topic.ACKER_DLQ),
    )
    with pytest.raises(AssertionError, match="not wired as the topology declares"):
        _check(loop, topology.ACKER, common, "a")
