"""Named streams (issue 45 item 1, docs/decisions/0025) on the real broker and Redis: two jobs
on two streams, through the whole pipeline (ingest, the acker, the gate, compute on the pandas
engine, the sink).

usersum reads the default stream and paycount reads ``payments``; their schemas differ, so a
record of one stream reaching the other's job would be a dead letter, and counted twice in no
table. Both streams carry the same record_ids (order ``r:17`` and payment ``r:17`` are two
records), part of each is sent twice, and the gate and both jobs are killed -9 mid-stream. Judged
once drained: each table equals the fold of its own stream's records, compute.dlq is empty, and
each job's map group has read its own stream's topic only. A stream that does not exist is
refused, naming it: by ingest (INVALID_ARGUMENT on records[i].stream) and by a job at start
(exit 2)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from onceflow import streams
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import committed_offsets, read_committed
from onceflow.service_main import EXIT_USAGE
from onceflow.topology import Topic
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client import IngestClient, QueryClient, RecordsRejected
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually

pytestmark = [pytest.mark.streams, pytest.mark.integration, pytest.mark.xdist_group("streams")]
PAYMENTS = "payments"
PAY_JOB = "paycount"
PAY_MODULE = "tests.harness.jobs.paycount"


def payment(record: KeyedRecord) -> IngestRecord:
    """A payment under the same record_id as an order: another record, of another stream."""
    body = json.dumps({"payer": f"p{record.user}", "cents": record.amount * 3}).encode()
    return IngestRecord(record_id=record.record_id.encode(), key=f"p{record.user}".encode(), payload=body, stream=PAYMENTS.encode())


def pay_answer(records: list[KeyedRecord]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(f"p{r.user}", {"payer": f"p{r.user}", "payments": 0, "cents": 0})
        row["payments"] += 1
        row["cents"] += r.amount * 3
    return rows


@dataclass
class Pipeline:
    supervisor: Supervisor
    common: CommonSettings
    log_dir: Path
    env: dict[str, str]
    pay: ServiceProcess | None = None
    pay_address: str = ""
    orders: list[KeyedRecord] = field(default_factory=list)
    payments: list[KeyedRecord] = field(default_factory=list)

    def compute(self, module: str, instance: str, address: str) -> ServiceProcess:
        process = pipeline_service("compute", address, self.common.topic_prefix, instance, self.log_dir, JOB=module)
        process.env.update(self.env)
        return process.start()

    def start_pay(self) -> None:
        self.pay_address = self.pay_address or f"127.0.0.1:{free_port()}"
        self.pay = self.compute(PAY_MODULE, "pay", self.pay_address)
        self.pay.wait_healthy(self.pay_address, 180)

    def table(self, job: str) -> dict[str, dict]:
        with QueryClient(self.supervisor.address("sink")) as query:
            return {key: json.loads(value) for key, value in query.scan(job)}


@pytest.fixture(scope="module")
def pipeline(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    assert streams.create(common, PAYMENTS)
    assert not streams.create(common, PAYMENTS)  # a second create finds it
    log_dir = tmp_path_factory.mktemp("streams")
    env = {
        "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
        **COMPUTE_NOT_UNDER_TEST,
    }
    supervisor = Supervisor(prefix, log_dir, env=env)
    running = Pipeline(supervisor, common, log_dir, env)
    try:
        supervisor.start_all()
        running.start_pay()
        yield running
    finally:
        if running.pay is not None:
            running.pay.ensure_dead()
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def test_a_stream_that_does_not_exist_is_refused_by_ingest_and_by_a_job(pipeline: Pipeline) -> None:
    with IngestClient(pipeline.supervisor.address("ingest"), stream="ordres") as client:
        with pytest.raises(RecordsRejected) as refused:
            client.ingest([{"record_id": "x", "payload": "{}"}])
    [rejection] = refused.value.rejections
    assert rejection.field == "stream" and "no stream 'ordres'" in rejection.message, refused.value
    assert "onceflow stream create ordres" in rejection.message
    lost = pipeline.compute("tests.harness.jobs.lost_stream", "lost", f"127.0.0.1:{free_port()}")
    assert lost.wait_exit(timeout_s=60) == EXIT_USAGE
    assert "no stream 'nosuch'" in lost.log_tail()


def test_two_jobs_on_two_streams_each_exact_through_kill9s(pipeline: Pipeline) -> None:
    orders = list(usersum.records(1_200, users=30, id_prefix="r"))
    address = pipeline.supervisor.address("ingest")
    with IngestClient(address) as default_client, IngestClient(address, stream=PAYMENTS) as pay_client:
        for start in range(0, len(orders), 100):
            chunk = orders[start:start + 100]
            default_client.ingest(usersum.ingest_records(chunk))
            pay_client.ingest([payment(r) for r in chunk])
            if start % 300 == 0:
                # Sent again, as after a lost reply: the gate drops each copy within its own stream.
                default_client.ingest(usersum.ingest_records(chunk[:20]))
                pay_client.ingest([payment(r) for r in chunk[:20]])
            if start == 300:
                pipeline.supervisor.kill9("dedup")
            if start == 600:
                pipeline.supervisor.kill9("compute")
                assert pipeline.pay is not None
                pipeline.pay.kill9()
                pipeline.start_pay()
    pipeline.orders += orders
    pipeline.payments += orders

    def exact() -> bool:
        try:
            return (
                pipeline.table(usersum.JOB) == usersum.fold_answer(pipeline.orders)
                and pipeline.table(PAY_JOB) == pay_answer(pipeline.payments)
            )
        except grpc.RpcError:
            return False

    eventually(exact, 240, "each table to equal the fold of its own stream", interval_s=2)
    common = pipeline.common
    eventually(lambda: not undrained(common, usersum.JOB) and not undrained(common, PAY_JOB, PAYMENTS), 180,
               "the pipeline to drain", interval_s=2)
    assert pipeline.table(usersum.JOB) == usersum.fold_answer(pipeline.orders)
    assert pipeline.table(PAY_JOB) == pay_answer(pipeline.payments)
    assert not read_committed(common, common.topic(Topic.COMPUTE_DLQ), timeout_s=5), "a job met another stream's record"
    # Each map group read its own stream's topic, and none of the other's.
    pay_group = f"{common.topic_prefix}onceflow-compute-{PAY_JOB}-map"
    own_group = f"{common.topic_prefix}onceflow-compute-{usersum.JOB}-map"
    pay_topic, own_topic = common.topic(streams.topic_of(PAYMENTS)), common.topic(Topic.DEDUP_RECORDS)
    assert all(o >= 0 for o in committed_offsets(common, pay_group, pay_topic).values())
    assert all(o < 0 for o in committed_offsets(common, pay_group, own_topic).values())
    assert all(o < 0 for o in committed_offsets(common, own_group, pay_topic).values())
    assert len(read_committed(common, pay_topic)) == len(orders) and len(read_committed(common, own_topic)) == len(orders)
