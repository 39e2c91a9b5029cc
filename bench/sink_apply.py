"""The cost of exactly-once in the sink: changes/s through the sink's fenced, continuity-checked
apply script against plain pipelined Redis writes of the same changes, and against the same
script without the continuity check, in the same run, with batches of 100 and 1000 changes.

Both sides write the same upserts and retractions to a real Redis, one batch per round trip:
the baseline as a non-transactional pipeline of HSET/HDEL, the sink as one EVALSHA of its apply
script (token check, continuity check, the writes, the offset). Then the whole sink service is timed
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

import redis
import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow import faults
from onceflow.config import CommonSettings, repo_root
from onceflow.redis_client import connect, delete_prefix
from onceflow.state.redis_store import UNCHECKED, expect
from onceflow.topology import Topic
from onceflow.v1.results_pb2 import ResultChange
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port

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


def _plain(client: redis.Redis, table_key: str, batches: list[list[Change]]) -> float:
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


def _exactly_once(tables: ResultTables, batches: list[list[Change]], checked: bool = True) -> float:
    """The sink's script; ``checked=False`` runs the same script without the continuity check
    (the expected position "*", as the sabotaged build sends), fencing and offset kept."""
    token, _ = tables.take_ownership(0)
    applied = -1
    sabotages = () if checked else ("redis_unchecked",)
    with faults.sabotaging(*sabotages):
        # A guard: the comparison means something only if the sabotage reaches the script's argument.
        assert (expect(0) == UNCHECKED) is not checked, "the sabotage did not reach expect()"
        started = time.perf_counter()
        for batch in batches:
            last = applied + len(batch)
            assert tables.apply(0, token, applied, last, batch).outcome is Outcome.APPLIED
            applied = last
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
                producer.produce(common.topic(Topic.COMPUTE_RESULTS), message.SerializeToString(), key=change.key.encode())
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
    rounds: int = typer.Option(3, help="Interleaved rounds; the best of each is reported."),
    service_changes: int = typer.Option(200_000, help="Backlog for the whole-service run."),
    output: Path = typer.Option(Path("bench/results/sink_apply.json")),
) -> None:
    stack.up(create_topics=False)
    client = connect(CommonSettings().redis_url)
    result: dict[str, float] = {}
    table = Table(
        title=f"sink apply vs plain pipelined writes, {changes:,} changes, same Redis, same run (best of {rounds}, interleaved)"
    )
    for column in (
        "batch", "plain pipelined changes/s", "apply, unchecked", "apply, checked (the sink)", "checked / plain",
        "checked / unchecked",
    ):
        table.add_column(column)
    for size in (100, 1000):
        data = _changes(changes)
        batches = [data[i : i + size] for i in range(0, len(data), size)]
        best = {"plain": 0.0, "unchecked": 0.0, "checked": 0.0}
        for _round in range(rounds):  # interleaved, so drift of the machine hits all three alike
            prefix = f"bench{uuid.uuid4().hex[:6]}."
            try:
                plain_key = f"onceflow:{{{prefix}plain}}:table:{JOB}"
                best["plain"] = max(best["plain"], changes / _plain(client, plain_key, batches))
                unchecked = ResultTables(client, prefix + "u.")
                best["unchecked"] = max(best["unchecked"], changes / _exactly_once(unchecked, batches, checked=False))
                checked = ResultTables(client, prefix)
                best["checked"] = max(best["checked"], changes / _exactly_once(checked, batches))
                assert checked.table(JOB) == client.hgetall(plain_key) == unchecked.table(JOB)
            finally:
                delete_prefix(client, prefix)
        result |= {
            f"plain_{size}": best["plain"], f"unchecked_{size}": best["unchecked"], f"exactly_once_{size}": best["checked"],
            f"ratio_{size}": best["checked"] / best["plain"], f"continuity_ratio_{size}": best["checked"] / best["unchecked"],
        }
        table.add_row(
            str(size), f"{best['plain']:,.0f}", f"{best['unchecked']:,.0f}", f"{best['checked']:,.0f}",
            f"{best['checked'] / best['plain']:.2f}x", f"{best['checked'] / best['unchecked']:.2f}x",
        )
    console.print(table)
    with console.status(f"the sink service on a backlog of {service_changes:,} changes"):
        result["service_changes_per_s"] = _service_rate(service_changes)
    console.print(f"sink service (Kafka read_committed -> Redis, one process): {result['service_changes_per_s']:,.0f} changes/s")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    typer.run(main)
