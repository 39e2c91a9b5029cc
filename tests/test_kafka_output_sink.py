"""The Kafka output topic (`pytest -m sinks`; docs/services/sink.md, "A Kafka output topic") on
the real broker, without the rest of the pipeline: result changes of several jobs (upserts and
retractions, the same keys many times, one aborted transaction, one row that is not a JSON
object) are written to a private compute.results in transactions, as compute writes them, and
`python -m onceflow_sink.kafka_output` writes one job's of them to an output topic while it is
killed with kill -9 inside its transactions and from outside, and once left as a zombie
(SIGSTOPped inside a transaction, its replacement takes over, SIGCONT: it exits fenced).

Judged with the verifier's own reader (`onceflow_tools.verify.kafka_output`): the output topic,
read read_committed and folded by key, equals the fold of the job's changes; the
`onceflow-results` headers are exactly the job's changes' places, each once (so no other job's
row, and no change twice); the bad row is one dead letter. Read read_uncommitted, the same topic
does hold changes twice (the killed transactions' writes): the check can fail. The same through
a second Kafka cluster, positions kept there (`sink.kafka.offsets`) in the outputs' transaction."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from onceflow.config import CommonSettings, repo_root, runtime_dir
from onceflow.faults import ALLOW_ENV, ENV as FAULT_ENV
from onceflow.kafka import clients
from onceflow.kafka.inspect import TopicRecord, consumed_everything, hanging_transactions, read_committed
from onceflow.kafka.topics import ensure_topics, shared_specs
from onceflow.topology import Topic
from onceflow.txn.errors import EXIT_FENCED, EXIT_OK, EXIT_RESTART
from onceflow.txn.external import read_positions
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow.v1.results_pb2 import ResultChange
from onceflow_sink.kafka_output import HEADER, ResultsPositions, group_id
from onceflow_sink.kafka_output_config import KafkaOutputSettings
from onceflow_sink.kafka_output_topics import POSITIONS_TOPIC, prepare, resolve
from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.infra.topics import delete_topics
from onceflow_tools.process import ServiceProcess, free_port
from onceflow_tools.verify.kafka_output import duplicate_changes, fold, output_table, repeated
from tests.conftest import eventually
from tests.harness.process import RestartOnRequest

pytestmark = [pytest.mark.sinks, pytest.mark.integration, pytest.mark.fault, pytest.mark.xdist_group("sinks")]
# Short, so that a killed member's partitions move on quickly (the broker allows 1 s sessions);
# the transaction timeout stays below it by a heartbeat interval (docs/decisions/0021).
SESSION_MS, TRANSACTION_MS = 3000, 2000
BAD_ROW = b"[1, 2]"  # a change of the job whose row is not a JSON object: a dead letter


@dataclass
class Changes:
    """What was written to compute.results, committed: the job's changes in order, and where."""

    job: str
    rows: list[tuple[str, bytes | None]] = field(default_factory=list)  # (key, row or None: retracted)
    places: set[str] = field(default_factory=set)  # "<partition>/<offset>" of each of the job's changes
    bad: str = ""  # the place of the one bad row
    ends: dict[int, int] = field(default_factory=dict)  # partition -> offset after its last committed record

    def table(self) -> dict[str, bytes]:
        table: dict[str, bytes] = {}
        for key, row in self.rows:
            if row is None:
                table.pop(key, None)
            else:
                table[key] = row
        return table


