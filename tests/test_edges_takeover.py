"""A takeover by another instance restores the right state (issue 46, scenario 5; ADR 0021).

Every other zombie test reuses the zombie's transactional id, so the successor's
init_transactions fences it. Here the zombie has another one (another instance name), so
nothing fences it: its transaction, with offsets sent while it still owned the partitions,
can commit after its successor took them over. The successor must then hold a store that
includes that commit's changelog writes, or none of the transaction's offsets: it fetches the
committed offsets first (stable offsets, KIP-447: the fetch waits for the open transaction),
restores second, and starts at the offsets it fetched.

The stage is tests/harness/workers/keyed_counter.py (per-key counts in the changelog-backed
store, one output per input carrying the count)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Message, TopicPartition

from onceflow.codec import decode_envelope, encode_envelope, new_id
from onceflow.kafka import clients
from onceflow.service_main import EXIT_USAGE
from onceflow.topology import Topic
from onceflow.v1.envelope_pb2 import Envelope
from tests.conftest import TEST_SESSION_TIMEOUT_MS, Pipeline, eventually
from tests.harness import checker
from tests.harness.process import ServiceProcess
from tests.harness.workload import Item, items, produce_envelopes

pytestmark = [pytest.mark.edges, pytest.mark.integration, pytest.mark.fault]

WORKER = "tests.harness.workers.keyed_counter"
# The successor has reached its takeover: restored (the old order), or about to fetch offsets (this one).
TAKING_OVER = ("restored ", "before restoring them")


def _outputs(pipe: Pipeline) -> list[checker.TopicRecord]:
    return checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_RECORDS))


class _Zombie:
    """An owner of the counter's group that does by hand what a stopped keyed_counter does when
    its changelog records were still in its client's buffer: offsets sent into its transaction
    while it owned the partitions, then its membership ends (here it leaves; a session that
    times out ends it the same way for the group), then, much later, it writes its batch and
    commits. Its transactional id is its own and its transaction timeout (60 s) outlives its
    session: nothing aborts or fences it meanwhile."""

    def __init__(self, pipe: Pipeline, take: int) -> None:
        self._pipe = pipe
        common = pipe.common
        self.consumer = clients.consumer(
            common, pipe.topic("test-counter"), **{"session.timeout.ms": TEST_SESSION_TIMEOUT_MS}
        )
        self.consumer.subscribe([pipe.topic(Topic.INGEST_RECORDS)])
        self.producer = clients.transactional_producer(
            common, pipe.topic("counter-zombie"), **{"transaction.timeout.ms": 60_000}
        )
        self.producer.init_transactions(30)
        self.batch: list[Message] = []
        deadline = time.monotonic() + 60
        while len(self.batch) < take:  # a prefix of each partition: consume keeps partition order
            assert time.monotonic() < deadline, f"the zombie read {len(self.batch)} of {take} records"
            self.batch += [m for m in self.consumer.consume(take - len(self.batch), 1.0) if m.error() is None]

    def send_offsets_and_leave(self) -> None:
        nxt: dict[int, int] = {}
        for record in self.batch:
            nxt[record.partition()] = max(nxt.get(record.partition(), 0), record.offset() + 1)
        topic = self._pipe.topic(Topic.INGEST_RECORDS)
        self.producer.begin_transaction()
        self.producer.send_offsets_to_transaction(
            [TopicPartition(topic, p, o) for p, o in nxt.items()], self.consumer.consumer_group_metadata(), 30
        )
        self.consumer.close()

    def write_and_commit(self) -> None:
        """The batch as KeyedCounter writes it: counts from an empty store (nothing committed
        before it), an output per input, the last count per key to the changelog."""
        counts: Counter[tuple[int, bytes]] = Counter()
        for record in self.batch:
            envelope = decode_envelope(record.value())
            counts[(record.partition(), envelope.key)] += 1
            out = Envelope(
                record_id=envelope.record_id, root_id=envelope.root_id, edge_id=new_id(), attempt=envelope.attempt,
                event_time_ms=envelope.event_time_ms, ingest_time_ms=envelope.ingest_time_ms, key=envelope.key,
                payload=str(counts[(record.partition(), envelope.key)]).encode(),
            )
            self.producer.produce(self._pipe.topic(Topic.DEDUP_RECORDS), encode_envelope(out), key=envelope.key,
                                  headers=[("instance", b"zombie")])
        for (partition, key), count in counts.items():
            self.producer.produce(self._pipe.topic(Topic.DEDUP_CHANGELOG), str(count).encode(), key, partition)
        self.producer.commit_transaction(30)


def _check_counts(pipe: Pipeline, inputs: list[Item]) -> None:
    """The state a run without the zombie would have: the changelog's table equals the counts
    per (input partition, key), and each group's outputs carry the counts 1..n once each."""
    by_id = {i.record_id: i.key for i in inputs}
    partition_of: dict[str, int] = {}
    expected: Counter[tuple[int, bytes]] = Counter()
    for record in checker.read_committed(pipe.common, pipe.topic(Topic.INGEST_RECORDS)):
        record_id = record.key.decode()
        partition_of[record_id] = record.partition
        expected[(record.partition, by_id[record_id])] += 1
    table = checker.latest_by_key(checker.read_committed(pipe.common, pipe.topic(Topic.DEDUP_CHANGELOG)))
    assert {k: int(v) for k, v in table.items()} == dict(expected)
    carried: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for out in _outputs(pipe):
        envelope = decode_envelope(out.value)
        carried[(partition_of[envelope.record_id], envelope.key)].append(int(envelope.payload))
    assert {group: sorted(counts) for group, counts in carried.items()} == {
        group: list(range(1, n + 1)) for group, n in expected.items()
    }


