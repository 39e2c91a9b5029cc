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
(exit 2).

Dead letters re-driven (issue 45 item 2, docs/decisions/0026): picky, a second job on the
default stream, refuses what usersum refuses. Records usersum refused are re-driven to usersum
alone with corrected payloads, some still wrong: the table ends equal to the fold of the
corrected input, picky never sees them, a second redrive of the same letters changes nothing,
and a letter that failed again is re-driven once more, counted once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from onceflow import readers, streams
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import committed_offsets, read_committed
from onceflow.kafka.registry import read_registry
from onceflow.producers import token_sha256
from onceflow.service_main import EXIT_USAGE
from onceflow.topology import Topic
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client import IngestClient, QueryClient, RecordsRejected, RetryPolicy
from onceflow_client.dlq import DeadLetters, Letter, LetterFilter
from onceflow_tools import redrive
from onceflow_tools.jobs import lifecycle
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
PICKY_JOB = "picky"


def picky_answer(records: list[KeyedRecord]) -> dict[str, dict]:
    """picky's table: usersum's total and count, without the records of amount 13 (its letters)."""
    rows: dict[str, dict] = {}
    for r in records:
        if r.amount == 13:
            continue
        row = rows.setdefault(r.user, {"user": r.user, "total": 0, "count": 0})
        row["total"] += r.amount
        row["count"] += 1
    return rows


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
    picky: ServiceProcess | None = None
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
        picky_address = f"127.0.0.1:{free_port()}"
        running.picky = running.compute("tests.harness.jobs.picky", "picky", picky_address)
        running.start_pay()
        running.picky.wait_healthy(picky_address, 180)
        yield running
    finally:
        for process in (running.pay, running.picky):
            if process is not None:
                process.ensure_dead()
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
    assert pipeline.table(PICKY_JOB) == picky_answer(pipeline.orders)
    letters = _letters(common)
    assert not [letter for letter in letters if letter.job != PICKY_JOB], "a job met another stream's record"
    assert sorted(letter.record_id for letter in letters) == sorted(r.record_id for r in orders if r.amount == 13)
    # Each map group read its own stream's topic, and none of the other's.
    pay_group = f"{common.topic_prefix}onceflow-compute-{PAY_JOB}-map"
    own_group = f"{common.topic_prefix}onceflow-compute-{usersum.JOB}-map"
    pay_topic, own_topic = common.topic(streams.topic_of(PAYMENTS)), common.topic(Topic.DEDUP_RECORDS)
    assert all(o >= 0 for o in committed_offsets(common, pay_group, pay_topic).values())
    assert all(o < 0 for o in committed_offsets(common, pay_group, own_topic).values())
    assert all(o < 0 for o in committed_offsets(common, own_group, pay_topic).values())
    assert len(read_committed(common, pay_topic)) == len(orders) and len(read_committed(common, own_topic)) == len(orders)

    # usersum and picky both read the default stream: each acks an edge of its own, so a tree
    # ends once both have processed its record (docs/decisions/0028). When they acked one edge,
    # XOR cancelled it and no tree completed: this call ran into the tree timeout.
    assert {(r.stream, r.job) for r in readers.read_readers(common)} == {("", usersum.JOB), ("", PICKY_JOB), (PAYMENTS, PAY_JOB)}
    waited = list(usersum.records(30, users=5, id_prefix="w", seed=3))
    # One attempt, inside the 30 s tree timeout: a retry after "outcome unknown" would have the
    # gate drop the copies and end their trees there, and hide a tree that never completes.
    with IngestClient(address, policy=RetryPolicy(max_attempts=1, call_timeout_s=25)) as client:
        client.ingest(usersum.ingest_records(waited), wait="processed")
    pipeline.orders += waited


def _letters(common: CommonSettings) -> list[Letter]:
    with DeadLetters(common.kafka_bootstrap, common.topic_prefix, [Topic.COMPUTE_DLQ]) as reader:
        return reader.list(LetterFilter())


