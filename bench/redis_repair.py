"""How long Redis takes to be whole again after it lost everything a store wrote: from a flush of
the store's keys (what a rollback to an empty snapshot or an emptied replica leaves) to a
repaired store, through the services' own code.

- **dedup**: one ``dedup.changelog`` partition with ``--ids`` record_ids, restored into a
  ``DedupStore`` by ``PartitionStores`` (the assignment path), its keys flushed, then one
  ``audit()``: the check finds the store diverged and rebuilds it from the changelog's start,
  Bloom filters included. Reported: seconds and ids/s, beside the first restore.
- **sink**: ``--rows`` distinct rows in ``compute.results`` applied by the real sink service
  ("first fill" counts from the process start), the run's keys flushed, then the time until the table served from Redis is whole and equal
  again (the sink notices within its once-a-second check, retakes each partition and replays
  it). Beside it, the replay alone: the slowest partition's "rebuilt through offset" time from
  the sink's own log, which leaves out the wait for the check.

Run: .venv/bin/python bench/redis_repair.py [--ids N] [--rows N] [--json]
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from pathlib import Path

import redis
import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings, repo_root
from onceflow.redis_client import connect, delete_prefix
from onceflow.state.stores import PartitionStores
from onceflow.topology import Topic
from onceflow.v1.results_pb2 import ResultChange
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics, load_specs
from onceflow_tools.process import ServiceProcess, free_port
from onceflow_tools.verify import redis_faults

from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.store import DedupStore
from onceflow_sink.tables import ResultTables

console = Console(width=140, stderr=True)
JOB = "bench"
BUCKETS = 10  # ids spread over this many one-minute buckets
DEADLINE_S = 600.0  # a wait that outlasts this is a broken run, not a slow one
REBUILT = re.compile(r"partition (\d+) rebuilt through offset \d+ in ([\d.]+)s")


def _replay_times(sink: ServiceProcess, partitions: set[int]) -> dict[int, float]:
    """Each partition's replay, as the sink logs it once the replay is back where it was."""
    deadline = time.monotonic() + 30
    while True:
        replays = {int(p): float(s) for p, s in REBUILT.findall(sink.log_path.read_text(errors="replace"))}
        if set(replays) >= partitions:
            return replays
        assert time.monotonic() < deadline, f"rebuilt lines for {sorted(replays)} only, of {sorted(partitions)}"
        time.sleep(0.1)


def _wait_rows(client: redis.Redis, table_key: str, rows: int, sink: ServiceProcess) -> float:
    """Seconds until the table holds ``rows`` rows (cheap HLEN polls; the caller compares values)."""
    started = time.perf_counter()
    while client.hlen(table_key) < rows:
        assert sink.alive(), f"the sink exited\n{sink.log_tail()}"
        assert time.perf_counter() - started < DEADLINE_S, f"table short of {rows} rows after {DEADLINE_S:.0f} s"
        time.sleep(0.05)
    return time.perf_counter() - started


