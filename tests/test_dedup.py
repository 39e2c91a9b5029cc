"""The dedup gate end to end, on the real broker and Redis: ingest (acking on) -> dedup (the
tree ends at the gate) with an acker, clients that retry, ingest replays, kill -9, a zombie and
a broker restart. The checker reads dedup.records read_committed: every distinct record_id
exactly once; and Redis must equal what dedup.changelog says."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import grpc
import pytest
from confluent_kafka import Producer

from onceflow_client import IngestClient, RetryPolicy
from onceflow.codec import decode_envelope
from onceflow.kafka.inspect import consumed_everything
from onceflow.redis_client import connect
from onceflow.topology import Topic
from onceflow.txn.errors import EXIT_FENCED, EXIT_RESTART
from onceflow.v1 import dedup_pb2, dedup_pb2_grpc
from onceflow.v1.acker_pb2 import RecordRef, TreeEvent
from onceflow.v1.envelope_pb2 import DeadLetter
from tests.conftest import Pipeline, eventually, free_port
from tests.harness import checker
from tests.harness.process import RestartOnRequest, ServiceProcess, restart_lone_broker
from tests.harness.workload import Item, ingest_records, items

from onceflow_dedup import store as exact

pytestmark = [pytest.mark.dedup, pytest.mark.integration]

GROUP = "onceflow-dedup"


class Deployment:
    def __init__(self, pipe: Pipeline, restart_codes: tuple[int, ...] = (EXIT_RESTART,)) -> None:
        self.pipe = pipe
        self.ingest_address = f"127.0.0.1:{free_port()}"
        self.ingest = pipe.process(
            "ingest", "onceflow_ingest", ONCEFLOW_INGEST_PORT=self.ingest_address.rsplit(":", 1)[1],
            ONCEFLOW_INGEST_METRICS_PORT="0", ONCEFLOW_INGEST_TREE_TIMEOUT_MS="120000", ONCEFLOW_LOOP_PUNCTUATE_MS="250",
            ONCEFLOW_INGEST_REPLAY="true",  # replays are one more source of copies for the gate
        )
        self.acker = pipe.process(
            "acker", "onceflow_acker", ONCEFLOW_ACKER_PORT=str(free_port()), ONCEFLOW_ACKER_METRICS_PORT="0",
        )
        self.gates: list[tuple[ServiceProcess, str]] = []
        self._supervisor = RestartOnRequest(lambda: (self.ingest, self.acker, *(g for g, _ in self.gates)), restart_codes)

    def gate(self, instance: str, **env: str) -> tuple[ServiceProcess, str]:
        port = free_port()
        proc = self.pipe.process(
            f"dedup-{instance}", "onceflow_dedup", ONCEFLOW_DEDUP_PORT=str(port), ONCEFLOW_DEDUP_METRICS_PORT="0",
            ONCEFLOW_DEDUP_INSTANCE=instance, ONCEFLOW_DEDUP_ACK_MODE="terminal", **env,
        )
        self.gates.append((proc, f"127.0.0.1:{port}"))
        return proc, f"127.0.0.1:{port}"

    def start(self, **gate_env: str) -> tuple[ServiceProcess, str]:
        gate, address = self.gate("a", **gate_env)
        self.acker.start()
        gate.start()
        gate.wait_healthy(address)
        self.ingest.start()
        self.ingest.wait_healthy(self.ingest_address)
        self._supervisor.start()
        return gate, address

    @property
    def restarts(self) -> list[str]:
        return self._supervisor.restarts

    def stop(self) -> None:
        self._supervisor.stop()
        for proc in (self.ingest, self.acker, *(g for g, _ in self.gates)):
            if proc.alive():
                assert proc.terminate() == 0, proc.log_tail()


def send_with_client_retries(address: str, batch: list[Item], retried: list[Item], size: int, pause_s: float) -> None:
    """Each item once, plus ``retried`` again later, as a client whose replies were lost would."""
    rng = random.Random(11)
    position = {item.record_id: index for index, item in enumerate(batch)}
    # (slot, tiebreak, item): a retry lands at a random slot after its first send.
    slots = [(index, 0, item) for index, item in enumerate(batch)]
    slots += [(rng.uniform(position[i.record_id], len(batch)), 1, i) for i in retried]
    stream = [item for _slot, _tie, item in sorted(slots, key=lambda s: (s[0], s[1]))]
    with IngestClient(address, RetryPolicy(max_attempts=500)) as client:
        for start in range(0, len(stream), size):
            chunk = stream[start : start + size]
            # A retry may repeat an id already in the same call; ingest accepts those as-is.
            assert client.ingest(ingest_records(chunk)).accepted == len(chunk)
            time.sleep(pause_s)


def inject_timeouts(pipe: Pipeline, record_ids: set[str]) -> int:
    """Make ingest replay these records: the TIMED_OUT decisions the acker would publish for
    their first trees. Ingest reads each original back by offset and re-sends it as attempt 2."""
    events = []
    for record in checker.read_committed(pipe.common, pipe.topic(Topic.INGEST_RECORDS)):
        envelope = decode_envelope(record.value)
        if envelope.record_id in record_ids and envelope.attempt == 1:
            origin = RecordRef(record_id=envelope.record_id, topic=pipe.topic(Topic.INGEST_RECORDS),
                               partition=record.partition, offset=record.offset)
            events.append(TreeEvent(root_id=envelope.root_id, outcome=TreeEvent.TIMED_OUT, origin=origin,
                                    attempt=1, reason="injected by the test"))
            record_ids.discard(envelope.record_id)  # one replay per record, even if retried
    producer = Producer({"bootstrap.servers": pipe.common.kafka_bootstrap, "enable.idempotence": True})
    for event in events:
        producer.produce(pipe.topic(Topic.ACKER_EVENTS), event.SerializeToString(), key=event.root_id.to_bytes(8, "big"))
    assert producer.flush(30) == 0
    return len(events)


def wait_gate_caught_up(pipe: Pipeline, timeout_s: float = 240) -> None:
    eventually(
        lambda: consumed_everything(pipe.common, pipe.topic(GROUP), pipe.topic(Topic.INGEST_RECORDS)),
        timeout_s, "the gate to commit past the last record of ingest.records", interval_s=2.0,
    )


def check_exactly_once_and_converged(pipe: Pipeline, expected: list[str]) -> None:
    outputs = checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_RECORDS))
    checker.DeliveryReport.of(outputs, expected).assert_exactly_once()
    topics = [pipe.topic(t) for t in (Topic.DEDUP_RECORDS, Topic.DEDUP_CHANGELOG, Topic.DEDUP_DLQ, Topic.INGEST_RECORDS)]
    assert checker.hanging_transactions(pipe.common, topics, wait_s=30) == {}
    # Redis (written after each commit, caught up on restore) equals the changelog's table.
    changelog = checker.latest_by_key(checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_CHANGELOG)))
    client = connect(pipe.common.redis_url)
    for partition in range(4):
        keys = exact.StoreKeys.of(pipe.common.topic_prefix, partition)
        in_redis = client.hgetall(keys.ids)
        in_changelog = {k: v for (p, k), v in changelog.items() if p == partition}
        assert in_redis == in_changelog, f"partition {partition}: redis {len(in_redis)} ids, changelog {len(in_changelog)}"
        filed = set()
        for bucket in {int(v) for v in in_redis.values()}:
            filed |= client.smembers(keys.bucket(bucket))
        assert filed == set(in_redis)
    assert len(changelog) == len(expected)


def arrived_copies(pipe: Pipeline) -> tuple[Counter[str], int]:
    """How many copies of each id reached the gate, and how many were ingest replays."""
    copies: Counter[str] = Counter()
    replays = 0
    for record in checker.read_committed(pipe.common, pipe.topic(Topic.INGEST_RECORDS)):
        envelope = decode_envelope(record.value)
        copies[envelope.record_id] += 1
        replays += envelope.attempt > 1
    return copies, replays


@pytest.mark.fault
def test_retries_replays_kill9_and_a_broker_restart_pass_each_id_once(pipeline: Pipeline, broker) -> None:
    # Restarted as a deployment's supervisor would: a service asking for it (exit 4), one fenced
    # by a coordinator that aborted its transaction across the restart (exit 3), and one that
    # librdkafka aborted while the broker was down (SIGABRT, "rd_kafka_enq_once_del_source_return:
    # Assertion `eonce->refcnt > 0' failed" in ingest, a CI run on three workers). Every id must
    # still pass once.
    deploy = Deployment(pipeline, restart_codes=(EXIT_RESTART, EXIT_FENCED, -signal.SIGABRT))
    gate, _address = deploy.start()
    # 20,000 records in 100 calls a quarter of a second apart: the kills and the broker restart
    # below land while they flow (50,000 in calls of 500 took the same time at 2.5x the CPU).
    batch = items("dedup", 20_000)
    rng = random.Random(5)
    retried = rng.sample(batch, 2_000)  # 10% duplicated by client retries
    sender = threading.Thread(
        target=send_with_client_retries, args=(deploy.ingest_address, batch, retried, 200, 0.25), daemon=True
    )
    sender.start()
    kills = 0
    for _ in range(3):
        time.sleep(rng.uniform(2.0, 5.0))
        assert gate.kill9() == -9
        kills += 1
        gate.start()
    restart_lone_broker(broker, pipeline.processes)
    sender.join(300)
    assert not sender.is_alive(), f"the client did not finish sending (restarted: {deploy.restarts})\n{deploy.ingest.log_tail()}"
    replayed = inject_timeouts(pipeline, {i.record_id for i in rng.sample(batch, 1_000)})  # 2% replayed by ingest
    assert replayed == 1_000
    for _ in range(2):
        time.sleep(rng.uniform(1.0, 3.0))
        assert gate.kill9() == -9
        kills += 1
        gate.start()
    assert kills == 5
    eventually(lambda: arrived_copies(pipeline)[1] >= replayed, 120, "ingest to replay the timed-out records", 2.0)
    wait_gate_caught_up(pipeline)

    copies, replays = arrived_copies(pipeline)
    assert replays == replayed
    # The gate really was tested: at least the retries and the replays reached it.
    assert sum(copies.values()) - len(copies) >= len(retried) + replayed
    check_exactly_once_and_converged(pipeline, [i.record_id for i in batch])
    deploy.stop()


@pytest.mark.fault
def test_a_zombie_gate_is_fenced_out_of_kafka_and_redis(pipeline: Pipeline) -> None:
    deploy = Deployment(pipeline)
    # The zombie stops itself right after its 15th commit, before writing Redis.
    zombie, _ = deploy.start(ONCEFLOW_FAULT="after_commit@15:stop", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="200")
    batch = items("zombie", 10_000)
    retried = random.Random(3).sample(batch, 1_000)
    sender = threading.Thread(
        target=send_with_client_retries, args=(deploy.ingest_address, batch, retried, 250, 0.1), daemon=True
    )
    sender.start()
    eventually(zombie.stopped, 90, "the gate to stop itself after a commit")
    replacement, address = deploy.gate("b")
    replacement.start()
    replacement.wait_log("assigned [0, 1, 2, 3]", 60)
    before = sum(exact.rejected_writes(connect(pipeline.common.redis_url), pipeline.common.topic_prefix, p) for p in range(4))
    assert before == 0
    zombie.sigcont()
    assert zombie.wait_exit(60) == EXIT_FENCED, zombie.log_tail()
    client = connect(pipeline.common.redis_url)
    rejected = sum(exact.rejected_writes(client, pipeline.common.topic_prefix, p) for p in range(4))
    assert rejected >= 1, "the zombie's post-commit Redis write was not refused"
    assert "write refused" in zombie.log_path.read_text()
    sender.join(180)
    wait_gate_caught_up(pipeline)
    check_exactly_once_and_converged(pipeline, [i.record_id for i in batch])
    with grpc.insecure_channel(address) as channel:
        stats = dedup_pb2_grpc.DedupAdminStub(channel).Stats(dedup_pb2.DedupStatsRequest(), timeout=5)
    assert sorted(stats.partitions) == [0, 1, 2, 3] and stats.dropped > 0
    assert replacement.alive()
    deploy.stop()


def test_poison_goes_to_the_dlq_with_the_reason_and_nothing_else_is_lost(pipeline: Pipeline) -> None:
    deploy = Deployment(pipeline)
    _gate, address = deploy.start()
    producer = Producer({"bootstrap.servers": pipeline.common.kafka_bootstrap})
    producer.produce(pipeline.topic(Topic.INGEST_RECORDS), b"\x08\x96\x01not an envelope", key=b"poison")
    assert producer.flush(10) == 0
    batch = items("after-poison", 2_000)
    send_with_client_retries(deploy.ingest_address, batch, batch[:100], 500, 0.0)
    wait_gate_caught_up(pipeline)
    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.DEDUP_DLQ))]
    assert len(letters) == 1
    assert letters[0].stage == "dedup" and "not an Envelope" in letters[0].message
    assert letters[0].original == b"\x08\x96\x01not an envelope"
    check_exactly_once_and_converged(pipeline, [i.record_id for i in batch])

    token = [("authorization", "Bearer test-token")]
    with grpc.insecure_channel(address) as channel:
        admin = dedup_pb2_grpc.DedupAdminStub(channel)
        seen = admin.Check(dedup_pb2.CheckRequest(record_id=batch[0].record_id), timeout=5)
        assert seen.seen and seen.owned and seen.filter_maybe and seen.bucket_start_ms > 0
        assert not admin.Check(dedup_pb2.CheckRequest(record_id="never-sent"), timeout=5).seen
        with pytest.raises(grpc.RpcError) as refused:
            admin.Forget(dedup_pb2.ForgetRequest(record_id=batch[0].record_id), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as empty:
            admin.Check(dedup_pb2.CheckRequest(record_id=""), timeout=5)
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        forgotten = admin.Forget(dedup_pb2.ForgetRequest(record_id=batch[0].record_id), metadata=token, timeout=35)
        assert forgotten.forgotten and forgotten.partition == seen.partition
        assert not admin.Check(dedup_pb2.CheckRequest(record_id=batch[0].record_id), timeout=5).seen
        stats = admin.Stats(dedup_pb2.DedupStatsRequest(), timeout=5)
    assert stats.passed == len(batch) and stats.dropped == 100 and stats.dead_letters == 1 and stats.forgotten == 1
    cli = subprocess.run(
        [sys.executable, "-m", "onceflow_tools", "admin", "dedup", "stats", "-a", address, "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert json.loads(cli.stdout)["passed"] == str(len(batch))  # uint64 renders as a JSON string
    assert stats.fast_path_ratio > 0.9 and stats.measured_false_positive_rate <= 0.01
    # Forgotten means re-drivable: the same id passes the gate once more.
    send_with_client_retries(deploy.ingest_address, batch[:1], [], 1, 0.0)
    wait_gate_caught_up(pipeline)
    outputs = checker.read_committed(pipeline.common, pipeline.topic(Topic.DEDUP_RECORDS))
    assert Counter(checker.record_id(r) for r in outputs)[batch[0].record_id] == 2
    deploy.stop()