def _drained(pipeline: Pipeline, want: dict[str, dict], picky: dict[str, dict]) -> None:
    def exact() -> bool:
        try:
            return pipeline.table(usersum.JOB) == want and pipeline.table(PICKY_JOB) == picky
        except grpc.RpcError:
            return False

    common = pipeline.common
    eventually(exact, 180, "usersum's table to equal the corrected input, picky's the good records", interval_s=2)
    eventually(lambda: not undrained(common, usersum.JOB) and not undrained(common, PICKY_JOB), 180, "the pipeline to drain",
               interval_s=2)
    assert pipeline.table(usersum.JOB) == want and pipeline.table(PICKY_JOB) == picky


def _fixes(path: Path, fixes: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps({"record_id": rid, "payload": payload}) + "\n" for rid, payload in fixes.items()))
    return path


def test_refused_records_are_redriven_to_their_job_alone_exactly_once(pipeline: Pipeline, tmp_path: Path) -> None:
    common = pipeline.common
    bad = [KeyedRecord(f"bad:{i}", f"u{i % 3}", 100 + i) for i in range(12)]
    with IngestClient(pipeline.supervisor.address("ingest")) as client:
        client.ingest([
            {"record_id": r.record_id, "key": r.user, "payload": {"user": r.user, "amount": "ten"}} for r in bad
        ])
    before_picky = picky_answer(pipeline.orders)
    ids = sorted(r.record_id for r in bad)

    def refused() -> dict[str, list[str]]:
        letters = _letters(common)
        return {job: sorted(l.record_id or "" for l in letters if l.job == job and l.record_id in ids) for job in (usersum.JOB, PICKY_JOB)}

    eventually(lambda: refused() == {usersum.JOB: ids, PICKY_JOB: ids}, 120, "both jobs to refuse the bad records", interval_s=1)

    # 1. Through the CLI: every usersum letter of these records, corrected, but three still wrong.
    still_wrong = {r.record_id for r in bad[:3]}
    fixes = {r.record_id: ({"user": r.user, "amount": "still ten"} if r.record_id in still_wrong else {"user": r.user, "amount": r.amount})
             for r in bad}
    command = [
        sys.executable, "-m", "onceflow_tools", "dlq", "redrive", "--job", usersum.JOB, "--fix", str(_fixes(tmp_path / "a.jsonl", fixes)),
        "--prefix", common.topic_prefix, "--bootstrap", common.kafka_bootstrap, "--yes",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"12 record(s) to {usersum.JOB}" in done.stdout, done.stdout
    fixed = [r for r in bad if r.record_id not in still_wrong]
    want = usersum.fold_answer(pipeline.orders + fixed)
    _drained(pipeline, want, before_picky)  # picky never saw them

    def again() -> list[tuple[str, int]]:
        letters = [l for l in _letters(common) if l.job == usersum.JOB and l.record_id in still_wrong]
        return sorted((l.record_id or "", l.original.redrive_count) for l in letters)  # type: ignore[union-attr]

    eventually(lambda: again() == sorted([(rid, 0) for rid in still_wrong] + [(rid, 1) for rid in still_wrong]), 60,
               "the three still wrong to come back as letters re-driven once", interval_s=1)

    # 2. The same letters once more: the ledger (dlq.redriven) leaves them; and written anyway
    # (the ledger bypassed), the gate drops every copy.
    letters = [l for l in _letters(common) if l.job == usersum.JOB and l.record_id in fixes]
    first = [l for l in letters if l.original.redrive_count == 0]  # type: ignore[union-attr]
    as_bytes = {rid: json.dumps(p).encode() for rid, p in fixes.items()}
    again_plan = redrive.plan(first, as_bytes, redrive.redriven(common))
    assert not again_plan.records and all("re-driven already" in why for _l, why in again_plan.refused), again_plan.refusals()
    assert redrive.redrive(common, redrive.plan(first, as_bytes)) == 12  # judged with the next step's: a copy counted shows there

    # 3. The letters of the three, with a right payload now: each counts once, whatever its count.
    right = {r.record_id: json.dumps({"user": r.user, "amount": r.amount}).encode() for r in bad[:3]}
    letters = [l for l in _letters(common) if l.job == usersum.JOB and l.record_id in right]
    assert sorted({l.original.redrive_count for l in letters}) == [0, 1], "step 2 re-drove a copy"  # type: ignore[union-attr]
    plan = redrive.plan(letters, right, redrive.redriven(common))
    assert len(plan.records) == 3 and {r.redrive_count for r in plan.records} == {2}  # the count-1 letters; the rest went
    assert redrive.redrive(common, plan) == 3
    pipeline.orders += bad
    _drained(pipeline, usersum.fold_answer(pipeline.orders), before_picky)
    refused_again = [l for l in _letters(common) if l.job == usersum.JOB and l.record_id in right and l.original.redrive_count > 1]  # type: ignore[union-attr]
    assert not refused_again


def test_job_check_is_a_dry_run_naming_the_stream_the_state_the_rows_and_the_letters(pipeline: Pipeline, tmp_path: Path) -> None:
    """`onceflow job check` (issue 45 item 4): nothing is deployed, nothing is written."""
    sample = tmp_path / "payments.jsonl"
    sample.write_text('{"payer": "pa", "cents": 5}\n{"payer": "pa", "cents": 7}\n{"payer": "pb", "cents": "lots"}\n')
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "ONCEFLOW_TOPIC_PREFIX": pipeline.common.topic_prefix,
           "ONCEFLOW_KAFKA_BOOTSTRAP": pipeline.common.kafka_bootstrap}
    done = subprocess.run([sys.executable, "-m", "onceflow_tools", "job", "check", PAY_MODULE, "--sample", str(sample)],
                          capture_output=True, text=True, timeout=180, env=env)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert f"job {PAY_JOB} (aggregation), reads stream {PAYMENTS}" in out, out
    assert f"a deploy as {PAY_JOB}@1 would read stream {PAYMENTS}" in out, out
    # After the two-jobs test paycount has state, which fits; run alone, it has none yet.
    assert f"the live {PAY_JOB}'s state fits this code" in out or f"no live state of {PAY_JOB}" in out, out
    assert "pa" in out and "12" in out  # the row: two payments, 12 cents
    assert 'field `cents`: expected int64, got a string "lots"' in out, out
    # A job naming a missing stream: what job check says of it before its batch run (the same
    # notes, here without a second Spark start).
    lost = lifecycle.check_notes(pipeline.common, lifecycle.load_module("tests.harness.jobs.lost_stream"))
    assert lost == ["a deploy would be refused: no stream 'nosuch' (no topic dedup.records.nosuch): an operator creates it "
                    "with `onceflow stream create nosuch`"], lost
    assert PAY_JOB not in {name for name in read_registry(pipeline.common)}  # nothing was deployed


