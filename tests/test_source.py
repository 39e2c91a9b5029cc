"""The Kafka source against the real pipeline (`pytest -m source`): a pre-filled topic of the
user's (a few thousand records, some repeating an earlier payload at another offset, some that
cannot be mapped) copied while the source is kill -9ed at random points, inside its
transactions and from outside, and restarted each time. Judged once the pipeline has drained:
every record of the topic is in `ingest.records` exactly once as a first attempt, the usersum
table equals the fold of every mappable record, and each unmappable one is in `source.dlq`
with its reason. The same check is shown to fail on a build that commits the offsets outside
the transaction (`ONCEFLOW_SABOTAGE=offsets_outside_txn`), killed between the two. With an id
field, copies of a record at other offsets count once (the gate drops them) and records without
a usable id are dead letters; `onceflow source kafka` copies with progress and refuses a
missing topic. A topic on a second Kafka cluster is copied the same way through kill -9s and a
zombie (SIGSTOPped inside its transaction, woken after its replacement took over): each record
once, and `source.offsets` at the topic's end."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.faults import ALLOW_ENV, ENV as FAULT_ENV, SABOTAGE_ENV
from onceflow.kafka import clients
from onceflow.kafka.inspect import consumed_everything, end_offsets, hanging_transactions, read_committed
from onceflow.kafka.topic_ids import read_topic_id
from onceflow.topology import SOURCE, Topic
from onceflow.txn.errors import EXIT_FENCED, EXIT_RESTART
from onceflow.txn.external import ExternalTopic, read_positions
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow_client import QueryClient
from onceflow_client.kafka_identity import KafkaOrigin, kafka_record_id
from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service
from onceflow_tools.verify.check import undrained
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum
from onceflow_tools.workloads.usersum import KeyedRecord
from tests.conftest import COMPUTE_NOT_UNDER_TEST, TEST_SESSION_TIMEOUT_MS, eventually
from tests.harness.process import RestartOnRequest

pytestmark = [pytest.mark.source, pytest.mark.integration, pytest.mark.fault, pytest.mark.xdist_group("source")]
JOB = usersum.JOB
MAX_PAYLOAD = 2048


@dataclass
class UserTopic:
    """A topic as a user would have it, and what the source must make of it."""

    name: str
    good: dict[str, KeyedRecord]  # record_id (kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>) -> record
    bad: dict[int, tuple[int, str]]  # offset key (partition * 10**9 + offset) -> (partition, reason class)


@dataclass
class Running:
    supervisor: Supervisor
    common: CommonSettings
    log_dir: Path
    address: str = ""  # the last source started

    def source(self, topic: str, instance: str, **env: str) -> ServiceProcess:
        self.address = f"127.0.0.1:{free_port()}"
        process = pipeline_service(
            "source", self.address, self.common.topic_prefix, instance, self.log_dir,
            log_name=f"source-{instance}", TOPIC=topic, MAX_PAYLOAD_BYTES=str(MAX_PAYLOAD),
        )
        process.env.update({
            "ONCEFLOW_LOOP_MAX_BATCH_RECORDS": "60", "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            ALLOW_ENV: "1", **env,
        })
        return process

    def copied(self, topic: str) -> bool:
        group = SOURCE.group_id(self.common.topic_prefix, job=topic)
        try:
            return consumed_everything(self.common, group, topic)
        except KafkaException:
            # A killed instance's open transaction holds offsets for the group: fetching them
            # (require_stable) waits until the next instance aborts it. Not copied yet, then.
            return False

    def table(self) -> dict[str, dict]:
        with QueryClient(self.supervisor.address("sink")) as query:
            return {key: json.loads(value) for key, value in query.scan(JOB, "")}

    def table_matches(self, users: str, answer: dict[str, dict]) -> bool:
        """Whether the table's rows of ``users`` (a key prefix) are ``answer``; False while the
        sink does not answer."""
        try:
            return {k: v for k, v in self.table().items() if k.startswith(users)} == answer
        except grpc.RpcError:
            return False


@pytest.fixture(scope="module")
def running(infra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    log_dir = tmp_path_factory.mktemp("source")
    supervisor = Supervisor(
        prefix, log_dir,
        env={
            "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap, "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
            **COMPUTE_NOT_UNDER_TEST,
        },
    )
    try:
        supervisor.start_all()
        yield Running(supervisor, common, log_dir)
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)  # the users' topics too: they share the prefix


def fill_topic(bootstrap: str, name: str, users: str, count: int, seed: int) -> UserTopic:
    """``count`` usersum records over 3 partitions, every 7th repeating the previous payload (so
    the same payload sits at two offsets: two records), plus unmappable ones: an oversize value
    and a header that is not UTF-8."""
    admin = AdminClient(clients.plain_config(bootstrap))
    admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)])[name].result(30)
    rng = random.Random(seed)
    producer = Producer(clients.plain_config(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    placed: list[tuple[str, KeyedRecord | None, str]] = []  # (partition/offset, record or None, reason)

    def delivered(record: KeyedRecord | None, reason: str):  # type: ignore[no-untyped-def]
        def callback(err, msg) -> None:  # type: ignore[no-untyped-def]
            assert err is None, err
            placed.append((f"{msg.partition()}/{msg.offset()}", record, reason))

        return callback

    previous = None
    for index in range(count):
        if index % 7 == 6 and previous is not None:
            record = KeyedRecord("", previous.user, previous.amount)  # the same payload again
        else:
            record = KeyedRecord("", f"{users}{rng.randrange(40)}", rng.randrange(1, 1000))
        previous = record
        producer.produce(name, record.payload, key=record.user.encode(), on_delivery=delivered(record, ""))
        if index % 150 == 75:
            big = json.dumps({"user": record.user, "amount": 1, "pad": "x" * MAX_PAYLOAD}).encode()
            producer.produce(name, big, key=record.user.encode(), on_delivery=delivered(None, "OverLimit"))
        if index % 400 == 200:
            producer.produce(name, record.payload, key=b"k", headers=[("trace", b"\xff\xfe")],
                             on_delivery=delivered(None, "OverLimit"))
        producer.poll(0)
    assert producer.flush(30) == 0
    admin = AdminClient(clients.plain_config(bootstrap))
    origin = KafkaOrigin(admin.list_topics(timeout=15).cluster_id or "", read_topic_id(admin, name))
    ids = {where: kafka_record_id(origin, name, *map(int, where.split("/"))) for where, _r, _ in placed}
    good = {ids[where]: KeyedRecord(ids[where], r.user, r.amount) for where, r, _ in placed if r is not None}
    bad = {}
    for where, record, reason in placed:
        if record is None:
            partition, offset = map(int, where.split("/"))
            bad[partition * 10**9 + offset] = (partition, reason)
    return UserTopic(name, good, bad)


def _assignments(process: ServiceProcess) -> int:
    return process.log_path.read_text().count("source: assigned [") if process.log_path.exists() else 0


def first_attempts(common: CommonSettings, topic: str) -> Counter[str]:
    """How many times each record_id of ``topic`` is in ingest.records as a first attempt
    (replays, attempt 2 on, are the acker's business and the gate drops them)."""
    counts: Counter[str] = Counter()
    for record in read_committed(common, common.topic(Topic.INGEST_RECORDS)):
        envelope = decode_envelope(record.value or b"")
        if envelope.record_id.startswith("kafka://") and envelope.record_id.split("/")[3] == topic and envelope.attempt == 1:
            counts[envelope.record_id] += 1
    return counts


def dead_letters(common: CommonSettings, topic: str) -> dict[int, DeadLetter]:
    letters = [DeadLetter.FromString(r.value or b"") for r in read_committed(common, common.topic(Topic.SOURCE_DLQ))]
    return {d.source_partition * 10**9 + d.source_offset: d for d in letters if d.source_topic == topic}


def copy_faults(expected: set[str], counts: Counter[str]) -> tuple[list[str], list[str]]:
    """(lost, duplicated) record ids: the check both tests apply."""
    return sorted(expected - set(counts)), sorted(i for i, n in counts.items() if n > 1 or i not in expected)


# About 105 s. make test proves the source through kill -9s, a zombie and dead letters once, on
# another cluster (the test at the end); this same-cluster twin, with faults at random
# transaction points, runs in make test-extended.
@pytest.mark.extended
def test_a_topic_copied_through_kill9s_counts_every_record_once(running: Running) -> None:
    common = running.common
    topic = fill_topic(common.kafka_bootstrap, f"{common.topic_prefix}user.orders", "a", 3000, seed=7)
    rng = random.Random(22)
    kills = 0  # mid-copy
    # Rounds: a fault at a random transaction point (the source kills itself there), or a
    # kill -9 from outside after a random time; then a clean start that finishes the copy.
    for round_ in range(10):
        if round_ % 2 == 0:
            process = running.source(topic.name, "s", **{FAULT_ENV: f"random@0.05@{rng.randrange(10**6)}"}).start()
            eventually(lambda: not process.alive() or running.copied(topic.name), 90, "a kill or the end of the copy")  # noqa: B023
            if process.alive():  # it finished the copy without hitting its fault
                process.terminate()
                break
            assert process.wait_exit(timeout_s=5) == -9, process.log_tail()
        else:
            process = running.source(topic.name, "s")
            assigned_before = _assignments(process)
            process.start()
            # Once it holds the partitions (the killed member's session must expire first).
            eventually(lambda: _assignments(process) > assigned_before or not process.alive(), 60, "the source's assignment")  # noqa: B023
            time.sleep(rng.uniform(0.0, 0.8))
            assert process.kill9() == -9
        if running.copied(topic.name):
            break
        kills += 1  # one that landed with records still to copy
    process = running.source(topic.name, "s").start()
    try:
        eventually(lambda: running.copied(topic.name), 180, "the source to copy the whole topic", interval_s=2)
        counts = first_attempts(common, topic.name)
        lost, duplicated = copy_faults(set(topic.good), counts)
        assert (lost, duplicated) == ([], []), f"lost {lost[:10]} (of {len(lost)}), duplicated {duplicated[:10]}"
        letters = dead_letters(common, topic.name)
        assert set(letters) == set(topic.bad)
        for where, (_partition, reason) in topic.bad.items():
            letter = letters[where]
            assert (letter.stage, letter.error_class) == ("source", reason)
            assert letter.message.startswith(("payload: ", "header 'trace' is not UTF-8")), letter.message
        answer = usersum.fold_answer(topic.good.values())
        assert len(answer) > 30 and sum(r["count"] for r in answer.values()) == len(topic.good)

        eventually(lambda: running.table_matches("a", answer), 240, "the table to equal the fold of every record of the topic", interval_s=2)
        eventually(lambda: not undrained(common, JOB), 120, "the pipeline to drain", interval_s=2)
        assert {k: v for k, v in running.table().items() if k.startswith("a")} == answer
        assert kills >= 4, f"only {kills} kills landed mid-copy"
    finally:
        process.terminate()


def test_the_source_holds_at_max_pending_trees_while_the_acker_is_away(running: Running) -> None:
    """Issue 39: the source had no cap on trees in flight, so a backlog went into the acker and
    the hops all at once. With the acker stopped no tree ends: the source stops at its cap
    (within one batch), and copies the rest, each record once, when the acker is back."""
    common = running.common
    topic = fill_topic(common.kafka_bootstrap, f"{common.topic_prefix}user.held", "h", 400, seed=31)
    acker = running.supervisor.instances["acker"].process
    acker.sigstop()
    process = running.source(topic.name, "held", ONCEFLOW_SOURCE_MAX_PENDING="40", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="10")
    try:
        process.start()
        process.wait_log("trees in flight (ONCEFLOW_SOURCE_MAX_PENDING): holding", 60)
        time.sleep(2.0)  # many polls while held
        held_at = sum(first_attempts(common, topic.name).values())
        assert 40 <= held_at < 40 + 10, held_at
    finally:
        acker.sigcont()
    try:
        eventually(lambda: running.copied(topic.name), 120, "the source to copy the rest once trees end", interval_s=1)
        process.wait_log("trees in flight: reading again", 10)
        lost, duplicated = copy_faults(set(topic.good), first_attempts(common, topic.name))
        assert (lost, duplicated) == ([], []), f"lost {lost[:10]} (of {len(lost)}), duplicated {duplicated[:10]}"
    finally:
        process.terminate()


def test_offsets_committed_outside_the_transaction_lose_records_and_the_check_sees_it(running: Running) -> None:
    common = running.common
    topic = fill_topic(common.kafka_bootstrap, f"{common.topic_prefix}user.sabotaged", "s", 600, seed=8)
    # Offsets first, then killed after producing the records of the second batch, before commit.
    broken = running.source(topic.name, "b", **{SABOTAGE_ENV: "offsets_outside_txn", FAULT_ENV: "after_produce@2"}).start()
    assert broken.wait_exit(timeout_s=90) == -9, broken.log_tail()
    process = running.source(topic.name, "b").start()
    try:
        eventually(lambda: running.copied(topic.name), 180, "the source to copy the rest", interval_s=2)
        lost, duplicated = copy_faults(set(topic.good), first_attempts(common, topic.name))
        assert lost and not duplicated, "the sabotaged build lost nothing: the check cannot fail"
        assert len(lost) <= 60  # one batch
        answer = usersum.fold_answer(topic.good.values())
        eventually(lambda: not undrained(common, JOB), 180, "the pipeline to drain", interval_s=2)
        table = {k: v for k, v in running.table().items() if k.startswith("s")}
        assert table != answer
        assert sum(r["count"] for r in table.values()) == len(topic.good) - len(lost)
    finally:
        process.terminate()



def test_the_cli_copies_in_the_foreground_with_progress_and_refuses_a_missing_topic(running: Running) -> None:
    common = running.common
    env = {**os.environ, "ONCEFLOW_TOPIC_PREFIX": common.topic_prefix, "ONCEFLOW_KAFKA_BOOTSTRAP": common.kafka_bootstrap,
           "ONCEFLOW_SOURCE_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD)}
    cli = [sys.executable, "-m", "onceflow_tools", "source", "kafka"]
    missing = subprocess.run([*cli, "--topic", f"{common.topic_prefix}no.such.topic"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stdout, missing.stdout + missing.stderr
    topic = fill_topic(common.kafka_bootstrap, f"{common.topic_prefix}user.cli", "c", 300, seed=9)
    out = running.log_dir / "cli.out"
    with out.open("w") as sink:
        proc = subprocess.Popen([*cli, "--topic", topic.name, "--port", "0", "--metrics-port", "0", "--instance", "cli"],
                                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        eventually(lambda: f"copied {len(topic.good):,}  dead letters {len(topic.bad)}" in out.read_text(), 90,
                   "the CLI's progress to show the whole topic copied")
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the current transaction finishes, then it stops
        assert proc.wait(30) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"stopped (exit 0): copied {len(topic.good):,}" in out.read_text()
    assert not set(topic.good) - set(first_attempts(common, topic.name))


def test_with_an_id_field_copies_of_a_record_count_once_and_records_without_one_are_dead_letters(running: Running) -> None:
    common = running.common
    name = f"{common.topic_prefix}user.events"
    admin = AdminClient(clients.plain_config(common.kafka_bootstrap))
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(30)
    rng = random.Random(10)
    producer = Producer(clients.plain_config(common.kafka_bootstrap, **{"enable.idempotence": True}))
    distinct: dict[str, KeyedRecord] = {}
    for index in range(600):
        record = KeyedRecord(f"e-{index}", f"i{rng.randrange(20)}", rng.randrange(1, 1000))
        distinct[record.record_id] = record
        body = json.dumps({"id": record.record_id, "user": record.user, "amount": record.amount}).encode()
        producer.produce(name, body, key=record.user.encode())
        if index % 5 == 0:  # the producer sent it again (a retry upstream): another offset, the same record
            producer.produce(name, body, key=record.user.encode(), partition=(index // 5) % 2)
        if index % 100 == 50:
            producer.produce(name, json.dumps({"user": record.user, "amount": 1}).encode())  # no id
            producer.produce(name, b"user=" + record.user.encode())  # not JSON
    assert producer.flush(30) == 0
    process = running.source(name, "ids", ONCEFLOW_SOURCE_ID_FIELD="id").start()
    try:
        eventually(lambda: running.copied(name), 120, "the source to copy the topic", interval_s=1)
        letters = [DeadLetter.FromString(r.value or b"") for r in read_committed(common, common.topic(Topic.SOURCE_DLQ))]
        reasons = Counter((d.error_class, d.message) for d in letters if d.source_topic == name)
        assert reasons == {("NoIdField", "no id field 'id'"): 6,
                           ("Unparsable", "the value is not JSON (Expecting value: line 1 column 1 (char 0)), "
                                          "so it has no id field 'id'"): 6}
        answer = usersum.fold_answer(distinct.values())

        eventually(lambda: running.table_matches("i", answer), 180, "the table to count each id once", interval_s=2)
    finally:
        process.terminate()


def _resumed(process: ServiceProcess) -> int:
    """How many starts got as far as reading their positions back (after fencing)."""
    return process.log_path.read_text(errors="replace").count("partitions, resuming at") if process.log_path.exists() else 0


def test_a_topic_on_another_cluster_is_copied_once_through_kill9s_and_a_zombie(
    running: Running, other_cluster: KafkaBroker
) -> None:
    common = running.common
    remote = other_cluster.bootstrap
    # Long enough for two kills to land mid-copy on a fast run too (2,500 records once left
    # room for only one: a fresh-clone run whose suite took 10 minutes).
    topic = fill_topic(remote, f"{common.topic_prefix}user.remote", "r", 6000, seed=11)
    cluster_id = AdminClient(clients.plain_config(remote)).list_topics(timeout=15).cluster_id
    assert cluster_id and cluster_id != AdminClient(clients.plain_config(common.kafka_bootstrap)).list_topics(timeout=15).cluster_id
    external = ExternalTopic(remote, topic.name, cluster_id)
    env = {"ONCEFLOW_SOURCE_BOOTSTRAP": remote, "ONCEFLOW_LOOP_MAX_BATCH_RECORDS": "20"}

    # The zombie: stops itself inside its third transaction, records produced, not committed.
    zombie = running.source(topic.name, "zombie", **env, **{FAULT_ENV: "after_produce@3:stop"}).start()
    eventually(zombie.stopped, 60, "the zombie to stop inside a transaction")
    # Its replacement (another instance name, the same transactional.id: one owner per topic)
    # fences it; killed at once inside its own third transaction, then kill -9ed from outside at
    # random moments; the supervisor starts it again each time.
    current = running.source(topic.name, "replacement", **env)
    supervisor = RestartOnRequest(lambda: [current], codes=(-9, EXIT_RESTART)).start()
    current.start({FAULT_ENV: "after_produce@3"})
    rng = random.Random(23)
    try:
        eventually(lambda: current.starts > 1 and _resumed(current) >= 2, 60, "the restart after the fault")
        woke_at = len(zombie.log_path.read_text(errors="replace"))
        zombie.sigcont()  # after its replacement committed: its open transaction was aborted
        assert zombie.wait_exit(60) == EXIT_FENCED, zombie.log_tail()
        assert "fenced" in zombie.log_path.read_text(errors="replace")[woke_at:]
        ends = {p: high for p, (_lso, high) in end_offsets(CommonSettings(kafka_bootstrap=remote), topic.name).items()}

        def copied() -> bool:
            return read_positions(common, common.topic(Topic.SOURCE_OFFSETS), external) == ends

        kills = 0
        for _ in range(3):
            time.sleep(rng.uniform(0.1, 0.6))
            if copied():
                break
            resumed = _resumed(current)
            assert current.kill9() == -9
            kills += 1
            eventually(lambda: _resumed(current) > resumed, 60, "the restarted source to resume")  # noqa: B023
        assert kills >= 2, f"only {kills} kills landed mid-copy"
        eventually(copied, 120, "source.offsets to reach the topic's end", interval_s=1)
    finally:
        supervisor.stop()
        current.terminate()
        zombie.ensure_dead()
    offsets_topics = [common.topic(Topic.INGEST_RECORDS), common.topic(Topic.SOURCE_OFFSETS)]
    assert hanging_transactions(common, offsets_topics, wait_s=30) == {}
    lost, duplicated = copy_faults(set(topic.good), first_attempts(common, topic.name))
    assert (lost, duplicated) == ([], []), f"lost {lost[:10]} (of {len(lost)}), duplicated {duplicated[:10]}"
    assert {where: d.error_class for where, d in dead_letters(common, topic.name).items()} == {
        where: reason for where, (_p, reason) in topic.bad.items()}
    answer = usersum.fold_answer(topic.good.values())

    eventually(lambda: running.table_matches("r", answer), 120, "the table to equal the fold of every record of the remote topic", interval_s=2)
    eventually(lambda: not undrained(common, JOB), 120, "the pipeline to drain", interval_s=2)
    assert {k: v for k, v in running.table().items() if k.startswith("r")} == answer
