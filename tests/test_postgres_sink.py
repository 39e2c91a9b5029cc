"""The sink with its tables in a real PostgreSQL (``ONCEFLOW_SINK_STORE=postgres``), on the real
broker: compute.results applied exactly once while the sink is killed, while the database is
killed, read-only and restored from an older base backup (a rollback), with changes it cannot
hold dead-lettered with the reason. The checker folds compute.results (read_committed) into the
table it must hold and compares it with the database's, read through Query as users read it."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import grpc
import psycopg
import pytest

from onceflow.admin import fleet
from onceflow.topology import Topic
from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow.v1.envelope_pb2 import DeadLetter
from onceflow.v1.results_pb2 import ResultChange
from onceflow_tools.infra.postgres import PostgresServer
from tests.conftest import Pipeline, eventually
from tests.harness import checker
from tests.test_sink import produce, sink

from onceflow_sink.postgres import MAX_KEY_BYTES
from onceflow_sink.stores import open_store

pytestmark = [pytest.mark.sinks, pytest.mark.integration]

JOB = "totals"
POSTGRES = {"ONCEFLOW_SINK_STORE": "postgres", "ONCEFLOW_LOOP_RETRY_BACKOFF_S": "0.2", "ONCEFLOW_LOOP_MAX_RETRY_BACKOFF_S": "1"}


def changes(count: int, keys: int, seed: int) -> list[ResultChange]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key = f"row-{rng.randrange(keys)}"
        if rng.random() < 0.2:
            out.append(ResultChange(job=JOB, key=key, op=ResultChange.RETRACT))
        else:
            row = {"key": key, "n": i, "share": i / 7}
            out.append(ResultChange(job=JOB, key=key, op=ResultChange.UPSERT, value=json.dumps(row).encode()))
    return out


def expected_table(pipe: Pipeline) -> dict[bytes, bytes]:
    """compute.results applied once in partition order; the changes PostgreSQL cannot hold
    (this test's poison) are dead letters, not rows."""
    table: dict[bytes, bytes] = {}
    records = checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_RESULTS))
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        change = ResultChange.FromString(record.value)
        if len(change.key) > MAX_KEY_BYTES or (change.op == ResultChange.UPSERT and not change.value.startswith(b"{")):
            continue
        if change.op == ResultChange.UPSERT:
            table[change.key.encode()] = change.value
        else:
            table.pop(change.key.encode(), None)
    return table


def wait_applied(pipe: Pipeline, timeout_s: float = 180) -> None:
    """Until the database's per-partition offset reaches the last committed record."""
    store = open_store(pipe.common, "postgres")

    def done() -> bool:
        last: dict[int, int] = {}
        for record in checker.read_committed(pipe.common, pipe.topic(Topic.COMPUTE_RESULTS)):
            last[record.partition] = max(last.get(record.partition, -1), record.offset)
        return all(store.applied_offset(p) >= o for p, o in last.items())

    try:
        eventually(done, timeout_s, "the sink to apply every committed change", interval_s=1.0)
    finally:
        store.close()


def database_table(pipe: Pipeline) -> dict[bytes, bytes]:
    store = open_store(pipe.common, "postgres")
    try:
        return store.table(JOB)
    finally:
        store.close()


@pytest.mark.fault
def test_the_postgres_sink_is_exact_through_kill9s_and_a_crashed_read_only_and_restored_database(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    server = PostgresServer.from_env()
    server.start()
    proc, address = sink(pipeline, "a", **POSTGRES)
    proc.start()
    proc.wait_healthy(address)
    endpoint = fleet.Endpoint("sink", address)
    poison = [
        ResultChange(job=JOB, key="k" * (MAX_KEY_BYTES + 1), op=ResultChange.UPSERT, value=b"{}"),
        ResultChange(job=JOB, key="row-list", op=ResultChange.UPSERT, value=b"[1, 2]"),
    ]
    sender = threading.Thread(target=produce, args=(pipeline, [*poison, *changes(12_000, 1500, seed=1)], 0.3), daemon=True)
    sender.start()
    rng = random.Random(2)
    for _ in range(2):
        time.sleep(rng.uniform(1.0, 2.5))
        assert proc.kill9() == -9
        proc.start()
    sender.join(120)
    wait_applied(pipeline)
    assert database_table(pipeline) == expected_table(pipeline)
    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipeline.common, pipeline.topic(Topic.SINK_DLQ))]
    assert sorted(letter.message.split(": ", 1)[1][:20] for letter in letters) == ["key of 2,001 bytes: ", "the row is a JSON li"]

    # Restored from an older base backup: the database went back in time under the sink.
    backup = server.base_backup(tmp_path / "backup")
    produce(pipeline, changes(5_000, 1500, seed=3))
    wait_applied(pipeline)
    server.restore(backup)
    assert database_table(pipeline) != expected_table(pipeline)  # the rollback did lose rows
    proc.wait_log("replaying compute.results from its start", 60)
    wait_applied(pipeline)
    assert database_table(pipeline) == expected_table(pipeline)
    assert fleet.query(endpoint, None, 5.0).status.gauges["store_repairs"] >= 1

    # Read-only (a demoted primary, a standby, default_transaction_read_only): NOT_SERVING with
    # the reason, nothing skipped, serving again once it takes writes.
    with psycopg.connect(server.url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
    try:
        produce(pipeline, changes(2_000, 1500, seed=5))

        def read_only() -> bool:
            status = fleet.query(endpoint, None, 5.0)
            return status.health == "NOT_SERVING" and "read-only transaction" in status.error

        eventually(read_only, 60, "the sink to report PostgreSQL refusing writes")
    finally:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
            admin.execute("SELECT pg_reload_conf()")
    wait_applied(pipeline)
    assert database_table(pipeline) == expected_table(pipeline)

    # Killed, and down a while: NOT_SERVING with the reason, nothing skipped, serving again after.
    server.kill9()
    produce(pipeline, changes(2_000, 1500, seed=4))

    def waiting() -> bool:
        status = fleet.query(endpoint, None, 5.0)
        return status.health == "NOT_SERVING" and "PostgreSQL unavailable" in status.error

    eventually(waiting, 60, "the sink to report PostgreSQL unavailable")
    assert proc.alive(), "a database down must not crash the sink"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as down:
        sink_pb2_grpc.QueryStub(channel).Get(sink_pb2.GetRowRequest(job=JOB, key="row-1"), timeout=15)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE and "PostgreSQL unavailable" in (down.value.details() or "")
    # A sink (re)started while the database is down waits for it: no crash loop.
    assert proc.kill9() == -9
    proc.start()
    proc.wait_log("is not answering yet", 60)
    time.sleep(3)
    assert proc.alive(), proc.log_tail()
    server.start()
    wait_applied(pipeline)
    assert database_table(pipeline) == expected_table(pipeline)
    eventually(lambda: fleet.query(endpoint, None, 5.0).health == "SERVING", 30, "the sink to serve again")
    assert proc.terminate() == 0, proc.log_tail()
