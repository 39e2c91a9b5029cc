"""The cost of exactly-once in the sink: changes/s through the sink's fenced, offset-checked
apply script against plain pipelined Redis writes of the same changes, in the same run, with
batches of 100 and 1000 changes.

Both sides write the same upserts and retractions to a real Redis, one batch per round trip:
the baseline as a non-transactional pipeline of HSET/HDEL, the sink as one EVALSHA of its apply
script (token check, offset check, the writes, the offset). Then the whole sink service is timed
on a compute.results backlog, for scale.
Run: .venv/bin/python bench/sink_apply.py [--changes N]
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import uuid
from pathlib import Path

import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings, repo_root
from onceflow.infra import stack
from onceflow.infra.topics import delete_topics, ensure_topics
from onceflow.process import ServiceProcess, free_port
from onceflow.redis_client import connect, delete_prefix
from onceflow.v1.results_pb2 import ResultChange
from onceflow_sink.tables import Change, Outcome, ResultTables

console = Console(width=140)
JOB = "bench"


def _changes(count: int, seed: int = 1) -> list[Change]:
    rng = random.Random(seed)
    return [
        Change("-", JOB, f"row-{rng.randrange(10_000)}") if rng.random() < 0.2
        else Change("+", JOB, f"row-{rng.randrange(10_000)}", f"value-{i:08d}".encode())
        for i in range(count)
    ]


def _plain(client, table_key: str, batches: list[list[Change]]) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for batch in batches:
        with client.pipeline(transaction=False) as pipe:
            for change in batch:
                if change.op == "+":
                    pipe.hset(table_key, change.key, change.value)
                else:
                    pipe.hdel(table_key, change.key)
            pipe.execute()
    return time.perf_counter() - started


def _exactly_once(tables: ResultTables, batches: list[list[Change]]) -> float:
    token, _ = tables.take_ownership(0)
    offset = -1
    started = time.perf_counter()
    for batch in batches:
        offset += len(batch)
        assert tables.apply(0, token, offset, batch) is Outcome.APPLIED
    return time.perf_counter() - started


def _service_rate(changes: int) -> float:
    """The sink service on a backlog of compute.results: changes/s from first to last apply."""
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for change in _changes(changes, seed=2):
        message = ResultChange(job=JOB, key=change.key, value=change.value,
                               op=ResultChange.UPSERT if change.op == "+" else ResultChange.RETRACT)
        while True:
            try:
                producer.produce(common.topic("compute.results"), message.SerializeToString(), key=change.key.encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    port = free_port()
    sink = ServiceProcess(
        "sink", "onceflow_sink",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_SINK_PORT": str(port), "ONCEFLOW_SINK_METRICS_PORT": "0",
         "ONCEFLOW_SINK_ACKING": "false"},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    )
    client = connect(common.redis_url)
    tables = ResultTables(client, prefix)
    try:
        sink.start()
        sink.wait_healthy(f"127.0.0.1:{port}")
        first = None
        while True:
            applied = sum(int(client.hget(tables.meta_key(p), "offset") or -1) + 1 for p in range(4))
            now = time.perf_counter()
            if applied and first is None:
                first = (now, applied)
            if applied >= changes:
                break
            time.sleep(0.05)
        assert first is not None and now > first[0], "backlog too small to time"
        return (applied - first[1]) / (now - first[0])
    finally:
        sink.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        delete_prefix(client, prefix)


def main(
    changes: int = typer.Option(200_000, help="Changes per measurement."),
    service_changes: int = typer.Option(200_000, help="Backlog for the whole-service run."),
    output: Path = typer.Option(Path("bench/results/sink_apply.json")),
) -> None:
    stack.up(create_topics=False)
    client = connect(CommonSettings().redis_url)
    result: dict[str, float] = {}
    table = Table(title=f"sink apply vs plain pipelined writes, {changes:,} changes, same Redis, same run")
    for column in ("batch", "plain pipelined changes/s", "exactly-once apply changes/s", "ratio"):
        table.add_column(column)
    for size in (100, 1000):
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        tables = ResultTables(client, prefix)
        data = _changes(changes)
        batches = [data[i : i + size] for i in range(0, len(data), size)]
        try:
            plain_s = _plain(client, f"onceflow:{{{prefix}plain}}:table:{JOB}", batches)
            once_s = _exactly_once(tables, batches)
            assert tables.table(JOB) == client.hgetall(f"onceflow:{{{prefix}plain}}:table:{JOB}")
        finally:
            delete_prefix(client, prefix)
        plain_rate, once_rate = changes / plain_s, changes / once_s
        result |= {f"plain_{size}": plain_rate, f"exactly_once_{size}": once_rate, f"ratio_{size}": once_rate / plain_rate}
        table.add_row(str(size), f"{plain_rate:,.0f}", f"{once_rate:,.0f}", f"{once_rate / plain_rate:.2f}x")
    console.print(table)
    with console.status(f"the sink service on a backlog of {service_changes:,} changes"):
        result["service_changes_per_s"] = _service_rate(service_changes)
    console.print(f"sink service (Kafka read_committed -> Redis, one process): {result['service_changes_per_s']:,.0f} changes/s")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    typer.run(main)
