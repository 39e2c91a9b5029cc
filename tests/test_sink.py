"""The sink on the real broker and Redis: compute.results applied to Redis exactly once while the
sink is killed, while a zombie tries to write, and with poison in the stream. The checker folds
compute.results (read_committed) into the table it must produce and compares it with Redis."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time

import grpc
import pytest
from confluent_kafka import Producer

from onceflow.admin import fleet
from onceflow.redis_client import connect
from onceflow.topology import Topic
from onceflow.txn.errors import EXIT_FENCED
from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow.v1.acker_pb2 import AckerBatch, Anchor
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow.v1.results_pb2 import ResultChange
from onceflow_tools.verify import redis_faults
from tests.conftest import Pipeline, eventually, free_port
from tests.harness import checker
from tests.harness.process import ServiceProcess

from onceflow_sink.tables import ResultTables

pytestmark = [pytest.mark.sink, pytest.mark.integration]

JOB = "totals"


def changes(count: int, keys: int, seed: int) -> list[ResultChange]:
    """Upserts and retractions of ``keys`` rows; each change carries an anchor (a group of its
    own, on acker.acks partition 0) whose edge the sink acks."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key = f"row-{rng.randrange(keys)}"
        anchor = Anchor(group_id=i + 1, edge_id=i + 7, acker_partitions=[0])
        if rng.random() < 0.2:
            out.append(ResultChange(job=JOB, key=key, op=ResultChange.RETRACT, anchor=anchor))
        else:
            out.append(ResultChange(job=JOB, key=key, op=ResultChange.UPSERT, value=f"v{i}".encode(), anchor=anchor))
    return out


def produce(pipe: Pipeline, items: list[ResultChange | bytes], pause_s: float = 0.0, chunk: int = 2000) -> None:
    producer = Producer({"bootstrap.servers": pipe.common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for start in range(0, len(items), chunk):
        for item in items[start : start + chunk]:
            if isinstance(item, bytes):
                producer.produce(pipe.topic(Topic.COMPUTE_RESULTS), item, key=b"poison")
            else:
                producer.produce(pipe.topic(Topic.COMPUTE_RESULTS), item.SerializeToString(), key=item.key.encode())
        producer.flush(30)
        time.sleep(pause_s)
    assert producer.flush(30) == 0


def expected_table(pipe: Pipeline) -> dict[bytes, bytes]:
    """compute.results applied once, in partition order (a row's changes share its partition)."""
    table: dict[bytes, bytes] = {}
    for record in sorted(checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_RESULTS)), key=lambda r: (r.partition, r.offset)):
        try:
            change = ResultChange.FromString(record.value)
        except Exception:  # noqa: BLE001 - poison: the sink dead-letters it
            continue
        if not change.job or not change.key or change.op not in (ResultChange.UPSERT, ResultChange.RETRACT):
            continue
        if change.op == ResultChange.UPSERT:
            table[change.key.encode()] = change.value
        else:
            table.pop(change.key.encode(), None)
    return table


def sink(pipe: Pipeline, instance: str, **env: str) -> tuple[ServiceProcess, str]:
    port = free_port()
    proc = pipe.process(
        f"sink-{instance}", "onceflow_sink", ONCEFLOW_SINK_PORT=str(port), ONCEFLOW_SINK_METRICS_PORT="0",
        ONCEFLOW_SINK_INSTANCE=instance, **{"ONCEFLOW_SINK_ACKING": "false", **env},
    )
    return proc, f"127.0.0.1:{port}"


def wait_applied(pipe: Pipeline, timeout_s: float = 180) -> None:
    """Until Redis' per-partition offset reaches the last committed record of compute.results."""
    tables = ResultTables(connect(pipe.common.redis_url), pipe.common.topic_prefix)

    def done() -> bool:
        last: dict[int, int] = {}
        for record in checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_RESULTS)):
            last[record.partition] = max(last.get(record.partition, -1), record.offset)
        client = connect(pipe.common.redis_url)
        return all(int(client.hget(tables.meta_key(p), "offset") or -1) >= o for p, o in last.items())

    eventually(done, timeout_s, "the sink to apply every committed change", interval_s=1.0)


