"""Ingest throughput and commit latency, side by side with a plain confluent-kafka
transactional producer writing the same records in the same run.

For each payload size (100 B, 1 KiB) and batch size (1, 100, 1000 records per call/transaction)
it measures records/s and p50/p99 latency of one call (ingest: the Ingest RPC, which returns
after the commit; plain: begin → produce → commit), and reports ingest/plain ratios. Both sides
run one sequential client, so the ratio isolates ingest's own cost (gRPC, validation, envelope,
group-commit hand-off) on top of the same Kafka transaction.

Run: make bench   (or .venv/bin/python bench/ingest_throughput.py --help)
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.client import IngestClient
from onceflow.codec import encode_envelope
from onceflow.config import CommonSettings, repo_root
from onceflow.infra import stack
from onceflow.infra.topics import delete_topics, ensure_topics
from onceflow.process import ServiceProcess
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord

console = Console()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _records(run: str, count: int, payload: int) -> list[IngestRecord]:
    body = b"x" * payload
    return [IngestRecord(record_id=f"{run}-{i}".encode(), key=f"k{i % 100}".encode(), payload=body) for i in range(count)]


def _bench_ingest(client: IngestClient, records: list[IngestRecord], batch: int) -> tuple[float, list[float]]:
    latencies = []
    started = time.perf_counter()
    for offset in range(0, len(records), batch):
        t0 = time.perf_counter()
        client.ingest(records[offset : offset + batch])
        latencies.append(time.perf_counter() - t0)
    return len(records) / (time.perf_counter() - started), latencies


def _bench_plain(common: CommonSettings, topic: str, records: list[IngestRecord], batch: int) -> tuple[float, list[float]]:
    producer = Producer({
        "bootstrap.servers": common.kafka_bootstrap,
        "transactional.id": f"bench-plain-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": common.transaction_timeout_ms,
        "linger.ms": 5,
    })
    producer.init_transactions(30)
    # The same bytes ingest writes: an envelope per record, keyed by record_id.
    values = [
        (r.record_id, encode_envelope(Envelope(record_id=r.record_id.decode(), root_id=1, edge_id=1, attempt=1, key=r.key, payload=r.payload)))
        for r in records
    ]
    latencies = []
    started = time.perf_counter()
    for offset in range(0, len(values), batch):
        t0 = time.perf_counter()
        producer.begin_transaction()
        for key, value in values[offset : offset + batch]:
            producer.produce(topic, value, key=key)
        producer.commit_transaction(30)
        latencies.append(time.perf_counter() - t0)
    return len(values) / (time.perf_counter() - started), latencies


def main(
    seconds: float = typer.Option(4.0, help="Target duration of each measurement."),
    output: Path = typer.Option(Path("bench/results/ingest_throughput.json"), help="JSON results."),
) -> None:
    stack.up(create_topics=False)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    topic = common.topic("ingest.records")
    port = _free_port()
    ingest = ServiceProcess(
        "ingest", "onceflow_ingest",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_INGEST_PORT": str(port), "ONCEFLOW_INGEST_METRICS_PORT": "0",
         "ONCEFLOW_INGEST_INSTANCE": "bench", "ONCEFLOW_INGEST_MAX_PAYLOAD_BYTES": str(900 * 1024)},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    ).start()
    rows = []
    try:
        ingest.wait_healthy(f"127.0.0.1:{port}")
        client = IngestClient(f"127.0.0.1:{port}")
        client.ingest(_records("warmup", 100, 100))
        for payload in (100, 1024):
            for batch in (1, 100, 1000):
                # Size each run from a quick probe so every cell takes about `seconds`.
                probe_rate, _ = _bench_plain(common, topic, _records(f"probe-{payload}-{batch}", batch * 3, payload), batch)
                count = max(batch * 5, int(probe_rate * seconds) // batch * batch)
                run = uuid.uuid4().hex[:8]
                plain_rate, plain_lat = _bench_plain(common, topic, _records(f"p{run}", count, payload), batch)
                ingest_rate, ingest_lat = _bench_ingest(client, _records(f"i{run}", count, payload), batch)
                row = {
                    "payload_bytes": payload, "batch": batch, "records": count,
                    "ingest_rps": ingest_rate, "plain_rps": plain_rate, "ratio": ingest_rate / plain_rate,
                    "ingest_p50_ms": _percentile(ingest_lat, 50) * 1000, "ingest_p99_ms": _percentile(ingest_lat, 99) * 1000,
                    "plain_p50_ms": _percentile(plain_lat, 50) * 1000, "plain_p99_ms": _percentile(plain_lat, 99) * 1000,
                }
                rows.append(row)
                console.print(f"payload {payload:>5} B, batch {batch:>4}: ingest {ingest_rate:>9,.0f} rec/s, "
                              f"plain {plain_rate:>9,.0f} rec/s, ratio {row['ratio']:.2f}")
        client.close()
    finally:
        ingest.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

    table = Table(title="ingest vs plain transactional producer (same run, same broker)")
    for column in ("payload", "batch", "ingest rec/s", "plain rec/s", "ratio", "ingest p50/p99 ms", "plain p50/p99 ms"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r['payload_bytes']} B", str(r["batch"]), f"{r['ingest_rps']:,.0f}", f"{r['plain_rps']:,.0f}", f"{r['ratio']:.2f}",
            f"{r['ingest_p50_ms']:.1f} / {r['ingest_p99_ms']:.1f}", f"{r['plain_p50_ms']:.1f} / {r['plain_p99_ms']:.1f}",
        )
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"rows": rows, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    console.print(f"results: {output}")


if __name__ == "__main__":
    typer.run(main)
