"""Nexmark q0, q1, q5 and q7 on the compute worker: throughput (events/s) over a backlog, and
latency at a sustainable rate, all in one run, as ratios to q0 (pass-through: what the pipeline
itself costs) measured in the same run.

Per query, on a fresh topic prefix (so no query reads another's partials):

1. **Throughput.** A backlog of ``--events`` Nexmark events (event time spread at
   ``--event-rate`` events/s, so windows fill and fire) is written to ``dedup.records``. The
   worker (``onceflow_compute.service.build``: map and merge hop, one shared warm SparkSession)
   runs both hops in threads until both consumer groups have consumed everything. Throughput =
   events / (first map commit → both hops done).
2. **Latency at a sustainable rate.** Events are then sent at ``--load`` × that throughput for
   ``--latency-s`` seconds, with event and ingest time = the send time. Latency per event =
   the commit of the map transaction that consumed it − its ingest time: from then on its effect
   is durable in Kafka (a transform's result is readable; an aggregation's partial is in
   ``compute.partials.<job>``). The merge hop's own transaction time (poll → commit, p99) is reported
   next to it. A windowed query's rows fire when the watermark passes the window's end, so its
   result latency is that plus the window: not what is measured here.

Spark is warmed up on the first query's backlog before anything is timed.

``--sql`` runs each query's SQL twin too (``sql:nexmark_qN``, jobs/sql/, issue 41) right after
it, in the same run, and reports the twin's throughput and p99 as ratios to the Python job's.

Run: .venv/bin/python bench/nexmark.py [--events N] [--load 0.5] [--latency-s 20] [--sql]
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from compute_throughput import percentile
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.codec import decode_envelope, encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings
from onceflow.kafka.inspect import consumed_everything
from onceflow.topology import Topic
from onceflow.state import MemoryStore
from onceflow.txn.batch import Batch, Stage
from onceflow.v1.envelope_pb2 import Envelope
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.workloads import nexmark

from onceflow_compute.config import ComputeSettings
from onceflow_compute.service import build

console = Console(width=160)
QUERIES = ["nexmark_q0", "nexmark_q1", "nexmark_q5", "nexmark_q7"]
BASELINE = "nexmark_q0"
# The Python jobs whose table a SQL job gives too (tests/test_dataflow.py proves it).
SQL_TWINS = {f"nexmark_q{n}": f"sql:nexmark_q{n}" for n in (0, 1, 2, 7)}


@dataclass
class LatencyStage:
    """The map stage, timed per record: commit time − the envelope's ingest time."""

    inner: Stage[MemoryStore]
    latencies_ms: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    recording: bool = False
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def __getattr__(self, name: str) -> Any:  # on_assign/on_revoke/on_rollback hooks
        return getattr(self.inner, name)

    def process(self, batch: Batch[MemoryStore]) -> None:
        self.inner.process(batch)
        ingested = [decode_envelope(r.value()).ingest_time_ms for r in batch.records] if self.recording else []

        def committed() -> None:
            self.commits.append(time.monotonic())
            at = now_ms()
            self.latencies_ms.extend(at - t for t in ingested)

        batch.after_commit.append(committed)


def _envelope(e: nexmark.Event, index: str, ingest_ms: int) -> bytes:
    return encode_envelope(
        Envelope(
            record_id=f"nx-{index}", root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=e.time_ms,
            ingest_time_ms=ingest_ms, key=e.key.encode(), payload=e.payload(),
        )
    )


def _producer(common: CommonSettings) -> Producer:
    return Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})


def _send(producer: Producer, topic: str, e: nexmark.Event, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key=e.key.encode())
            return
        except BufferError:
            producer.poll(0.05)