def redis_table(pipe: Pipeline) -> dict[bytes, bytes]:
    return ResultTables(connect(pipe.common.redis_url), pipe.common.topic_prefix).table(JOB)


@pytest.mark.fault
def test_hundred_thousand_changes_through_five_kill9s_equal_the_changelog_applied_once(pipeline: Pipeline) -> None:
    proc, address = sink(pipeline, "a")
    proc.start()
    proc.wait_healthy(address)
    sender = threading.Thread(target=produce, args=(pipeline, changes(100_000, 3000, seed=1), 0.3), daemon=True)
    sender.start()
    rng = random.Random(2)
    for _ in range(5):
        time.sleep(rng.uniform(1.5, 4.0))
        assert proc.kill9() == -9
        proc.start()
    sender.join(120)
    wait_applied(pipeline)
    assert redis_table(pipeline) == expected_table(pipeline)
    assert len(expected_table(pipeline)) > 1000  # the check compares real content
    assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.fault
def test_a_zombie_sink_is_refused_by_redis(pipeline: Pipeline) -> None:
    zombie, _ = sink(pipeline, "zombie", ONCEFLOW_FAULT="before_apply@6:stop", ONCEFLOW_LOOP_MAX_BATCH_RECORDS="200")
    zombie.start()
    produce(pipeline, changes(20_000, 500, seed=3), pause_s=0.2)
    eventually(zombie.stopped, 60, "the sink to stop itself before an apply")
    replacement, _ = sink(pipeline, "replacement")
    replacement.start()
    replacement.wait_log("sink: assigned [0, 1, 2, 3]", 60)
    wait_applied(pipeline)
    zombie.sigcont()
    assert zombie.wait_exit(60) == EXIT_FENCED, zombie.log_tail()
    assert "Redis refused the write" in zombie.log_path.read_text()
    tables = ResultTables(connect(pipeline.common.redis_url), pipeline.common.topic_prefix)
    assert sum(tables.rejected(p) for p in range(4)) >= 1
    produce(pipeline, changes(2_000, 500, seed=4))
    wait_applied(pipeline)
    assert redis_table(pipeline) == expected_table(pipeline)
    assert replacement.terminate() == 0, replacement.log_tail()


