"""Compute workers on the real broker with real Spark: two workers per job, kill -9s at random
points (one between the Spark job and the commit), a zombie, a rebalance and 1% malformed input.

The checker folds compute.results (read_committed) in order: every retraction must withdraw the
row in place and no row may be upserted twice, so a replayed or lost partial shows up even
before the final table is compared with batch mode (one Spark batch job) and with pandas over
the same input."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pandas as pd
import pytest
from confluent_kafka import Producer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.kafka import clients
from onceflow.topology import Topic, job_topic
from onceflow.txn.errors import EXIT_FENCED
from onceflow.v1 import compute_pb2, compute_pb2_grpc
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from tests.conftest import SHORT_LIVED_COMPUTE, Pipeline, eventually, free_port
from tests.harness import checker
from tests.harness.process import ServiceProcess

from onceflow_compute.batch import run_batch, spark_engine
from onceflow_compute.engine.spark import SparkEngine
from onceflow_compute.lifecycle import fingerprint_key

pytestmark = [pytest.mark.compute, pytest.mark.integration]

WORDS = [f"w{i}" for i in range(300)] + ["the", "a", "stream", "once"]


@dataclass(frozen=True)
class Input:
    record_id: str
    key: bytes
    payload: bytes
    valid: bool


def usersum_inputs(count: int, seed: int) -> list[Input]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        user = f"u{rng.randrange(200)}"
        if rng.random() < 0.01:
            payload, valid = rng.choice([{"user": user, "amount": "ten"}, {"amount": 5}, [user]]), False
        else:
            payload, valid = {"user": user, "amount": rng.randrange(1, 1000)}, True
        out.append(Input(f"us-{seed}-{i}", user.encode(), json.dumps(payload).encode(), valid))
    return out


def wordcount_inputs(count: int, seed: int) -> list[Input]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        record_id = f"wc-{seed}-{i}"
        if rng.random() < 0.01:
            payload, valid = rng.choice([{"text": 42}, {"body": "no text"}, "just a string"]), False
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 12)))
            payload, valid = {"text": text.title() if rng.random() < 0.3 else text}, True
        out.append(Input(record_id, record_id.encode(), json.dumps(payload).encode(), valid))
    return out


def pandas_table(job: str, inputs: list[Input]) -> dict[str, dict]:
    """The expected table, computed independently of the job API."""
    rows = [json.loads(i.payload) for i in inputs if i.valid]
    if job == "usersum":
        frame = pd.DataFrame(rows)
        grouped = frame.groupby("user")["amount"].agg(["sum", "count", "min", "max"])
        return {
            user: {"user": user, "total": int(r["sum"]), "count": int(r["count"]), "smallest": int(r["min"]),
                   "largest": int(r["max"])}
            for user, r in grouped.iterrows()
        }
    words = pd.Series([w for r in rows for w in re.split(r"[^a-z0-9']+", r["text"].lower()) if w])
    return {word: {"word": word, "count": int(n)} for word, n in words.value_counts().items()}


def produce(pipe: Pipeline, inputs: list[Input], chunks: int = 1, pause_s: float = 0.0) -> None:
    """Envelopes into dedup.records, as the gate writes them (keyed by the grouping key)."""
    producer = Producer({"bootstrap.servers": pipe.common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 10})
    size = max(1, len(inputs) // chunks)
    for start in range(0, len(inputs), size):
        for item in inputs[start : start + size]:
            envelope = Envelope(
                record_id=item.record_id, root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=now_ms(),
                ingest_time_ms=now_ms(), key=item.key, payload=item.payload,
            )
            producer.produce(pipe.topic(Topic.DEDUP_RECORDS), encode_envelope(envelope), key=item.key)
        assert producer.flush(30) == 0
        time.sleep(pause_s)


def worker(pipe: Pipeline, job: str, instance: str, **env: str) -> ServiceProcess:
    settings = {
        "ONCEFLOW_COMPUTE_JOB": job, "ONCEFLOW_COMPUTE_INSTANCE": instance, "ONCEFLOW_COMPUTE_PORT": str(free_port()),
        "ONCEFLOW_COMPUTE_METRICS_PORT": "0", "ONCEFLOW_COMPUTE_SPARK_MASTER": "local[1]",
        "ONCEFLOW_COMPUTE_MIN_BATCH_RECORDS": "200", "ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS": "4000",
        **SHORT_LIVED_COMPUTE,
    }
    return pipe.process(f"compute-{job.rsplit('.', 1)[-1]}-{instance}-{len(pipe.processes)}", "onceflow_compute", **(settings | env))



def wait_consumed(pipe: Pipeline, job: str, timeout_s: float = 240, merge: bool = True) -> None:
    """Until both hops' groups (a transform: its map hop's) committed past every record of their input."""
    groups = [(f"{pipe.common.topic_prefix}onceflow-compute-{job}-map", pipe.topic(Topic.DEDUP_RECORDS))]
    if merge:
        groups.append((f"{pipe.common.topic_prefix}onceflow-compute-{job}-merge", pipe.topic(job_topic(Topic.COMPUTE_PARTIALS, job))))

    def done() -> bool:
        # The merge hop's input only stops growing once the map hop is done: check in order.
        return all(checker.consumed_everything(pipe.common, group, topic) for group, topic in groups)

    eventually(done, timeout_s, f"the {job} workers to consume everything", interval_s=2.0)


def check_exact(pipe: Pipeline, job: str, inputs: list[Input], expected: dict[str, dict]) -> None:
    fold = checker.fold_results(checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_RESULTS)), job)
    assert not fold.problems, fold.problems[:10]
    table = {key: json.loads(row) for key, row in fold.table.items()}
    assert table == expected
    assert len(table) > 50 and fold.changes > len(table)  # a real table, built over many batches
    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_DLQ))]
    dead = sorted(checker.record_id_of_bytes(letter.original) for letter in letters)
    assert dead == sorted(i.record_id for i in inputs if not i.valid)
    assert all(letter.message for letter in letters)
    hanging = checker.hanging_transactions(
        pipe.common, [pipe.topic(job_topic(t, job)) for t in (Topic.COMPUTE_PARTIALS, Topic.COMPUTE_RESULTS, Topic.COMPUTE_CHANGELOG)], wait_s=30
    )
    assert not hanging, hanging


INPUTS = {"usersum": lambda: usersum_inputs(16_000, seed=1), "wordcount": lambda: wordcount_inputs(6_000, seed=2)}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkEngine]:
    engine = spark_engine(master="local[1]")
    yield engine
    engine.close()


def batch_table(engine: SparkEngine, job: str, inputs: list[Input], tmp_path: Path) -> dict[str, dict]:
    """Batch mode (one Spark batch job) over the same records, poison included."""
    path = tmp_path / f"{job}.jsonl"
    path.write_bytes(b"\n".join(i.payload for i in inputs) + b"\n")
    result = run_batch(job, path, engine)
    assert result.rows_in == len(inputs) and result.dropped == sum(not i.valid for i in inputs)
    return result.table


@pytest.mark.fault
# wordcount (a flatMap job: one record, many keys) in make test-extended, for the suite's time.
@pytest.mark.parametrize("job", ["usersum", pytest.param("wordcount", marks=pytest.mark.extended)])
def test_two_workers_stay_exact_through_kill9s_a_zombie_and_a_rebalance(
    pipeline: Pipeline, job: str, spark: SparkEngine, tmp_path: Path
) -> None:
    inputs = INPUTS[job]()
    expected = pandas_table(job, inputs)
    assert batch_table(spark, job, inputs, tmp_path) == expected
    part = len(inputs) // 20
    main, fault_chunk, zombie_tail, last = (
        inputs[: -3 * part], inputs[-3 * part : -2 * part], inputs[-2 * part : -part], inputs[-part:]
    )
    sender = threading.Thread(target=produce, args=(pipeline, main, 10, 1.5), daemon=True)
    sender.start()
    # Under test here: the two hops' transactions, takeovers and restores. usersum's workers run
    # the pandas engine, so eight restarts cost no JVM each: Spark under kill -9s and a rebalance
    # is test_dataflow's Nexmark campaign; wordcount (make test-extended) runs these on Spark.
    engine = {"ONCEFLOW_COMPUTE_ENGINE": "pandas"} if job == "usersum" else {}

    def start(name: str, **env: str) -> ServiceProcess:
        return worker(pipeline, job, name, **(engine | env)).start()

    workers = {"a": start("a")}
    workers["a"].wait_log("compute: assigned", 120)
    workers["b"] = start("b")  # joins: a hands over half its partitions
    rng = random.Random(7 if job == "usersum" else 8)
    # Five kill -9s: four at random moments (startup, restore, Spark job, commit, ...), one at
    # the gap between a finished Spark job and its commit.
    for round_ in range(5):
        name = rng.choice("ab")
        if round_ == 2:
            workers[name].kill9()
            workers[name] = start(name, ONCEFLOW_FAULT="after_job@1")
            workers[name].wait_log("compute: assigned", 120)
            produce(pipeline, fault_chunk)  # fresh input for every partition, whoever owns it now
            eventually(lambda w=workers[name]: not w.alive(), 120, "the worker to crash after a Spark job")
        else:
            time.sleep(rng.uniform(2.0, 7.0))
            workers[name].kill9()
        workers[name] = start(name)
    sender.join(120)
    # The zombie: a stops itself between a Spark job and its commit; a replacement with a's
    # transactional ids fences it; woken up, its commit must fail and it must exit 3.
    workers["a"].kill9()
    zombie = start("a", ONCEFLOW_FAULT="after_job@1:stop")
    zombie.wait_log("compute: assigned", 120)
    produce(pipeline, zombie_tail)
    eventually(zombie.stopped, 120, "the zombie to stop after a Spark job")
    workers["a"] = start("a")
    workers["a"].wait_log("compute-merge: assigned", 120)
    wait_consumed(pipeline, job)
    zombie.sigcont()
    assert zombie.wait_exit(60) == EXIT_FENCED, zombie.log_tail()
    # b leaves gracefully: a takes its partitions and restores their state from the changelog.
    assert workers["b"].terminate() == 0, workers["b"].log_tail()
    produce(pipeline, last)
    wait_consumed(pipeline, job)
    check_exact(pipeline, job, inputs, expected)
    assert workers["a"].terminate() == 0, workers["a"].log_tail()


def test_two_jobs_side_by_side_each_restore_only_their_own_state(pipeline: Pipeline) -> None:
    """Two aggregations over one dedup.records: each has its own partials and changelog topics,
    so a restarted merge hop restores its own keys only, and both tables stay exact."""
    inputs = usersum_inputs(4_000, seed=5)
    jobs = {"usersum": "usersum", "usercount": "tests.harness.jobs.usercount"}
    counts = {user: {"user": user, "payments": row["count"]} for user, row in pandas_table("usersum", inputs).items()}
    expected = {"usersum": pandas_table("usersum", inputs), "usercount": counts}
    pandas = {"ONCEFLOW_COMPUTE_ENGINE": "pandas"}  # the topics are under test, not Spark
    workers = {job: worker(pipeline, module, "a", **pandas).start() for job, module in jobs.items()}
    produce(pipeline, inputs[:3_000], chunks=3)
    for job in jobs:
        wait_consumed(pipeline, job)
    # kill -9 usercount's worker: its successor restores the merge state from the changelog.
    workers["usercount"].kill9()
    port = free_port()
    workers["usercount"] = worker(pipeline, jobs["usercount"], "a", ONCEFLOW_COMPUTE_PORT=str(port), **pandas).start()
    changelog = pipeline.topic(job_topic(Topic.COMPUTE_CHANGELOG, "usercount"))
    workers["usercount"].wait_log(f"changelog records of {changelog} partitions", 120)
    for job in jobs:  # each changelog holds its own job's keys only
        keys = {r.key for r in checker.read_committed(pipeline.common, pipeline.topic(job_topic(Topic.COMPUTE_CHANGELOG, job)))}
        # Its keys and its state fingerprint (docs/decisions/0023), nothing of another job's.
        own = {key for key in keys if key.startswith(f"{job}\x00".encode())}
        assert own and keys - own == {fingerprint_key(job)}, (job, sorted(keys - own)[:3])
    # The restored store: exactly usercount's keys, one per user so far, none of usersum's.
    seen = {json.loads(i.payload)["user"] for i in inputs[:3_000] if i.valid}
    admin = compute_admin(f"127.0.0.1:{port}")
    keys_in_state = lambda: admin.Stats(compute_pb2.ComputeStatsRequest(), timeout=10).keys_in_state  # noqa: E731
    eventually(lambda: keys_in_state() == len(seen), 60, "the restarted merge hop to hold every user's key")
    produce(pipeline, inputs[3_000:])
    for job in jobs:
        wait_consumed(pipeline, job)
        fold = checker.fold_results(checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_RESULTS)), job)
        assert not fold.problems, fold.problems[:10]
        assert {key: json.loads(row) for key, row in fold.table.items()} == expected[job]
    names = set(clients.admin(pipeline.common).list_topics(timeout=10).topics)
    assert not {pipeline.topic("compute.partials"), pipeline.topic("compute.changelog")} & names  # nothing shared
    assert pipeline.topic(job_topic(Topic.COMPUTE_PARTIALS, "usercount")) in names
    for proc in workers.values():
        assert proc.terminate() == 0, proc.log_tail()


def picky_inputs(count: int, unlucky: set[int], seed: int = 3) -> list[Input]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        user = f"u{rng.randrange(40)}"
        amount = 13 if i in unlucky else rng.choice([rng.randrange(1, 13), rng.randrange(14, 100)])
        out.append(Input(f"pk-{seed}-{i}", user.encode(), json.dumps({"user": user, "amount": amount}).encode(), i not in unlucky))
    return out


def compute_admin(address: str) -> compute_pb2_grpc.ComputeAdminStub:
    return compute_pb2_grpc.ComputeAdminStub(grpc.insecure_channel(address))


def wait_unhealthy(address: str, timeout_s: float, what: str) -> compute_pb2.ComputeStatsReply:
    """The worker's Stats once it reports itself unhealthy; its health check must say NOT_SERVING too."""
    admin = compute_admin(address)
    stats = eventually(
        lambda: (s := admin.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)) and not s.healthy and s,
        timeout_s, what,
    )
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.NOT_SERVING
    return stats


