"""Ingest throughput and commit latency, side by side with a plain confluent-kafka
transactional producer writing the same records in the same run.

For each payload size (100 B, 1 KiB) and batch size (1, 100, 1000 records per call/transaction)
it measures records/s and p50/p99 latency of one call and reports ingest/plain ratios:

- plain: one Python process with the records in hand: encode each envelope, then
  begin → produce → commit, one transaction at a time (a transactional producer cannot overlap
  transactions). The ceiling.
- ingest x1: one client calling Ingest sequentially (each call returns after its commit). This
  isolates ingest's own cost per call: gRPC, validation, envelope, group-commit hand-off.
- ingest x4: four concurrent clients, as a server is used. Group commit lets one transaction
  carry several calls and overlaps one call's CPU work with another's commit.

Everything runs on the same machine as the broker, clients included, so the ratios (not the
absolute numbers) are what to compare across machines.

Run: make bench   (or .venv/bin/python bench/ingest_throughput.py --help)
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow_client import IngestClient
from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings, repo_root
from onceflow.topology import Topic
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port

console = Console(width=200)
CLIENTS = (1, 4)



def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _records(run: str, count: int, payload: int) -> list[IngestRecord]:
    body = b"x" * payload
    return [IngestRecord(record_id=f"{run}-{i}".encode(), key=f"k{i % 100}".encode(), payload=body) for i in range(count)]


def _bench_ingest(address: str, records: list[IngestRecord], batch: int, clients: int) -> tuple[float, list[float]]:
    calls = [records[offset : offset + batch] for offset in range(0, len(records), batch)]
    latencies: list[float] = []

    def send(share: list[list[IngestRecord]]) -> None:
        with IngestClient(address) as client:
            for call in share:
                t0 = time.perf_counter()
                client.ingest(call)
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=send, args=(calls[i::clients],)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(records) / (time.perf_counter() - started), latencies


def _bench_plain(common: CommonSettings, topic: str, records: list[IngestRecord], batch: int) -> tuple[float, list[float]]:
    producer = Producer({
        "bootstrap.servers": common.kafka_bootstrap,
        "transactional.id": f"bench-plain-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": common.transaction_timeout_ms,
        "linger.ms": 5,
    })
    producer.init_transactions(30)
    latencies = []
    started = time.perf_counter()
    for offset in range(0, len(records), batch):
        t0 = time.perf_counter()
        producer.begin_transaction()
        now = now_ms()
        for r in records[offset : offset + batch]:
            # The same bytes ingest writes: an envelope per record, keyed by record_id.
            envelope = Envelope(
                record_id=r.record_id.decode(), root_id=new_id(), edge_id=new_id(), attempt=1,
                event_time_ms=now, ingest_time_ms=now, key=r.key, payload=r.payload,
            )
            producer.produce(topic, encode_envelope(envelope), key=r.record_id)
        producer.commit_transaction(30)
        latencies.append(time.perf_counter() - t0)
    return len(records) / (time.perf_counter() - started), latencies


def main(
    seconds: float = typer.Option(4.0, help="Target duration of each measurement."),
    output: Path = typer.Option(Path("bench/results/ingest_throughput.json"), help="JSON results."),
) -> None:
    stack.up(create_topics=False)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    topic = common.topic(Topic.INGEST_RECORDS)
    port = free_port()
    ingest = ServiceProcess(
        "ingest", "onceflow_ingest",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_INGEST_PORT": str(port), "ONCEFLOW_INGEST_METRICS_PORT": "0",
         "ONCEFLOW_INGEST_INSTANCE": "bench", "ONCEFLOW_INGEST_ACKING": "false", "ONCEFLOW_INGEST_MAX_PAYLOAD_BYTES": str(900 * 1024)},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    ).start()
    rows = []
    address = f"127.0.0.1:{port}"
    try:
        ingest.wait_healthy(address)
        with IngestClient(address) as client:
            client.ingest(_records("warmup", 100, 100))
        for payload in (100, 1024):
            for batch in (1, 100, 1000):
                # Size each run from a quick probe so every cell takes about `seconds`.
                probe_rate, _ = _bench_plain(common, topic, _records(f"probe-{payload}-{batch}", batch * 3, payload), batch)
                count = max(batch * 8, int(probe_rate * seconds) // (batch * 4) * batch * 4)
                run = uuid.uuid4().hex[:8]
                plain_rate, plain_lat = _bench_plain(common, topic, _records(f"p{run}", count, payload), batch)
                row = {"payload_bytes": payload, "batch": batch, "records": count, "plain_rps": plain_rate,
                       "plain_p50_ms": _percentile(plain_lat, 50) * 1000, "plain_p99_ms": _percentile(plain_lat, 99) * 1000}
                for clients in CLIENTS:
                    rate, lat = _bench_ingest(address, _records(f"i{clients}{run}", count, payload), batch, clients)
                    row[f"ingest_x{clients}_rps"] = rate
                    row[f"ingest_x{clients}_ratio"] = rate / plain_rate
                    row[f"ingest_x{clients}_p50_ms"] = _percentile(lat, 50) * 1000
                    row[f"ingest_x{clients}_p99_ms"] = _percentile(lat, 99) * 1000
                rows.append(row)
                console.print(
                    f"payload {payload:>5} B, batch {batch:>4}: plain {plain_rate:>9,.0f} rec/s; "
                    + "; ".join(f"ingest x{c} {row[f'ingest_x{c}_rps']:>9,.0f} ({row[f'ingest_x{c}_ratio']:.2f})" for c in CLIENTS)
                )
    finally:
        ingest.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

    table = Table(title="ingest vs plain transactional producer (same run, same broker); latency = one call")
    for column in ("payload", "batch", "plain rec/s", "plain p50/p99 ms",
                   *(h for c in CLIENTS for h in (f"ingest x{c} rec/s", "ratio", "p50/p99 ms"))):
        table.add_column(column, justify="right")
    for r in rows:
        cells = [f"{r['payload_bytes']} B", str(r["batch"]), f"{r['plain_rps']:,.0f}", f"{r['plain_p50_ms']:.1f} / {r['plain_p99_ms']:.1f}"]
        for c in CLIENTS:
            cells += [f"{r[f'ingest_x{c}_rps']:,.0f}", f"{r[f'ingest_x{c}_ratio']:.2f}",
                      f"{r[f'ingest_x{c}_p50_ms']:.1f} / {r[f'ingest_x{c}_p99_ms']:.1f}"]
        table.add_row(*cells)
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"rows": rows, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    console.print(f"results: {output}")


if __name__ == "__main__":
    typer.run(main)