def write_changes(common: CommonSettings, job: str, others: list[str], count: int, seed: int) -> Changes:
    """``count`` changes over ``job`` and ``others`` sharing keys, 40 per transaction, one of the
    transactions aborted, as compute writes them (key `job\\0key`)."""
    rng = random.Random(seed)
    producer = Producer(clients.plain_config(common.kafka_bootstrap, **{
        "transactional.id": f"{common.topic_prefix}test-compute-{uuid.uuid4().hex[:6]}", "linger.ms": 5}))
    producer.init_transactions(30)
    results = common.topic(Topic.COMPUTE_RESULTS)
    out = Changes(job)
    live: dict[tuple[str, str], bool] = {}
    for txn in range(count // 40):
        aborted = txn == 3
        placed: list[tuple[str, str, bytes | None, list[str]]] = []
        producer.begin_transaction()
        for index in range(40):
            bad = (txn, index) == (5, 7)
            name = job if bad else rng.choice([job, job, *others])
            key = f"k{rng.randrange(25)}"
            retract = not bad and live.get((name, key), False) and rng.random() < 0.3
            row = None if retract else json.dumps({"job": name, "key": key, "n": txn * 100 + index}).encode()
            if bad:
                row = BAD_ROW
            change = ResultChange(job=name, key=key, op=ResultChange.RETRACT if retract else ResultChange.UPSERT,
                                  value=row or b"")
            where: list[str] = []
            producer.produce(results, change.SerializeToString(), key=f"{name}\x00{key}".encode(),
                             on_delivery=lambda err, msg, w=where: w.append(f"{msg.partition()}/{msg.offset()}"))  # type: ignore[misc]
            placed.append((name, key, row, where))
            if not aborted and row != BAD_ROW:
                live[(name, key)] = not retract
        producer.flush(30)
        if aborted:
            producer.abort_transaction(30)
            continue
        producer.commit_transaction(30)
        for name, key, row, (where,) in placed:
            partition, offset = map(int, where.split("/"))
            out.ends[partition] = max(out.ends.get(partition, 0), offset + 1)
            if name != job:
                continue
            if row == BAD_ROW:
                out.bad = where
                continue
            out.rows.append((key, row))
            out.places.add(where)
    return out


@dataclass
class Run:
    common: CommonSettings
    log_dir: Path

    def sink(self, name: str, job: str, topic: str, **env: str) -> ServiceProcess:
        settings = {"JOB": job, "TOPIC": topic, "INSTANCE": name, "PORT": "0", "METRICS_PORT": "0"}
        return ServiceProcess(name, "onceflow_sink.kafka_output", {
            "ONCEFLOW_TOPIC_PREFIX": self.common.topic_prefix, "ONCEFLOW_KAFKA_BOOTSTRAP": self.common.kafka_bootstrap,
            **{f"ONCEFLOW_SINK_KAFKA_{k}": v for k, v in settings.items()},
            "ONCEFLOW_LOOP_MAX_BATCH_RECORDS": "20", "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(SESSION_MS),
            "ONCEFLOW_TRANSACTION_TIMEOUT_MS": str(TRANSACTION_MS), ALLOW_ENV: "1", **env,
        }, self.log_dir, cwd=repo_root())


@pytest.fixture
def run(infra: None, tmp_path: Path) -> Iterator[Run]:
    common = CommonSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.")
    wanted = {Topic.COMPUTE_RESULTS, Topic.SINK_DLQ, Topic.ACKER_ACKS}  # the loop waits for acker.acks
    ensure_topics(common.kafka_bootstrap, common.topic_prefix, [s for s in shared_specs() if s.name in wanted])
    yield Run(common, tmp_path)
    delete_topics(common.kafka_bootstrap, prefix=common.topic_prefix)  # the output topics share the prefix


@pytest.fixture(scope="module")
def remote_cluster(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A second single-node Kafka, as conftest's ``other_cluster``, but killed at the end: a
    throwaway cluster needs no controlled shutdown (5 s of this module's time)."""
    broker = KafkaBroker(port=free_port(), controller_port=free_port(), home=tmp_path_factory.mktemp("output-kafka"),
                         libs_home=runtime_dir() / "kafka")
    try:
        broker.start()
        yield broker
    finally:
        broker.kill()


def assigned(process: ServiceProcess) -> int:
    """How many starts got their partitions (after fencing any other owner)."""
    return process.log_path.read_text(errors="replace").count("sink-kafka: assigned [") if process.log_path.exists() else 0


def zombie_and_kills(run: Run, job: str, topic: str, done: Callable[[], bool], outside: int, seed: int, **env: str) -> int:
    """The faults both tests run; returns how many kills landed before everything was written.

    A zombie stops itself inside its second transaction (outputs produced and flushed, not
    committed). Its replacement, another instance name with the same transactional.id, fences
    it at start; on its first start it kills itself inside its third transaction (its flushed
    outputs stay in the log, aborted), and a supervisor starts it again after every kill -9.
    Once it has taken over again, the zombie is woken: it must exit fenced. Then ``outside``
    kill -9s at random moments."""
    rng = random.Random(seed)
    zombie = run.sink(f"{topic}-zombie", job, topic, **env, **{FAULT_ENV: "after_produce@2:stop"})
    current = run.sink(f"{topic}-owner", job, topic, **env)
    supervisor = RestartOnRequest(lambda: [current], codes=(-9, EXIT_RESTART)).start()
    try:
        zombie.start()
        eventually(zombie.stopped, 60, "the zombie to stop inside a transaction", interval_s=0.1)
        current.start({FAULT_ENV: "after_produce@3"})
        eventually(lambda: current.starts > 1 and assigned(current) >= 2, 60, "the restart after the fault", interval_s=0.2)
        zombie.sigcont()
        assert zombie.wait_exit(60) == EXIT_FENCED, zombie.log_tail()
        kills = 1
        for _ in range(outside):
            time.sleep(rng.uniform(0.1, 0.5))
            if done():
                break
            before = assigned(current)
            current.kill9()
            kills += 1
            eventually(lambda: assigned(current) > before, 60, "the restart to take the partitions")  # noqa: B023
        eventually(done, 60, "the whole of compute.results to be written", interval_s=0.5)
    finally:
        supervisor.stop()
        assert current.terminate() == EXIT_OK, current.log_tail()
        zombie.ensure_dead()
    return kills


def judge(where: str | CommonSettings, topic: str, changes: Changes) -> None:
    committed = read_committed(where if isinstance(where, CommonSettings) else CommonSettings(kafka_bootstrap=where), topic)
    table = fold(committed)
    assert table == changes.table(), f"{len(table)} rows, want {len(changes.table())}"
    assert repeated(committed) == []
    written = Counter(r.header(HEADER).decode() for r in committed if r.header(HEADER) is not None)  # type: ignore[union-attr]
    assert set(written) == changes.places, (sorted(set(written) - changes.places)[:5], sorted(changes.places - set(written))[:5])
    assert all(len(r.headers) == 1 for r in committed)
    assert output_table(where, topic) == table and duplicate_changes(where, topic) == []


def dead_letters(common: CommonSettings, job: str) -> list[DeadLetter]:
    letters = [DeadLetter.FromString(r.value or b"") for r in read_committed(common, common.topic(Topic.SINK_DLQ))]
    return [d for d in letters if d.stage == "sink-kafka" and d.job == job]


def test_one_jobs_table_is_written_once_through_kill9s_and_a_zombie(run: Run) -> None:
    common, job = run.common, "orders@2"
    changes = write_changes(common, job, ["orders", "clicks"], 3000, seed=5)
    topic = common.topic("user.orders-table")
    results = common.topic(Topic.COMPUTE_RESULTS)

    def done() -> bool:
        try:
            return consumed_everything(common, group_id(KafkaOutputSettings(job=job, topic=topic, common=common)), results)
        except KafkaException:  # a killed instance's open transaction holds the group's offsets
            return False

    # Killed at a random transaction point, then the zombie and the kill inside a transaction.
    armed = run.sink("random", job, topic, **{FAULT_ENV: "random@0.04@4417"}).start()
    eventually(lambda: not armed.alive() or done(), 60, "a kill or the end")
    kills = int(armed.returncode == -9)
    armed.ensure_dead()
    kills += zombie_and_kills(run, job, topic, done, outside=0, seed=44)
    assert kills >= 2, f"only {kills} kills landed mid-stream"
    assert hanging_transactions(common, [topic], wait_s=10) == {}
    judge(common, topic, changes)
    letters = dead_letters(common, job)
    assert [(d.source_partition, d.source_offset) for d in letters] == [tuple(map(int, changes.bad.split("/")))]
    assert "not a JSON object" in letters[0].message
    # The negative control: the killed transactions' writes are in the log; a reader that sees
    # them (read_uncommitted) gets changes twice, and the check says so.
    assert duplicate_changes(common, topic, committed=False), "no aborted write to see: the check cannot fail here"
    admin = clients.admin(common)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    assert admin.describe_configs([resource])[resource].result()["cleanup.policy"].value == "compact"
    partitions = {name: len(t.partitions) for name, t in admin.list_topics(timeout=10).topics.items()}
    assert partitions[topic] == partitions[results]


def test_the_checker_sees_a_change_written_twice_and_a_wrong_row() -> None:
    def record(offset: int, key: str, value: bytes | None, where: str) -> TopicRecord:
        return TopicRecord(0, offset, key.encode(), value, ((HEADER, where.encode()),))

    good = [record(0, "a", b'{"n": 1}', "0/10"), record(1, "b", b'{"n": 2}', "1/4"), record(2, "a", None, "0/12")]
    assert fold(good) == {"b": b'{"n": 2}'} and repeated(good) == []
    doubled = [*good, record(3, "b", b'{"n": 2}', "1/4")]
    assert repeated(doubled) == ["1/4"]  # the same change written twice: the fold alone cannot see it
    assert fold(doubled) == fold(good)
    assert fold([*good, record(3, "a", b'{"n": 9}', "2/1")]) != fold(good)


def test_an_existing_topic_that_is_not_compacted_is_written_with_a_warning(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    common = run.common
    topic = common.topic("user.plain")
    admin = AdminClient(clients.plain_config(common.kafka_bootstrap))
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    with caplog.at_level(logging.WARNING):
        prepare(resolve(common, ""), topic)
    assert "has cleanup.policy=delete, not compact" in caplog.text


def test_the_cli_refuses_a_job_name_that_cannot_be_one(run: Run) -> None:
    env = {**os.environ, "ONCEFLOW_TOPIC_PREFIX": run.common.topic_prefix}
    cli = [sys.executable, "-m", "onceflow_tools", "sink", "kafka", "--job", "no such job", "--topic", "out"]
    refused = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "refused" in refused.stdout and "job name" in refused.stdout, refused.stdout + refused.stderr


def test_to_another_cluster_positions_live_there_through_kill9s_and_a_zombie(run: Run, remote_cluster: KafkaBroker) -> None:
    common, job = run.common, "remote"
    remote = CommonSettings(kafka_bootstrap=remote_cluster.bootstrap, topic_prefix=common.topic_prefix)
    # Long enough for two kills to land mid-stream on a fast run too (2,000 changes once left room
    # for only one: a fresh-clone run, 2026-11-28).
    changes = write_changes(common, job, ["orders"], 6000, seed=9)
    topic = "user.remote-table"
    clusters = resolve(common, remote.kafka_bootstrap)
    assert clusters.external and clusters.target_id != clusters.pipeline_id
    where = ResultsPositions(common.kafka_bootstrap, common.topic(Topic.COMPUTE_RESULTS), clusters.pipeline_id, job, topic)

    def done() -> bool:
        return read_positions(remote, remote.topic(POSITIONS_TOPIC), where) == changes.ends

    kills = zombie_and_kills(run, job, topic, done, outside=1, seed=45, ONCEFLOW_SINK_KAFKA_BOOTSTRAP=remote.kafka_bootstrap)
    assert kills >= 2, f"only {kills} kills landed mid-stream"
    assert hanging_transactions(remote, [topic, remote.topic(POSITIONS_TOPIC)], wait_s=10) == {}
    judge(remote.kafka_bootstrap, topic, changes)
    assert len(dead_letters(remote, job)) == 1 and not dead_letters(common, job)
    assert duplicate_changes(remote.kafka_bootstrap, topic, committed=False)
    # Nothing on the pipeline's cluster: no group offsets, no output there.
    assert topic not in clients.admin(common).list_topics(timeout=10).topics