def test_records_a_job_raises_on_are_dead_lettered_alone_and_admin_reports_the_job(pipeline: Pipeline) -> None:
    unlucky = {137}
    inputs = picky_inputs(200, unlucky)
    port = free_port()
    # Small batches: each bisection step is a Spark job with a Python UDF (seconds on one core).
    proc = worker(
        pipeline, "tests.harness.jobs.picky", "a", ONCEFLOW_COMPUTE_PORT=str(port),
        ONCEFLOW_COMPUTE_MIN_BATCH_RECORDS="50", ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS="100",
        ONCEFLOW_COMPUTE_SPARK_SHUFFLE_PARTITIONS="1",
    ).start()
    address = f"127.0.0.1:{port}"
    proc.wait_healthy(address, timeout_s=120)
    produce(pipeline, inputs)
    wait_consumed(pipeline, "picky")
    fold = checker.fold_results(checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_RESULTS)), "picky")
    assert not fold.problems, fold.problems[:5]
    valid = [json.loads(i.payload) for i in inputs if i.valid]
    expected = {}
    for row in valid:
        current = expected.setdefault(row["user"], {"user": row["user"], "total": 0, "count": 0})
        current["total"] += row["amount"]
        current["count"] += 1
    assert {k: json.loads(v) for k, v in fold.table.items()} == expected
    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_DLQ))]
    assert sorted(checker.record_id_of_bytes(x.original) for x in letters) == sorted(f"pk-3-{i}" for i in unlucky)
    assert all("13 is an unlucky amount" in x.message for x in letters), letters[0].message

    admin = compute_admin(address)
    jobs = {j.name: j for j in admin.ListJobs(compute_pb2.ListJobsRequest(), timeout=10).jobs}
    assert jobs["picky"].running and jobs["picky"].key == "user" and "total=SumButNotThirteen(amount)" in jobs["picky"].aggregates
    assert {"usersum", "wordcount", "bigspend"} <= set(jobs) and not jobs["usersum"].running
    user = next(iter(expected))
    state = admin.GetState(compute_pb2.GetStateRequest(job="picky", key=user), timeout=10)
    assert state.found and state.owned and json.loads(state.row) == expected[user]
    assert json.loads(state.partials) == [expected[user]["total"], expected[user]["count"]]
    assert not admin.GetState(compute_pb2.GetStateRequest(job="picky", key="nobody"), timeout=10).found
    with pytest.raises(grpc.RpcError) as err:
        admin.GetState(compute_pb2.GetStateRequest(job="picky", key=""), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stats = admin.Stats(compute_pb2.ComputeStatsRequest(), timeout=10)
    assert stats.records_in == len(inputs) and stats.dead_letters == len(unlucky) and stats.healthy
    assert stats.engine == "spark" and stats.min_batch_size == 50 and stats.max_batch_size == 100
    assert 50 <= stats.batch_size <= 100 and stats.job_seconds_p99 >= stats.job_seconds_p50 > 0
    assert stats.keys_in_state == len(expected) and stats.results == fold.changes
    assert proc.terminate() == 0, proc.log_tail()


def test_a_job_failing_on_whole_batches_backs_off_unhealthy_and_commits_nothing(pipeline: Pipeline) -> None:
    inputs = picky_inputs(500, unlucky=set(range(500)))
    port = free_port()
    # The pandas engine runs the same combiner in-process: no JVM needed to see the backoff.
    proc = worker(
        pipeline, "tests.harness.jobs.picky", "a", ONCEFLOW_COMPUTE_PORT=str(port), ONCEFLOW_COMPUTE_ENGINE="pandas",
    ).start()
    address = f"127.0.0.1:{port}"
    proc.wait_healthy(address, timeout_s=60)
    produce(pipeline, inputs)
    stats = wait_unhealthy(address, 60, "the worker to report the job unhealthy")
    assert "13 is an unlucky amount" in stats.last_error
    assert "failed on all" in stats.last_error or "could not be isolated within 64 engine runs" in stats.last_error
    proc.wait_log("in a row); retrying from committed offsets in 2.0s", 60)  # the backoff doubles
    assert stats.records_in == 0
    assert not checker.read_committed(pipeline.common, pipeline.topic(Topic.COMPUTE_DLQ), timeout_s=5)
    assert not checker.read_committed(pipeline.common, pipeline.topic(job_topic(Topic.COMPUTE_PARTIALS, "picky")), timeout_s=5)
    assert proc.terminate() == 0, proc.log_tail()
