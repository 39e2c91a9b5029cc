"""Compute worker throughput (records/s) and batch latency p50/p99 of the map hop for the sum
job (usersum) at 1k, 10k and 100k records per micro-batch, with Spark as the engine and, as the
baseline, the same aggregation in plain pandas in the same loop (ONCEFLOW_COMPUTE_ENGINE=pandas).
The ratio spark/pandas per batch size is Spark's per-batch overhead; the target is ≥ 0.5× at 10k.

A backlog of usersum envelopes ({"user": "u<k>", "amount": n}, Kafka key = user) is written once
to dedup.records of a fresh topic prefix. Then, per engine and batch size, the worker is built
in this process (onceflow_compute.service.build, min = max batch records = the batch size) and
its map hop runs in a thread, under a consumer group and transactional id of its own, until it
has committed the run's records; the merge hop is not started (it is not what is measured, and
it would take CPU from the map hop on a 2-core machine). Every run reads the same backlog.

- throughput: records committed after the first transaction / time from the first commit to the
  last (the first batch also pays the group join and the producer's first transaction);
- latency: the loop's own per-transaction seconds (poll return -> commit), first batch dropped;
- engine: the job's own time per batch (MapStage's job seconds), to show where a batch goes.

Spark is warmed up first: one SparkSession for the whole bench, fed batches of every size for
--warm-up-s before anything is timed. The first job of a session costs seconds (JVM start, class
loading, code generation), and the JVM keeps JIT-compiling Spark's own code for a few hundred
jobs more, on the cores the worker's Python needs too.
Run: .venv/bin/python bench/compute_throughput.py [--records N] [--repeats R]
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings
from onceflow.topology import Topic
from onceflow.state import MemoryStore
from onceflow.txn.batch import Batch
from onceflow.v1.envelope_pb2 import Envelope
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics

from onceflow_compute.api import METADATA_COLUMNS, Aggregation
from onceflow_compute.config import ComputeSettings, EngineName
from onceflow_compute.engine import Engine
from onceflow_compute.jobs import load_job
from onceflow_compute.map.stage import MapStage
from onceflow_compute.service import build, make_engine

console = Console(width=160)
JOB = "usersum"
ENGINES = (EngineName.PANDAS, EngineName.SPARK)



def usersum_payload(rng: random.Random, users: int) -> tuple[str, bytes]:
    """One usersum record drawn from ``rng``: (its user, its JSON payload)."""
    user = f"u{rng.randrange(users)}"
    return user, json.dumps({"user": user, "amount": rng.randrange(1, 1000)}).encode()


def produce_usersum(common: CommonSettings, records: int, users: int, seed: int = 1) -> None:
    """``records`` usersum envelopes on dedup.records, keyed by user (the same ones for the same
    ``seed``): the backlog compute's map hop reads."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    topic = common.topic(Topic.DEDUP_RECORDS)
    for index in range(records):
        user, payload = usersum_payload(rng, users)
        envelope = Envelope(
            record_id=f"bench-{index:09d}", root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=now_ms(),
            ingest_time_ms=now_ms(), key=user.encode(), payload=payload,
        )
        while True:
            try:
                producer.produce(topic, encode_envelope(envelope), key=user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


def _warm_up(engine: Engine, batch_sizes: list[int], users: int, budget_s: float) -> list[float]:
    """Run the job on batches of every size in turn (five jobs of each size up to 10k records,
    one of each bigger size) until the budget is spent; returns the seconds of every job. The
    first job of a session costs seconds, and the JVM keeps JIT-compiling Spark's own code for a
    few hundred jobs more: a worker that has run for a minute is what is measured."""
    job = load_job(JOB)
    assert isinstance(job, Aggregation), job
    rng = random.Random(2)
    tables = []
    for size in batch_sizes:
        rows = [f"u{rng.randrange(users)}" for _ in range(size)]
        columns: dict[str, Any] = {
            "user": pa.array(rows, pa.string()),
            "amount": pa.array([rng.randrange(1, 1000) for _ in range(size)], pa.int64()),
            "_record_id": pa.array([f"warm-{i}" for i in range(size)], pa.string()),
            "_key": pa.array(rows, pa.string()),
            "_event_time_ms": pa.array([now_ms()] * size, pa.int64()),
            "_ingest_time_ms": pa.array([now_ms()] * size, pa.int64()),
        }
        tables.append((pa.table(columns, schema=pa.schema([*job.schema, *METADATA_COLUMNS])), 5 if size <= 10_000 else 1))
    seconds: list[float] = []
    deadline = time.monotonic() + budget_s
    while not seconds or time.monotonic() < deadline:
        for table, jobs in tables:
            for _ in range(jobs):
                started = time.monotonic()
                engine.partials(job, table)
                seconds.append(time.monotonic() - started)
    return seconds


@dataclass
class TimedStage:
    """The map stage, timed: when each transaction committed and how long process() took."""

    inner: MapStage
    commits: list[tuple[float, int]] = field(default_factory=list)
    process_seconds: list[float] = field(default_factory=list)
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def process(self, batch: Batch[MemoryStore]) -> None:
        started = time.perf_counter()
        self.inner.process(batch)
        took = time.perf_counter() - started
        count = len(batch.records)

        def committed() -> None:
            self.commits.append((time.perf_counter(), count))
            self.process_seconds.append(took)

        batch.after_commit.append(committed)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0


def _run(prefix: str, engine: EngineName, batch: int, records: int, batch_ms: int) -> dict[str, float]:
    """One map hop over the first ``records`` of the backlog (or a batch past them: the hop
    stops after the batch in hand), as its own consumer group."""
    settings = ComputeSettings(
        common=CommonSettings(topic_prefix=prefix), job=JOB, engine=engine,
        min_batch_records=batch, max_batch_records=batch, max_batch_ms=batch_ms, port=0, metrics_port=0,
    )
    loops, server, _engine = build(settings)  # Spark: the session is the warm one (getOrCreate)
    loop = loops[0]
    run_id = uuid.uuid4().hex[:6]
    loop.group_id = f"{loop.group_id}-{run_id}"  # every run reads the backlog from its start
    loop.transactional_id = f"{loop.transactional_id}-{run_id}"
    assert isinstance(loop.stage, MapStage), loop.stage
    timed = TimedStage(loop.stage)
    loop.stage = timed
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(loop.run()), name=f"map-{engine.value}-{batch}")
    thread.start()
    try:
        while loop.stats.records_in < records and thread.is_alive():
            time.sleep(0.02)
    finally:
        loop.stop()
        thread.join(120)
        server.stop(0)
    assert exit_codes == [0], f"map hop ended with {exit_codes}: {loop.stats.last_error}"
    assert loop.stats.dead_letters == 0 and loop.stats.aborted == 0, loop.stats
    commits = timed.commits
    assert len(commits) >= 2, f"{len(commits)} transactions: too few records ({records:,}) for batches of {batch:,}"
    elapsed = commits[-1][0] - commits[0][0]
    timed_records = sum(count for _t, count in commits[1:])
    latencies = list(loop.stats.batch_seconds)[1:]
    return {
        "records": loop.stats.records_in,
        "batches": len(commits),
        "mean_batch_records": loop.stats.records_in / len(commits),
        "records_per_s": timed_records / max(elapsed, 1e-9),
        "latency_p50_ms": percentile(latencies, 0.5) * 1000,
        "latency_p99_ms": percentile(latencies, 0.99) * 1000,
        "process_p50_ms": percentile(timed.process_seconds[1:], 0.5) * 1000,
        "engine_p50_ms": timed.inner.counts.job_seconds(0.5) * 1000,
    }


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return format(low, fmt) if len(values) == 1 or format(low, fmt) == format(high, fmt) else f"{low:{fmt}}–{high:{fmt}}"