def _backlog(common: CommonSettings, events: int, event_rate: int) -> int:
    """``events`` Nexmark events, event time ending now; returns the last event time."""
    config = nexmark.NexmarkConfig(events=events, rate=event_rate, base_time_ms=now_ms() - events * 1000 // event_rate)
    producer, topic = _producer(common), common.topic(Topic.DEDUP_RECORDS)
    last = 0
    for e in nexmark.events(config):
        _send(producer, topic, e, _envelope(e, str(e.number), now_ms()))
        last = e.time_ms
    assert producer.flush(60) == 0
    return last


def _paced(common: CommonSettings, rate: float, seconds: float, first: int, event_rate: int) -> int:
    """Events at ``rate`` per second for ``seconds``, event time = send time; returns how many."""
    config = nexmark.NexmarkConfig(events=first + int(rate * seconds) + 1, rate=event_rate)
    producer, topic = _producer(common), common.topic(Topic.DEDUP_RECORDS)
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            generated = nexmark.event(config, first + sent)
            at = now_ms()
            e = nexmark.Event(generated.number, generated.kind, at, at, {**generated.fields, "date_time": at})
            _send(producer, topic, e, _envelope(e, f"live-{e.number}", at))
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    assert producer.flush(60) == 0
    return sent


def _run_query(query: str, events: int, event_rate: int, load: float | None, latency_s: float) -> dict[str, Any]:
    prefix = f"nxb{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    try:
        with console.status(f"{query}: producing a backlog of {events:,} events"):
            _backlog(common, events, event_rate)
        settings = ComputeSettings(common=common, job=query, port=0, metrics_port=0)
        loops, server, _engine = build(settings)  # the warm SparkSession (getOrCreate)
        timed = LatencyStage(loops[0].stage)
        loops[0].stage = timed
        codes: list[int] = []
        threads = [threading.Thread(target=lambda loop=loop: codes.append(loop.run()), daemon=True) for loop in loops]
        groups = [(loop.group_id, loop.input_topic) for loop in loops]

        def drained() -> bool:
            return all(consumed_everything(common, group, topic) for group, topic in groups)

        try:
            started = time.monotonic()
            for thread in threads:
                thread.start()
            with console.status(f"{query}: the worker reads the backlog"):
                while not (loops[0].stats.records_in >= events and drained()):
                    time.sleep(0.25)
            done = time.monotonic()
            first_commit = timed.commits[0] if timed.commits else started
            throughput = events / max(done - first_commit, 1e-9)
            rate = (load or 0.5) * throughput
            merge_before = len(loops[-1].stats.batch_seconds) if len(loops) > 1 else 0
            timed.recording = True
            with console.status(f"{query}: {rate:,.0f} events/s for {latency_s:.0f}s"):
                sent = _paced(common, rate, latency_s, events, event_rate)
                deadline = time.monotonic() + 120
                while len(timed.latencies_ms) < sent and time.monotonic() < deadline:
                    time.sleep(0.25)
            merge_seconds = list(loops[-1].stats.batch_seconds)[merge_before:] if len(loops) > 1 else []
        finally:
            for loop in loops:
                loop.stop()
            for thread in threads:
                thread.join(120)
            server.stop(0)
        assert all(code == 0 for code in codes), f"{query}: a hop ended with {codes}"
        assert len(timed.latencies_ms) >= sent, f"{query}: {len(timed.latencies_ms)} of {sent} live events committed"
        latencies = timed.latencies_ms
        return {
            "query": query,
            "events": events,
            "events_per_s": throughput,
            "offered_per_s": rate,
            "live_events": sent,
            "latency_p50_ms": percentile(latencies, 0.5),
            "latency_p99_ms": percentile(latencies, 0.99),
            "merge_txn_p99_ms": percentile(merge_seconds, 0.99) * 1000 if merge_seconds else None,
        }
    finally:
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def main(
    events: int = typer.Option(50_000, help="Backlog events per query (throughput)."),
    event_rate: int = typer.Option(2_000, help="Event time of the backlog: events per second of event time."),
    load: float = typer.Option(0.5, help="Latency phase: offered rate as a share of the query's measured throughput."),
    latency_s: float = typer.Option(20.0, help="Latency phase: seconds of paced events."),
    queries: list[str] = typer.Option(QUERIES, "--query"),
    repeats: int = typer.Option(1, help="Runs of every query, interleaved."),
    sql: bool = typer.Option(False, "--sql", help="Each query's SQL twin too, right after it; ratios to the Python job's."),
    output: Path = typer.Option(Path("bench/results/nexmark.json")),
) -> None:
    logging.basicConfig(level=logging.WARNING)
    stack.up(create_topics=False)
    if BASELINE not in queries:
        queries = [BASELINE, *queries]
    twin_of = {SQL_TWINS[q]: q for q in queries if sql and q in SQL_TWINS}
    queries = [each for q in queries for each in ([q, SQL_TWINS[q]] if q in twin_of.values() else [q])]
    with console.status("starting Spark and warming it up (q0 over a backlog)"):
        _run_query(BASELINE, min(events, 20_000), event_rate, load, 5.0)
    runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(repeats):
        for query in queries:
            result = _run_query(query, events, event_rate, load, latency_s)
            runs.setdefault(query, []).append(result)
            console.print(
                f"run {repeat + 1}/{repeats} {query}: {result['events_per_s']:,.0f} events/s; at "
                f"{result['offered_per_s']:,.0f}/s p50 {result['latency_p50_ms']:,.0f} ms, p99 {result['latency_p99_ms']:,.0f} ms"
            )

    def median(query: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[query]))

    table = Table(title=f"Nexmark on one compute worker ({events:,} events per backlog, latency at {load:.0%} of throughput)")
    for column in ("query", "events/s", "× q0", "offered/s", "p50 ms", "p99 ms", "p99 × q0", "merge txn p99 ms", "SQL: events/s, p99 × Python"):
        table.add_column(column, justify="right")
    summary: dict[str, dict[str, float]] = {}
    for query in queries:
        throughput, p99 = median(query, "events_per_s"), median(query, "latency_p99_ms")
        summary[query] = {
            "events_per_s": throughput,
            "throughput_vs_q0": throughput / median(BASELINE, "events_per_s"),
            "latency_p50_ms": median(query, "latency_p50_ms"),
            "latency_p99_ms": p99,
            "p99_vs_q0": p99 / max(median(BASELINE, "latency_p99_ms"), 1e-9),
        }
        twin = twin_of.get(query)
        if twin is not None:
            summary[query]["throughput_vs_python"] = throughput / median(twin, "events_per_s")
            summary[query]["p99_vs_python"] = p99 / max(median(twin, "latency_p99_ms"), 1e-9)
        merge = [r["merge_txn_p99_ms"] for r in runs[query] if r["merge_txn_p99_ms"] is not None]
        table.add_row(
            query, f"{throughput:,.0f}", f"{summary[query]['throughput_vs_q0']:.2f}", f"{median(query, 'offered_per_s'):,.0f}",
            f"{summary[query]['latency_p50_ms']:,.0f}", f"{p99:,.0f}", f"{summary[query]['p99_vs_q0']:.2f}",
            f"{statistics.median(merge):,.0f}" if merge else "-",
            f"{summary[query]['throughput_vs_python']:.2f}, {summary[query]['p99_vs_python']:.2f}" if twin else "",
        )
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"events": events, "load": load, "runs": runs, "summary": summary}, indent=2))
    console.print(f"wrote {output}")


if __name__ == "__main__":
    typer.run(main)