def test_a_zombie_with_another_transactional_id_commits_during_the_takeover(pipeline: Pipeline) -> None:
    inputs = items("takeover", 900, keys=6)
    produce_envelopes(pipeline.common, pipeline.topic(Topic.INGEST_RECORDS), inputs)
    zombie = _Zombie(pipeline, take=300)
    zombie.send_offsets_and_leave()

    successor = pipeline.process("counter-b", WORKER, COUNTER_INSTANCE="b", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="100")
    successor.start()
    eventually(
        lambda: any(mark in successor.log_path.read_text(errors="replace") for mark in TAKING_OVER),
        60, "the successor to take the partitions over", interval_s=0.1,
    )
    zombie.write_and_commit()  # after the successor restored, under the old order

    eventually(
        lambda: len({checker.record_id(r) for r in _outputs(pipeline)}) >= len(inputs),
        60, f"{len(inputs)} distinct outputs", interval_s=0.5,
    )
    assert successor.terminate() == 0, successor.log_tail()
    topics = [pipeline.topic(t) for t in (Topic.DEDUP_RECORDS, Topic.DEDUP_CHANGELOG)]
    assert checker.hanging_transactions(pipeline.common, topics, wait_s=30) == {}
    checker.DeliveryReport.of(_outputs(pipeline), [i.record_id for i in inputs]).assert_exactly_once()
    assert sum(r.header("instance") == b"zombie" for r in _outputs(pipeline)) == 300
    _check_counts(pipeline, inputs)


def test_a_service_refuses_a_transaction_timeout_that_outlives_its_session(tmp_path) -> None:
    env = {"ONCEFLOW_TRANSACTION_TIMEOUT_MS": "6000", "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS": "6000"}
    gate = ServiceProcess("dedup", "onceflow_dedup", env, tmp_path).start()
    assert gate.wait_exit(60) == EXIT_USAGE, gate.log_tail()
    log = gate.log_path.read_text(errors="replace")
    assert "ONCEFLOW_TRANSACTION_TIMEOUT_MS=6000" in log and "ONCEFLOW_LOOP_SESSION_TIMEOUT_MS=6000" in log, log
