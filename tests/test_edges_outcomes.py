"""Exactly-once where time and outcomes meet the outside world (issue 46), black-box on the real
broker and Redis:

- an outage longer than the dedup horizon, with a sink killed between its Redis apply and its
  acks: the trees behind the lost acks time out after the gate has forgotten their ids, and a
  replay of them would be counted twice (docs/decisions/0022);
- a stalled gate and a caller waiting for PROCESSED: an answer of ABORTED made the caller send
  the record again as new while the original was still on its way;
- ingest and source hosts whose clocks are two hours off: the horizon followed their clocks, so a
  slow host's records passed unremembered and a fast host's one record made the gate forget the
  rest.

Each judges a drained pipeline: the result table against a plain fold, or every record_id once
in dedup.records."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.faults import CLOCK_SKEW_ENV
from onceflow.kafka.clients import plain_config
from onceflow.kafka.inspect import consumed_everything, read_committed
from onceflow.kafka.topics import TIMESTAMP_TYPE
from onceflow.topology import DEDUP, SOURCE, Topic
from onceflow.v1 import dedup_pb2, dedup_pb2_grpc, ingest_pb2, ingest_pb2_grpc
from onceflow.v1.acker_pb2 import TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow_client import IngestClient, RetryPolicy
from onceflow_tools.infra.topics import delete_topics, ensure_topics, shared_specs
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, Pipeline, eventually, free_port
from tests.harness.supervised import supervised

pytestmark = [pytest.mark.edges, pytest.mark.integration, pytest.mark.fault]

HOUR_MS = 3_600_000


def drained(supervisor: Supervisor) -> bool:
    """True once nothing is in flight; restarts whatever exited meanwhile (a paused member that
    lost its group exits for a restart)."""
    supervisor.restart_exited()
    return undrained(CommonSettings(topic_prefix=supervisor.prefix), usersum.JOB) == []


def send(address: str, records: list[KeyedRecord]) -> None:
    with IngestClient(address, RetryPolicy(max_attempts=100)) as client:
        assert client.ingest(usersum.ingest_records(records)).accepted == len(records)


def read(prefix: str, topic: str) -> list:  # type: ignore[type-arg]
    common = CommonSettings(topic_prefix=prefix)
    return read_committed(common, common.topic(topic))


def gate_stats(address: str) -> dedup_pb2.DedupStatsReply:
    with grpc.insecure_channel(address) as channel:
        return dedup_pb2_grpc.DedupAdminStub(channel).Stats(dedup_pb2.DedupStatsRequest(), timeout=10)


# -- an outage past the horizon, behind a sink that lost its acks -------------------------------

HORIZON = {"BUCKET_MS": "2000", "HORIZON_MS": "8000"}


# Replays are opt-in (ADR 0022): their run is in `make test-extended`, to keep the suite's time.
@pytest.fixture(params=["no-replays", pytest.param("replays", marks=pytest.mark.extended)])
def outage(request: pytest.FixtureRequest, infra: None, tmp_path: Path) -> Iterator[Supervisor]:
    """The default (trees that time out are not replayed), and Storm's replays switched on, where
    the gate must refuse what it can no longer judge."""
    ingest = {"TREE_TIMEOUT_MS": "5000", "REPLAY": str(request.param == "replays").lower()}
    settings = {"compute": {"JOB": usersum.JOB}, "dedup": HORIZON, "ingest": ingest}
    yield from supervised(tmp_path, settings, {**COMPUTE_NOT_UNDER_TEST, "ONCEFLOW_LOOP_PUNCTUATE_MS": "250"})


def test_lost_sink_acks_after_an_outage_longer_than_the_horizon_are_never_applied_twice(outage: Supervisor) -> None:
    sup = outage
    # The acker is stopped from here for longer than the horizon, while records keep coming: the
    # gate's stream time (the broker's clock) passes the horizon and its GC forgets the first
    # records' ids before any of their trees can time out.
    acker = sup.instances["acker"]
    acker.process.sigstop()
    # A sink that dies after its first Redis apply, before that batch's acks: their trees stay open.
    sup.kill9("sink", fault="after_apply@1")
    sup.instances["sink"].process.wait_healthy(sup.address("sink"), 120)
    before = list(usersum.records(40, users=4, id_prefix="acks-lost", seed=3))
    send(sup.address("ingest"), before)
    sup.instances["sink"].process.wait_exit(120)
    sup.restart_exited()
    sup.instances["sink"].process.wait_healthy(sup.address("sink"), 120)
    eventually(lambda: usersum.sink_table(sup.address("sink")) == usersum.fold_answer(before), 120, "the first records in Redis")

    during: list[KeyedRecord] = []
    horizon_s = (int(HORIZON["HORIZON_MS"]) + 3 * int(HORIZON["BUCKET_MS"])) / 1000
    started = time.monotonic()
    while time.monotonic() - started < horizon_s:
        batch = list(usersum.records(5, users=4, id_prefix=f"during-{len(during)}", seed=len(during)))
        send(sup.address("ingest"), batch)
        during += batch
        time.sleep(0.5)
    eventually(lambda: gate_stats(sup.address("dedup")).expired_ids >= len(before), 60, "the gate to forget the first ids")

    acker.process.sigcont()
    eventually(lambda: drained(sup), 180, "the pipeline to drain", interval_s=2.0)

    events = [TreeEvent.FromString(r.value) for r in read(sup.prefix, Topic.ACKER_EVENTS)]
    first_ids = {r.record_id for r in before}
    timed_out = {e.origin.record_id for e in events if e.outcome == TreeEvent.TIMED_OUT} & first_ids
    assert timed_out, "the scenario did not happen: no tree of the first records timed out"
    assert usersum.sink_table(sup.address("sink")) == usersum.fold_answer(before + during)
    replays = [decode_envelope(r.value) for r in read(sup.prefix, Topic.INGEST_RECORDS)]
    replayed = {e.record_id for e in replays if e.attempt > 1}
    refused = [DeadLetter.FromString(r.value) for r in read(sup.prefix, Topic.DEDUP_DLQ)]
    if sup.settings["ingest"]["REPLAY"] == "true":
        # Replays happened, and the gate turned away each that came after its original's horizon.
        assert replayed & timed_out, "no replay of a timed-out tree reached ingest.records"
        assert {decode_envelope(l.original).record_id for l in refused} <= replayed
        assert all(l.error_class == "ReplayBeyondHorizon" for l in refused)
    else:
        assert replayed == set() and refused == []


# -- a stalled gate, and what the waiting caller is told ---------------------------------------


@pytest.fixture
def stalling(infra: None, tmp_path: Path) -> Iterator[Supervisor]:
    settings = {"compute": {"JOB": usersum.JOB}, "ingest": {"TREE_TIMEOUT_MS": "3000"}}
    yield from supervised(tmp_path, settings, {**COMPUTE_NOT_UNDER_TEST, "ONCEFLOW_LOOP_PUNCTUATE_MS": "250"})


def test_a_stalled_gate_never_makes_ingest_answer_aborted_for_a_record_that_will_be_applied(stalling: Supervisor) -> None:
    """The caller acts on what it is told, as the client docs say: ABORTED means the records took
    no effect, so they are sent again as new records; an unknown outcome (DEADLINE_EXCEEDED) is
    retried under the same record_ids. Either way each must count once."""
    sup = stalling
    wanted = list(usersum.records(10, users=3, id_prefix="stalled", seed=5))
    gate = sup.instances["dedup"].process
    gate.sigstop()
    try:
        with grpc.insecure_channel(sup.address("ingest")) as channel:
            request = ingest_pb2.IngestRequest(records=usersum.ingest_records(wanted), wait=ingest_pb2.WAIT_FOR_PROCESSED)
            with pytest.raises(grpc.RpcError) as answer:
                ingest_pb2_grpc.IngestStub(channel).Ingest(request, timeout=60)
    finally:
        gate.sigcont()
    code = answer.value.code()
    if code == grpc.StatusCode.ABORTED:
        send(sup.address("ingest"), [KeyedRecord(f"{r.record_id}:again", r.user, r.amount) for r in wanted])
    else:
        send(sup.address("ingest"), wanted)
    eventually(lambda: drained(sup), 180, "the pipeline to drain", interval_s=2.0)

    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "outcome unknown" in (answer.value.details() or ""), (
        code, answer.value.details())
    assert usersum.sink_table(sup.address("sink")) == usersum.fold_answer(wanted)
    assert read(sup.prefix, Topic.INGEST_DLQ) == []


# -- clocks an hour or two off ----------------------------------------------------------------


def test_hosts_with_skewed_clocks_cannot_move_the_horizon(pipeline: Pipeline) -> None:
    """Three ingest instances and a Kafka source on one gate: ingest on time, one two hours
    slow, one two hours fast, and a source two hours slow. A slow host's records and their
    copies, and every record sent again after the fast host's one record, must each pass the
    gate once."""
    gate_address = f"127.0.0.1:{free_port()}"
    gate = pipeline.process(
        "dedup", "onceflow_dedup", ONCEFLOW_DEDUP_PORT=gate_address.rsplit(":", 1)[1], ONCEFLOW_DEDUP_METRICS_PORT="0",
        ONCEFLOW_DEDUP_ACK_MODE="off", ONCEFLOW_LOOP_PUNCTUATE_MS="250",
    ).start()
    ingests = {}
    for name, skew_ms in (("on-time", 0), ("slow", -2 * HOUR_MS), ("fast", 2 * HOUR_MS)):
        address = f"127.0.0.1:{free_port()}"
        ingests[name] = address
        pipeline.process(
            f"ingest-{name}", "onceflow_ingest", ONCEFLOW_INGEST_PORT=address.rsplit(":", 1)[1], ONCEFLOW_INGEST_METRICS_PORT="0",
            ONCEFLOW_INGEST_INSTANCE=name, ONCEFLOW_INGEST_ACKING="false", **{CLOCK_SKEW_ENV: str(skew_ms)},
        ).start().wait_healthy(address)
    # The source's records are copies of one another by their "id" field: each is in the topic twice.
    common = pipeline.common
    topic = pipeline.topic("user.orders")
    admin = AdminClient(plain_config(common.kafka_bootstrap))  # kept alive until its future completes
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    sourced = [KeyedRecord(f"sourced:{i}", f"u{i % 4}", i + 1) for i in range(20)]
    producer = Producer(plain_config(common.kafka_bootstrap))
    for copy in range(2):
        for r in sourced:
            producer.produce(topic, json.dumps({"id": r.record_id, "user": r.user, "amount": r.amount}), r.user)
        producer.flush(30)
    source_address = f"127.0.0.1:{free_port()}"
    pipeline.process(
        "source-slow", "onceflow_source", ONCEFLOW_SOURCE_PORT=source_address.rsplit(":", 1)[1],
        ONCEFLOW_SOURCE_METRICS_PORT="0", ONCEFLOW_SOURCE_TOPIC=topic, ONCEFLOW_SOURCE_ID_FIELD="id",
        ONCEFLOW_SOURCE_ACKING="false", **{CLOCK_SKEW_ENV: str(-2 * HOUR_MS)},
    ).start().wait_healthy(source_address)
    gate.wait_healthy(gate_address)

    on_time = list(usersum.records(20, users=4, id_prefix="on-time"))
    slow = list(usersum.records(20, users=4, id_prefix="slow"))
    send(ingests["on-time"], on_time)
    send(ingests["slow"], slow)
    send(ingests["slow"], slow)  # a retry: the slow host's first copies must be remembered
    eventually(lambda: consumed_everything(common, SOURCE.group_id(common.topic_prefix, job=topic), topic), 90,
               "the slow source to copy its topic")
    send(ingests["fast"], [KeyedRecord("fast:0", "u0", 1)])
    send(ingests["on-time"], on_time)  # copies after the fast host's record: not forgotten
    eventually(
        lambda: consumed_everything(common, DEDUP.group_id(common.topic_prefix), pipeline.topic(Topic.INGEST_RECORDS)),
        90, "the gate to read ingest.records to the end",
    )

    passed = Counter(decode_envelope(r.value).record_id for r in read_committed(common, pipeline.topic(Topic.DEDUP_RECORDS)))
    assert passed == Counter({r.record_id: 1 for r in on_time + slow + sourced} | {"fast:0": 1})
    stats = gate_stats(gate_address)
    assert stats.expired_ids == 0
    # Measured, though obeyed by nothing: two hours each way.
    assert stats.clock_behind_ms >= 2 * HOUR_MS - 60_000 and stats.clock_ahead_ms >= 2 * HOUR_MS - 60_000, stats


# -- the migration: topics made before LogAppendTime -----------------------------------------


def test_infra_topics_sets_log_append_time_on_topics_made_before(pipeline: Pipeline) -> None:
    """A pipeline whose ingest.records and acker.acks were created stamped by their writers (as
    before issue 46) gets the broker's clock on them from `onceflow infra topics` (ensure_topics),
    idempotently; until then the gate falls back to ingest time with a warning."""
    common = pipeline.common
    prefix = f"{common.topic_prefix}old."
    wanted = [s for s in shared_specs() if s.timestamp_type]
    assert {s.name for s in wanted} == {Topic.INGEST_RECORDS, Topic.ACKER_ACKS}
    ensure_topics(common.kafka_bootstrap, prefix=prefix, specs=[dataclasses.replace(s, timestamp_type=None) for s in wanted])
    admin = AdminClient(plain_config(common.kafka_bootstrap))

    def stamps() -> set[str]:
        resources = [ConfigResource(ResourceType.TOPIC, prefix + s.name) for s in wanted]
        return {f.result()[TIMESTAMP_TYPE].value for f in admin.describe_configs(resources, request_timeout=30).values()}

    try:
        assert stamps() == {"CreateTime"}
        ensure_topics(common.kafka_bootstrap, prefix=prefix, specs=wanted)
        assert stamps() == {"LogAppendTime"}
        ensure_topics(common.kafka_bootstrap, prefix=prefix, specs=wanted)  # idempotent
        assert stamps() == {"LogAppendTime"}
    finally:
        delete_topics(common.kafka_bootstrap, prefix=prefix)
