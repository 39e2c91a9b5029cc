"""Latency under load, hop by hop, and where the machine's CPU goes.

The pipeline (ingest -> gate -> compute ``usersum`` -> sink, acker on) is warmed
up, then offered a fixed rate (by default 2,800 records/s, about half the sustainable rate of
``onceflow bench`` here) for a fixed time. One record in 50 is a probe, a user of its own: its
row shows in the result table exactly when it was applied (``onceflow_tools.bench.visibility``).
Exactly-once by default; ``--guarantee at_least_once`` runs its twin without transactions.

Reported per probe, from the Kafka CreateTime of each hop's output for that record (the gate's
envelope, the map hop's partial, the merge hop's result change, the acker's COMPLETED event)
minus the time ingest wrote it: where the latency accumulates. Also send -> visible and send ->
completed over the step, and each process's share of the CPU while the rate was offered.

Baseline, in the same run: the same pipeline with ``ONCEFLOW_COMPUTE_ENGINE=pandas`` (the
aggregation in the worker's own process, no Spark JVM), so the ratio shows what the Spark
engine costs at this rate on this machine.

Run: .venv/bin/python bench/load_latency.py [--rate 2800] [--seconds 20] [--guarantee exactly_once] [--compute KEY=VALUE] [--json]
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from confluent_kafka import Consumer, Message, TopicPartition
from rich.console import Console
from rich.table import Table

from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.kafka.clients import plain_config
from onceflow.topology import Topic, job_topic
from onceflow.v1.acker_pb2 import TreeEvent
from onceflow_tools.bench import cpu, workload
from onceflow_tools.bench.pipeline import GUARANTEES, PROBE_EVERY, PipelineOptions, PipelineRun, compute_settings, percentile
from onceflow_tools.infra import stack

console = Console(stderr=True)

ENGINES = {"pandas": (("ENGINE", "pandas"),), "spark": ()}
HOPS = ("gate", "map", "merge", "completed")


def _read_all(common: CommonSettings, topic: str) -> list[Message]:
    """Every committed record of ``topic``, from the start."""
    consumer = Consumer({
        **plain_config(common.kafka_bootstrap), "group.id": f"load-{uuid.uuid4().hex}", "isolation.level": "read_committed",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Message] = []
        ended: set[int] = set()
        while len(ended) < len(partitions):
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                ended.add(message.partition() or 0)
                continue
            records.append(message)
        return records
    finally:
        consumer.close()


def _first_stamps(common: CommonSettings, topic: str, probe_of: Callable[[Message], str | None]) -> dict[str, int]:
    stamps: dict[str, int] = {}
    for message in _read_all(common, topic):
        probe = probe_of(message)
        if probe is not None:
            stamps.setdefault(probe, message.timestamp()[1])
    return stamps


def _hop_latencies(common: CommonSettings, id_prefix: str) -> dict[str, list[float]]:
    """Per hop, each probe's output CreateTime minus its ingest CreateTime, ms."""
    users: dict[str, str] = {}  # record_id -> probe user
    written: dict[str, int] = {}
    for message in _read_all(common, common.topic(Topic.INGEST_RECORDS)):
        envelope = decode_envelope(message.value())
        if envelope.record_id.startswith(id_prefix) and envelope.key.startswith(b"probe:"):
            users[envelope.record_id] = envelope.key.decode()
            written[envelope.key.decode()] = message.timestamp()[1]

    def row_key(message: Message) -> str | None:
        user = (message.key() or b"").split(b"\x00")[-1].decode("utf-8", "replace")
        return user if user in written else None

    stamps = {
        "gate": _first_stamps(common, common.topic(Topic.DEDUP_RECORDS), lambda m: users.get(decode_envelope(m.value()).record_id)),
        "map": _first_stamps(common, common.topic(job_topic(Topic.COMPUTE_PARTIALS, workload.JOB)), row_key),
        "merge": _first_stamps(common, common.topic(Topic.COMPUTE_RESULTS), row_key),
        "completed": _first_stamps(
            common, common.topic(Topic.ACKER_EVENTS), lambda m: users.get(TreeEvent.FromString(m.value() or b"").origin.record_id)
        ),
    }
    return {hop: [float(stamps[hop][u] - t) for u, t in written.items() if u in stamps[hop]] for hop in HOPS}