def main(
    records: int = typer.Option(200_000, help="Records per run (each engine x batch size)."),
    min_batches: int = typer.Option(5, help="At least this many batches per run: big batches read more records."),
    batch_sizes: list[int] = typer.Option([1_000, 10_000, 100_000], "--batch-size", help="Records per micro-batch."),
    repeats: int = typer.Option(1, help="Runs of every engine x batch size, interleaved."),
    users: int = typer.Option(1_000, help="Distinct users (group keys) in the backlog."),
    batch_ms: int = typer.Option(5_000, help="max_batch_ms: long enough for a poll to fill a batch from the backlog."),
    warm_up_s: float = typer.Option(60.0, help="Seconds of Spark jobs run before anything is timed."),
    output: Path = typer.Option(Path("bench/results/compute_throughput.json")),
) -> None:
    logging.basicConfig(level=logging.WARNING)
    stack.up(create_topics=False)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    per_run = {size: max(records, size * min_batches) for size in batch_sizes}
    backlog = max(per_run.values())
    spark: Engine | None = None
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        with console.status(f"producing {backlog:,} envelopes ({users:,} users) to {common.topic('dedup.records')}"):
            produce_usersum(common, backlog, users)
        with console.status("starting Spark and warming it up"):
            started = time.monotonic()
            settings = ComputeSettings(common=common, job=JOB, engine=EngineName.SPARK)
            spark = make_engine(settings, load_job(JOB))
            session_s = time.monotonic() - started
            warm = _warm_up(spark, batch_sizes, users, warm_up_s)
        console.print(
            f"spark: session in {session_s:.1f}s, {len(warm)} warm-up jobs in {sum(warm):.1f}s "
            f"(the first {warm[0]:.2f}s)"
        )
        for repeat in range(repeats):
            for size in batch_sizes:
                for engine in ENGINES:
                    name = f"{engine.value} {size}"
                    with console.status(f"run {repeat + 1}/{repeats}, {name}: {per_run[size]:,} records"):
                        result = _run(prefix, engine, size, per_run[size], batch_ms)
                    runs.setdefault(name, []).append(result)
                    console.print(
                        f"run {repeat + 1}/{repeats} {name:>13}: {result['records_per_s']:>9,.0f} records/s, "
                        f"p50 {result['latency_p50_ms']:,.0f} ms, p99 {result['latency_p99_ms']:,.0f} ms, "
                        f"engine p50 {result['engine_p50_ms']:,.0f} ms ({result['batches']} batches "
                        f"of {result['mean_batch_records']:,.0f})"
                    )
    finally:
        if spark is not None:
            spark.close()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

    table = Table(title=f"compute map hop, job {JOB} ({users:,} users): Spark vs plain pandas in the same loop")
    for column in ("batch", "engine", "records/s", "p50 ms", "p99 ms", "engine p50 ms", "batches", "spark/pandas"):
        table.add_column(column, justify="right")
    summary: dict[str, float] = {}
    for size in batch_sizes:
        pandas_runs, spark_runs = runs[f"pandas {size}"], runs[f"spark {size}"]
        ratios = [s["records_per_s"] / p["records_per_s"] for s, p in zip(spark_runs, pandas_runs, strict=True)]
        summary[f"ratio_{size}"] = statistics.median(ratios)
        for engine_name, engine_runs in (("pandas", pandas_runs), ("spark", spark_runs)):
            summary[f"{engine_name}_{size}_records_per_s"] = _median(engine_runs, "records_per_s")
            table.add_row(
                f"{size:,}", engine_name,
                _span([r["records_per_s"] for r in engine_runs], ",.0f"),
                _span([r["latency_p50_ms"] for r in engine_runs], ",.0f"),
                _span([r["latency_p99_ms"] for r in engine_runs], ",.0f"),
                _span([r["engine_p50_ms"] for r in engine_runs], ",.1f"),
                str(int(_median(engine_runs, "batches"))),
                "" if engine_name == "pandas" else _span(ratios, ".2f") + "×",
            )
    console.print(table)
    target = summary.get("ratio_10000")
    if target is not None:
        verdict = "met" if target >= 0.5 else "NOT met"
        console.print(f"target (spark ≥ 0.5× pandas at 10k-record batches): {verdict}, {target:.2f}×")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(
        {"job": JOB, "users": users, "records_per_run": per_run, "warm_up_seconds": warm, "runs": runs, "summary": summary},
        indent=2,
    ))
    console.print(f"wrote {output}")


if __name__ == "__main__":
    typer.run(main)
