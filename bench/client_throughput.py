"""onceflow-client's cost over raw gRPC, in the same run against the same ingest.

For each batch size (100 and 1000 records per call), with 4 calls in flight:

- raw sync: grpc's generated stub, one thread per call in flight, prebuilt IngestRequests;
- IngestClient: the same records as IngestRecords through the client (retries armed, none taken);
- raw aio: grpc.aio's stub, 4 coroutines, prebuilt IngestRequests;
- AsyncIngestClient: the same through the asyncio client; and once more with dicts instead of
  protobufs (the client builds each IngestRecord, and JSON-encodes the payload).

Each is run three times, interleaved, and the median is reported with its ratio to the raw call of
its kind. The clients' target: at least 0.9x raw. Ingest runs without acking, so the calls wait
for their commit only.

Run: .venv/bin/python bench/client_throughput.py   (also part of `make bench`)
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import typer
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings, repo_root
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord
from onceflow_client import AsyncIngestClient, IngestClient
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port

console = Console(width=160)
IN_FLIGHT = 4
REPEATS = 3


Calls = list[list[IngestRecord]]
T = TypeVar("T")


def _records(run: str, count: int) -> list[IngestRecord]:
    return [
        IngestRecord(record_id=f"{run}-{i}".encode(), key=f"u{i % 100}".encode(), payload=b'{"user":"u1","amount":5}')
        for i in range(count)
    ]


def _as_dicts(calls: Calls) -> list[list[dict[str, Any]]]:
    """The same records as an application may hold them: dicts, the payload a JSON object."""
    return [
        [{"record_id": r.record_id.decode(), "key": r.key.decode(), "payload": json.loads(r.payload)} for r in call]
        for call in calls
    ]


def _threads(calls: Sequence[T], send: Callable[[T], object]) -> float:
    def worker(share: Sequence[T]) -> None:
        for call in share:
            send(call)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(calls[i::IN_FLIGHT],)) for i in range(IN_FLIGHT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


async def _coroutines(calls: Sequence[T], send: Callable[[T], Awaitable[object]]) -> float:
    async def worker(share: Sequence[T]) -> None:
        for call in share:
            await send(call)

    started = time.perf_counter()
    await asyncio.gather(*(worker(calls[i::IN_FLIGHT]) for i in range(IN_FLIGHT)))
    return time.perf_counter() - started


def _split(records: list[IngestRecord], batch: int) -> Calls:
    return [records[i:i + batch] for i in range(0, len(records), batch)]


def _raw_sync(address: str, calls: Calls) -> float:
    requests = [ingest_pb2.IngestRequest(records=call) for call in calls]
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        return _threads(requests, lambda request: stub.Ingest(request, timeout=60))


def _client_sync(address: str, calls: Calls) -> float:
    with IngestClient(address) as client:
        return _threads(calls, client.ingest)


def _raw_aio(address: str, calls: Calls) -> float:
    async def run() -> float:
        requests = [ingest_pb2.IngestRequest(records=call) for call in calls]
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ingest_pb2_grpc.IngestStub(channel)
            return await _coroutines(requests, lambda request: stub.Ingest(request, timeout=60))

    return asyncio.run(run())


def _client_aio(address: str, calls: Sequence[Sequence[IngestRecord | dict[str, Any]]]) -> float:
    async def run() -> float:
        async with AsyncIngestClient(address) as client:
            return await _coroutines(calls, client.ingest)

    return asyncio.run(run())


def main(
    records: int = typer.Option(40_000, help="Records per measurement."),
    output: Path = typer.Option(Path("bench/results/client_throughput.json"), help="JSON results."),
) -> None:
    stack.up(create_topics=False)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    port = free_port()
    address = f"127.0.0.1:{port}"
    ingest = ServiceProcess(
        "ingest", "onceflow_ingest",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_INGEST_PORT": str(port), "ONCEFLOW_INGEST_METRICS_PORT": "0",
         "ONCEFLOW_INGEST_INSTANCE": "bench", "ONCEFLOW_INGEST_ACKING": "false"},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    ).start()
    kinds: dict[str, Callable[[str, Calls], float]] = {
        "raw sync": _raw_sync, "IngestClient": _client_sync, "raw aio": _raw_aio, "AsyncIngestClient": _client_aio,
        # The dicts are made before the clock starts: what is timed is the client building each record.
        "AsyncIngestClient (dicts)": lambda address, calls: _client_aio(address, _as_dicts(calls)),
    }
    results: list[dict[str, Any]] = []
    try:
        ingest.wait_healthy(address)
        _raw_sync(address, _split(_records("warmup", 2000), 100))
        for batch in (100, 1000):
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for repeat in range(REPEATS):
                for kind, run in kinds.items():
                    tag = f"{uuid.uuid4().hex[:6]}-{repeat}"
                    times[kind].append(run(address, _split(_records(tag, records), batch)))
            rates = {kind: records / statistics.median(elapsed) for kind, elapsed in times.items()}
            row: dict[str, Any] = {"batch": batch, "in_flight": IN_FLIGHT, "records": records, "rates": rates}
            row["ratios"] = {
                "IngestClient / raw sync": rates["IngestClient"] / rates["raw sync"],
                "AsyncIngestClient / raw aio": rates["AsyncIngestClient"] / rates["raw aio"],
                "AsyncIngestClient (dicts) / raw aio": rates["AsyncIngestClient (dicts)"] / rates["raw aio"],
                "AsyncIngestClient / IngestClient": rates["AsyncIngestClient"] / rates["IngestClient"],
            }
            results.append(row)
            console.print(f"batch {batch}: " + "; ".join(f"{k} {v:,.0f} rec/s" for k, v in rates.items()))
    finally:
        ingest.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

    table = Table(title=f"onceflow-client vs raw gRPC, {IN_FLIGHT} calls in flight, median of {REPEATS} interleaved runs")
    table.add_column("batch", justify="right")
    for kind in kinds:
        table.add_column(f"{kind} rec/s", justify="right")
    for ratio in results[0]["ratios"]:
        table.add_column(ratio, justify="right")
    for row in results:
        table.add_row(str(row["batch"]), *(f"{v:,.0f}" for v in row["rates"].values()), *(f"{v:.2f}" for v in row["ratios"].values()))
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"rows": results, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2))
    console.print(f"results: {output}")


if __name__ == "__main__":
    typer.run(main)