def _produce(common: CommonSettings, topic: str, records: list[tuple[bytes, bytes]], partition: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for key, value in records:
        while True:
            try:
                if partition is None:
                    producer.produce(topic, value, key=key)
                else:
                    producer.produce(topic, value, key=key, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "records left unsent"


def dedup_repair(ids: int) -> dict[str, float]:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    client = connect(common.redis_url)
    spec = BucketSpec(expected_per_bucket=max(1, ids // BUCKETS))
    try:
        with console.status(f"writing {ids:,} ids to dedup.changelog"):
            _produce(
                common, common.topic(Topic.DEDUP_CHANGELOG),
                [(f"id-{i:09d}".encode(), str(60_000 * (i % BUCKETS)).encode()) for i in range(ids)], partition=0,
            )
        stores = PartitionStores(
            common, common.topic(Topic.DEDUP_CHANGELOG), lambda p: DedupStore(client, prefix, p, spec), service="bench",
        )
        with console.status("first restore (assignment)"):
            started = time.perf_counter()
            stores.assign([0])
            restore_s = time.perf_counter() - started
        assert len(stores[0]) == ids, f"restored {len(stores[0])} of {ids} ids"
        redis_faults.flush(client, prefix)
        with console.status("flushed: the audit finds it and rebuilds"):
            started = time.perf_counter()
            stores.audit()
            repair_s = time.perf_counter() - started
        assert stores.repairs == 1 and len(stores[0]) == ids, f"rebuilt {len(stores[0])} of {ids} ids"
        stores.audit()  # the rebuilt store passes its own continuity check (ids held = its count)
        assert stores.repairs == 1, "the rebuilt store diverged again"
        return {"ids": ids, "restore_s": restore_s, "repair_s": repair_s, "repair_ids_per_s": ids / repair_s}
    finally:
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        delete_prefix(client, prefix)


def sink_repair(rows: int) -> dict[str, float]:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    client = connect(common.redis_url)
    tables = ResultTables(client, prefix)
    expected = {f"row-{i:08d}".encode(): f"value-{i}".encode() for i in range(rows)}
    with console.status(f"writing {rows:,} rows to compute.results"):
        _produce(
            common, common.topic(Topic.COMPUTE_RESULTS),
            [
                (f"{JOB}\x00{key.decode()}".encode(), ResultChange(job=JOB, key=key.decode(), op=ResultChange.UPSERT, value=value).SerializeToString())
                for key, value in expected.items()
            ],
        )
    port = free_port()
    sink = ServiceProcess(
        "sink", "onceflow_sink",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_SINK_PORT": str(port), "ONCEFLOW_SINK_METRICS_PORT": "0",
         "ONCEFLOW_SINK_ACKING": "false"},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    )
    try:
        with console.status("the sink starts and applies the table"):
            # From the process start: by its first healthy answer a small table is often applied already.
            sink.start()
            apply_s = _wait_rows(client, tables.table_key(JOB), rows, sink)
            sink.wait_healthy(f"127.0.0.1:{port}")
        assert tables.table(JOB) == expected, "the first fill differs"
        # Only a partition that holds rows has a replay to log (one with none has nothing to replay).
        partitions = next(spec.partitions for spec in load_specs() if spec.name == Topic.COMPUTE_RESULTS)
        filled = {p for p in range(partitions) if client.hget(tables.meta_key(p), "offset") is not None}
        redis_faults.flush(client, prefix)
        with console.status("flushed: until the table is whole again"):
            # Only distinct upserts, replayed into an empty table: all rows back = the table whole.
            repair_s = _wait_rows(client, tables.table_key(JOB), rows, sink)
        assert tables.table(JOB) == expected, "the rebuilt table differs"
        replays = _replay_times(sink, filled)
        return {
            "rows": rows, "first_apply_s": apply_s, "repair_s": repair_s, "repair_rows_per_s": rows / repair_s,
            "replay_s": max(replays.values()), "partitions_rebuilt": len(replays),
        }
    finally:
        sink.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        delete_prefix(client, prefix)


def main(
    ids: int = typer.Option(1_000_000, help="Ids in the dedup partition."),
    rows: int = typer.Option(100_000, help="Rows in the sink's table."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
    output: Path = typer.Option(Path("bench/results/redis_repair.json")),
) -> None:
    stack.up(create_topics=False)
    result = {"dedup": dedup_repair(ids), "sink": sink_repair(rows)}
    table = Table(title="from Redis losing a store's keys to a repaired store (flush, then the services' own repair)")
    for column in ("store", "size", "first fill", "repair", "rate", "replay alone (sink's log)"):
        table.add_column(column)
    dedup, sink = result["dedup"], result["sink"]
    table.add_row("dedup (1 partition)", f"{ids:,} ids", f"{dedup['restore_s']:.1f} s", f"{dedup['repair_s']:.1f} s",
                  f"{dedup['repair_ids_per_s']:,.0f} ids/s", "-")
    table.add_row(f"sink ({sink['partitions_rebuilt']:.0f} partitions)", f"{rows:,} rows",
                  f"{sink['first_apply_s']:.1f} s", f"{sink['repair_s']:.1f} s", f"{sink['repair_rows_per_s']:,.0f} rows/s",
                  f"{sink['replay_s']:.2f} s (the slowest partition)")
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))
    if json_out:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    typer.run(main)