def test_a_squatting_producer_cannot_drop_another_producers_records(pipeline: Pipeline, tmp_path: Path) -> None:
    """Issue 39 item 4 (docs/decisions/0027): on an ingest that takes known producers only, one
    producer sends another's record_ids first; the other's records still count, each once."""
    tokens = {"shop": "shop-token", "squatter": "squatter-token"}
    producers = tmp_path / "producers.toml"
    producers.write_text("".join(
        f'[[producer]]\nname = "{name}"\ntoken_sha256 = "{token_sha256(token)}"\n' for name, token in tokens.items()
    ) + f'[[producer]]\nname = "payer"\ntoken_sha256 = "{token_sha256("payer-token")}"\nstreams = ["{PAYMENTS}"]\n')
    address = f"127.0.0.1:{free_port()}"
    ingest = pipeline_service("ingest", address, pipeline.common.topic_prefix, "producers", pipeline.log_dir,
                              PRODUCERS_FILE=str(producers), REQUIRE_PRODUCER="true")
    ingest.env.update(pipeline.env)
    ingest.start()
    try:
        ingest.wait_healthy(address, 60)
        genuine = list(usersum.records(60, users=5, id_prefix="sq"))
        squatted = [KeyedRecord(r.record_id, "squat", 1) for r in genuine]
        for token, code in (("", grpc.StatusCode.UNAUTHENTICATED), ("guess", grpc.StatusCode.UNAUTHENTICATED)):
            with IngestClient(address, token=token) as anonymous, pytest.raises(grpc.RpcError) as refused:
                anonymous.ingest(usersum.ingest_records(genuine[:1]))
            assert refused.value.code() == code, refused.value
        with IngestClient(address, token=tokens["squatter"]) as squatter:
            squatter.ingest(usersum.ingest_records(squatted))  # the genuine ids, first
        with IngestClient(address, token=tokens["shop"]) as shop:
            shop.ingest(usersum.ingest_records(genuine))
            shop.ingest(usersum.ingest_records(genuine[:20]))  # its own copies: dropped, as ever
            with pytest.raises(RecordsRejected) as smuggled:
                shop.ingest([IngestRecord(record_id=b"x", payload=b"{}", producer="squatter")])
            assert smuggled.value.rejections[0].field == "producer"
        # A producer bound to a stream (its entry's streams) writes that one only.
        with IngestClient(address, token="payer-token") as payer, pytest.raises(grpc.RpcError) as elsewhere:
            payer.ingest(usersum.ingest_records(genuine[:1]))
        assert elsewhere.value.code() == grpc.StatusCode.PERMISSION_DENIED, elsewhere.value
        assert f"producer payer may write stream(s) {PAYMENTS}, not 'default'" in (elsewhere.value.details() or "")
        ingest.terminate()  # gracefully: it leaves the replayer's group at once, so the drain need not wait out its session
    finally:
        ingest.ensure_dead()
    pipeline.orders += genuine + squatted
    common = pipeline.common

    def exact() -> bool:
        try:
            return pipeline.table(usersum.JOB) == usersum.fold_answer(pipeline.orders)
        except grpc.RpcError:
            return False

    eventually(exact, 120, "every producer's records counted once, the squatter's and the shop's", interval_s=1)
    eventually(lambda: not undrained(common, usersum.JOB), 120, "the pipeline to drain", interval_s=2)
    assert pipeline.table(usersum.JOB) == usersum.fold_answer(pipeline.orders)


def test_stream_readers_lists_each_worker_and_forgets_a_job_gone_for_good(pipeline: Pipeline) -> None:
    """`onceflow stream readers` (docs/decisions/0028): what the gate gives an ack edge to."""
    common = pipeline.common
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "ONCEFLOW_TOPIC_PREFIX": common.topic_prefix,
           "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "onceflow_tools", "stream", "readers", *args],
                              capture_output=True, text=True, timeout=60, env=env)

    readers.register(common, PAYMENTS, "gone", "0")  # a worker killed, never to come back
    listed = json.loads(cli("--json").stdout)
    assert {(r["stream"], r["job"]) for r in listed} >= {("default", usersum.JOB), ("default", PICKY_JOB), (PAYMENTS, PAY_JOB), (PAYMENTS, "gone")}
    forgot = cli("--forget", "gone", "--stream", PAYMENTS)
    assert forgot.returncode == 0 and "1 worker(s) of gone forgotten" in forgot.stdout, forgot.stdout + forgot.stderr
    assert (PAYMENTS, "gone") not in {(streams.display(r.stream), r.job) for r in readers.read_readers(common)}
    assert cli("--forget", "gone", "--stream", PAYMENTS).returncode == 1  # nothing left to forget