@pytest.mark.fault
def test_poison_is_dead_lettered_exactly_once_even_across_a_crash_before_the_apply(pipeline: Pipeline) -> None:
    # kill -9 right after the dead-letter transaction committed, before the batch reached Redis.
    proc, address = sink(pipeline, "a", ONCEFLOW_SINK_ACKING="true", ONCEFLOW_FAULT="after_dead_letters@1")
    good = changes(3_000, 200, seed=5)
    poison = [b"\xff\xfe not protobuf", ResultChange(job=JOB, op=ResultChange.UPSERT).SerializeToString(),
              ResultChange(job=JOB, key="k", op=ResultChange.OP_UNSPECIFIED).SerializeToString()]
    produce(pipeline, [*poison, *good])
    proc.start()
    eventually(lambda: not proc.alive(), 60, "the injected crash")
    proc.start({"ONCEFLOW_FAULT": ""})
    proc.wait_healthy(address)
    wait_applied(pipeline)
    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.SINK_DLQ))]
    messages = sorted(letter.message for letter in letters)
    assert len(messages) == 3, messages  # once each, though the batch was processed twice
    assert messages[:2] == ["ResultChange with op 0: want UPSERT or RETRACT", "ResultChange without job or key"]
    assert messages[2].startswith("not a ResultChange")
    assert all(x.stage == "sink" and x.original for x in letters)
    assert redis_table(pipeline) == expected_table(pipeline)
    # Every applied change's edge was acked, on its group (batched per acker.acks partition).
    acked = {(m.root_id, m.xor_value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.ACKER_ACKS))
             for m in AckerBatch.FromString(r.value).messages}
    assert {(c.anchor.group_id, c.anchor.edge_id) for c in good} <= acked

    with grpc.insecure_channel(address) as channel:
        query = sink_pb2_grpc.QueryStub(channel)
        some_key, some_value = next(iter(expected_table(pipeline).items()))
        row = query.Get(sink_pb2.GetRowRequest(job=JOB, key=some_key.decode()), timeout=5)
        assert row.found and row.value == some_value
        assert not query.Get(sink_pb2.GetRowRequest(job=JOB, key="absent"), timeout=5).found
        rows = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, prefix="row-1", limit=5), timeout=5).rows
        assert 0 < len(rows) <= 5 and all(r.key.startswith("row-1") for r in rows)
        with pytest.raises(grpc.RpcError) as bad:
            query.Scan(sink_pb2.ScanRowsRequest(job="", limit=5), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    cli = subprocess.run(
        [sys.executable, "-m", "onceflow_tools", "query", "get", JOB, some_key.decode(), "-a", address, "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert json.loads(cli.stdout) == {"found": True, "value": some_value.decode()}
    cli = subprocess.run(
        [sys.executable, "-m", "onceflow_tools", "query", "scan", JOB, "--prefix", "row-1", "--limit", "5", "-a", address, "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert len(json.loads(cli.stdout)) == 5
    assert proc.terminate() == 0, proc.log_tail()


@pytest.mark.fault
@pytest.mark.redis
def test_a_redis_that_goes_back_is_rebuilt_and_one_that_refuses_writes_is_waited_for(pipeline: Pipeline) -> None:
    """Rolled back under the sink: the next check finds it, the partitions are replayed from
    compute.results and the table is exact again. Refusing writes (NOREPLICAS here, MISCONF on a
    full disk: the same path): NOT_SERVING with the reason in Status, nothing skipped, serving
    again once Redis takes writes."""
    proc, address = sink(pipeline, "a", ONCEFLOW_LOOP_RETRY_BACKOFF_S="0.2", ONCEFLOW_LOOP_MAX_RETRY_BACKOFF_S="1")
    proc.start()
    proc.wait_healthy(address)
    client = connect(pipeline.common.redis_url)
    endpoint = fleet.Endpoint("sink", address)
    produce(pipeline, changes(5_000, 800, seed=5))
    wait_applied(pipeline)
    saved = redis_faults.snapshot(client, pipeline.common.topic_prefix)
    produce(pipeline, changes(5_000, 800, seed=6))
    wait_applied(pipeline)
    assert redis_faults.roll_back(client, pipeline.common.topic_prefix, saved) > 0
    assert redis_table(pipeline) != expected_table(pipeline)  # the rollback did lose rows
    proc.wait_log("replaying compute.results from its start", 30)
    wait_applied(pipeline)
    assert redis_table(pipeline) == expected_table(pipeline)
    assert fleet.query(endpoint, None, 5.0).status.gauges["store_repairs"] >= 1

    client.config_set("min-replicas-to-write", 1)  # this Redis has no replica: every write is refused
    try:
        produce(pipeline, changes(2_000, 800, seed=7))

        def refused() -> bool:
            status = fleet.query(endpoint, None, 5.0)
            return status.health == "NOT_SERVING" and "NOREPLICAS" in status.error

        eventually(refused, 60, "the sink to report Redis refusing writes")
    finally:
        client.config_set("min-replicas-to-write", 0)
    wait_applied(pipeline)
    assert redis_table(pipeline) == expected_table(pipeline)
    eventually(lambda: fleet.query(endpoint, None, 5.0).health == "SERVING", 30, "the sink to serve again")
    assert proc.terminate() == 0, proc.log_tail()