def _measure(
    engine: str, guarantee: str, rate: float, seconds: float, log_dir: Path, compute: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    options = PipelineOptions(log_dir=log_dir, compute=ENGINES[engine] + compute)
    with PipelineRun(guarantee, options, console.log) as run:
        console.log(f"{engine}: warming up ({options.warm_up_records:,} records)")
        run.send("warm:", options.warm_up_records, 0)
        console.log(f"{engine}: offering {rate:,.0f} records/s for {seconds:.0f} s")
        before, started = cpu.snapshot(), time.monotonic()
        _times, completed = run.send("load:", int(rate * seconds), rate, probe_every=PROBE_EVERY)
        used = cpu.usage(before, cpu.snapshot(), time.monotonic() - started, bench="load_latency", min_process_percent=1)
        hops = _hop_latencies(run.common, "load:")
        visible = run.visible_latencies
    return {
        "engine": engine,
        "visible_p50_ms": percentile(visible, 50), "visible_p99_ms": percentile(visible, 99),
        "completed_p50_ms": percentile(completed, 50), "completed_p99_ms": percentile(completed, 99),
        "hops": {hop: {"p50": percentile(v, 50), "p99": percentile(v, 99), "probes": len(v)} for hop, v in hops.items() if v},
        "cpu_percent": used.percent(floor=0),
    }


def _hop_figure(hop: str, quantile: str) -> Callable[[dict[str, Any]], float]:
    return lambda result: float(result["hops"].get(hop, {}).get(quantile, float("nan")))


def _cpu_figure(label: str) -> Callable[[dict[str, Any]], float]:
    return lambda result: float(result["cpu_percent"].get(label, 0.0))


def main(
    rate: float = typer.Option(2800.0, help="Offered records/s."),
    seconds: float = typer.Option(20.0, help="How long the rate is offered."),
    guarantee: str = typer.Option("exactly_once", help="exactly_once, or at_least_once (the bench's test-only mode)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON too."),
    compute: list[str] = typer.Option(
        [], help="A compute setting for both engines, KEY=VALUE without the ONCEFLOW_COMPUTE_ prefix (repeatable)."
    ),
) -> None:
    if guarantee not in GUARANTEES:
        raise typer.BadParameter(f"{guarantee!r}: one of {', '.join(GUARANTEES)}")
    try:
        settings = compute_settings(compute)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if fixed := [key for key, _value in settings if key in ("ENGINE", "JOB")]:
        raise typer.BadParameter(f"--compute cannot set {fixed}: the bench runs both engines on its own job")
    stack.up()
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-load-"))
    console.log(f"service logs in {log_dir}")
    results = {engine: _measure(engine, guarantee, rate, seconds, log_dir, settings) for engine in ENGINES}
    table = Table(title=f"{guarantee} pipeline at {rate:,.0f} records/s for {seconds:.0f} s; per probe, ms after ingest wrote it")
    table.add_column("figure")
    for engine in ENGINES:
        table.add_column(engine, justify="right")
    table.add_column("spark ÷ pandas", justify="right")

    def row(name: str, get: Callable[[dict[str, Any]], float]) -> None:
        values = [get(results[engine]) for engine in ENGINES]
        table.add_row(name, *(f"{v:,.0f}" for v in values), f"{values[1] / values[0]:.2f}" if values[0] else "-")

    row("send -> visible p50", lambda r: r["visible_p50_ms"])
    row("send -> visible p99", lambda r: r["visible_p99_ms"])
    row("send -> completed p50", lambda r: r["completed_p50_ms"])
    row("send -> completed p99", lambda r: r["completed_p99_ms"])
    for hop in HOPS:
        for q in ("p50", "p99"):
            row(f"ingest -> {hop} {q}", _hop_figure(hop, q))
    spark_cpu: dict[str, float] = results["spark"]["cpu_percent"]
    labels = sorted({label for r in results.values() for label in r["cpu_percent"]}, key=lambda label: -spark_cpu.get(label, 0.0))
    for label in labels:
        row(f"CPU % {label}", _cpu_figure(label))
    row("CPU % all (of 100 per core)", lambda r: sum(r["cpu_percent"].values()))
    Console().print(table)
    if as_json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    typer.run(main)
