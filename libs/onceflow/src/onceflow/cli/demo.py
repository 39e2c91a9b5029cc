"""`onceflow demo`: the main job, end to end on real parts.

Today: start Kafka and Redis, then ingest (acking on), the acker and the dedup gate (the trees end
at the gate until compute lands). Push a generated workload through ingest with concurrent
clients, some of which retry batches they already sent (as a client does after a lost reply).
Then read the topics back read_committed and account for every record: ingest.records holds
every accepted record (duplicates only from client retries), and dedup.records holds each
record_id exactly once."""

from __future__ import annotations

import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from onceflow.client import IngestClient
from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings, repo_root
from onceflow.infra import stack
from onceflow.kafka import inspect
from onceflow.process import ServiceProcess, free_port
from onceflow.v1.ingest_pb2 import IngestRecord

console = Console()



class _Sender(threading.Thread):
    def __init__(self, address: str, batches: list[list[IngestRecord]], retry_ratio: float, seed: int, progress: Progress, task: int) -> None:
        super().__init__(daemon=True)
        self.client = IngestClient(address)
        self.batches = batches
        self.rng = random.Random(seed)
        self.retry_ratio = retry_ratio
        self.progress, self.task = progress, task
        self.sent_again: set[str] = set()
        self.acknowledged = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for batch in self.batches:
                self.client.ingest(batch)
                if self.rng.random() < self.retry_ratio:
                    # The reply was "lost": the client cannot tell, so it sends the same records again.
                    self.client.ingest(batch)
                    self.sent_again.update(r.record_id.decode() for r in batch)
                self.acknowledged += len(batch)
                self.progress.advance(self.task, len(batch))
        except BaseException as exc:  # noqa: BLE001 - reported by the command
            self.error = exc
        finally:
            self.client.close()


def demo(
    records: int = typer.Option(100_000, help="Records to generate."),
    batch: int = typer.Option(500, help="Records per Ingest call."),
    clients: int = typer.Option(4, help="Concurrent clients."),
    retry_ratio: float = typer.Option(0.05, help="Share of batches a client sends twice."),
    payload_bytes: int = typer.Option(100, help="Payload size."),
    seed: int = typer.Option(7, help="Workload seed."),
) -> None:
    """Start infra and ingest, push a workload with client retries, account for every record."""
    common = CommonSettings()
    console.rule("[bold]onceflow demo")
    with console.status("starting Kafka (KRaft) and Redis on 127.0.0.1 ..."):
        stack.up()
    console.print("infra: [green]up[/] (Kafka", common.kafka_bootstrap, "· Redis", common.redis_url + ")")

    topic = common.topic("ingest.records")
    gate_topic = common.topic("dedup.records")
    start = {p: lso for p, (lso, _hw) in inspect.end_offsets(common, topic).items()}
    gate_start = {p: lso for p, (lso, _hw) in inspect.end_offsets(common, gate_topic).items()}
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    services = []
    addresses = {}
    for name, module, env in (
        ("acker", "onceflow_acker", {"ONCEFLOW_ACKER_INSTANCE": "demo"}),
        # Nothing acks after the gate yet (compute will), so the trees end there.
        ("dedup", "onceflow_dedup", {"ONCEFLOW_DEDUP_INSTANCE": "demo", "ONCEFLOW_DEDUP_ACK_MODE": "terminal"}),
        ("ingest", "onceflow_ingest", {"ONCEFLOW_INGEST_INSTANCE": "demo"}),
    ):
        port = free_port()
        prefix = f"ONCEFLOW_{name.upper()}_"
        env |= {f"{prefix}PORT": str(port), f"{prefix}METRICS_PORT": "0"}
        services.append(ServiceProcess(name, module, env, log_dir, cwd=repo_root()))
        addresses[name] = f"127.0.0.1:{port}"
    address = addresses["ingest"]
    try:
        for service in services:
            service.start()
            service.wait_healthy(addresses[service.name])
            console.print(f"{service.name}: [green]serving[/] on {addresses[service.name]} (log {service.log_path})")
        run_id = f"demo-{int(time.time())}"
        rng = random.Random(seed)
        all_batches = [
            [
                IngestRecord(
                    record_id=f"{run_id}-{i}".encode(),
                    key=f"user-{rng.randrange(1000)}".encode(),
                    payload=rng.randbytes(payload_bytes),
                )
                for i in range(offset, min(offset + batch, records))
            ]
            for offset in range(0, records, batch)
        ]
        started = time.monotonic()
        with Progress(
            TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(), console=console,
        ) as progress:
            task = progress.add_task("ingest", total=records, rate="")
            senders = [
                _Sender(address, all_batches[i::clients], retry_ratio, seed + i, progress, task) for i in range(clients)
            ]
            for sender in senders:
                sender.start()
            while any(s.is_alive() for s in senders):
                done = sum(s.acknowledged for s in senders)
                progress.update(task, rate=f"{done / max(time.monotonic() - started, 1e-6):,.0f} rec/s")
                time.sleep(0.25)
        elapsed = time.monotonic() - started
        errors = [s.error for s in senders if s.error is not None]
        if errors:
            raise typer.Exit(_fail(f"a client failed: {errors[0]}"))
        sent_again = set().union(*(s.sent_again for s in senders))
        client_retries = sum(s.client.retries for s in senders)

        with console.status("reading ingest.records back (read_committed) ..."):
            committed = inspect.read_committed(common, topic, start=start)
        envelopes = [e for e in (decode_envelope(r.value) for r in committed) if e.record_id.startswith(run_id + "-")]
        # Attempt 1 is what clients sent; later attempts are ingest's replays of timed-out trees.
        seen = Counter(e.record_id for e in envelopes if e.attempt == 1)
        replays = sum(e.attempt > 1 for e in envelopes)
        expected = {f"{run_id}-{i}" for i in range(records)}
        missing = expected - set(seen)
        duplicated = {rid for rid, n in seen.items() if n > 1}
        unexplained = duplicated - sent_again
        hanging = inspect.hanging_transactions(common, [topic])

        table = Table(title="ingest.records, read_committed", show_header=False)
        for name, value in [
            ("records generated", f"{records:,}"),
            ("accepted by ingest", f"{sum(s.acknowledged for s in senders):,}"),
            ("batches re-sent by clients", f"{len(sent_again) // max(batch, 1):,} ({len(sent_again):,} records)"),
            ("transport retries", f"{client_retries:,}"),
            ("records read back", f"{sum(seen.values()):,}"),
            ("distinct record_ids", f"{len(seen):,}"),
            ("missing", f"{len(missing):,}"),
            ("duplicates (all from client re-sends)" if not unexplained else "duplicates", f"{len(duplicated):,}"),
            ("unexplained duplicates", f"{len(unexplained):,}"),
            ("hanging transactions", str(sum(len(p) for p in hanging.values()))),
            ("ingest throughput", f"{records / elapsed:,.0f} records/s ({elapsed:.1f}s)"),
        ]:
            table.add_row(name, value)
        console.print(table)
        if missing or unexplained or hanging:
            raise typer.Exit(_fail("records were lost, duplicated without a retry, or left hanging"))

        with console.status("waiting for the dedup gate to pass everything ..."):
            deadline = time.monotonic() + 300
            while not inspect.consumed_everything(common, common.topic("onceflow-dedup"), topic):
                if time.monotonic() > deadline:
                    raise typer.Exit(_fail("the dedup gate did not catch up within 300s"))
                time.sleep(1.0)
            passed = inspect.read_committed(common, gate_topic, start=gate_start)
        through = Counter(
            rid for rid in (decode_envelope(r.value).record_id for r in passed) if rid.startswith(run_id + "-")
        )
        gate_missing = expected - set(through)
        gate_duplicated = {rid for rid, n in through.items() if n > 1}
        gate_hanging = inspect.hanging_transactions(common, [gate_topic])
        table = Table(title="dedup.records, read_committed", show_header=False)
        for name, value in [
            ("copies that reached the gate", f"{len(envelopes):,} ({replays:,} of them ingest replays)"),
            ("dropped as duplicates", f"{len(envelopes) - sum(through.values()):,}"),
            ("records let through", f"{sum(through.values()):,}"),
            ("missing", f"{len(gate_missing):,}"),
            ("duplicated", f"{len(gate_duplicated):,}"),
            ("hanging transactions", str(sum(len(p) for p in gate_hanging.values()))),
        ]:
            table.add_row(name, value)
        console.print(table)
        if gate_missing or gate_duplicated or gate_hanging:
            raise typer.Exit(_fail("the dedup gate lost, duplicated or left hanging records"))
        console.print(
            "[green]ok[/]: every accepted record is in ingest.records (duplicates only from client "
            "re-sends), and dedup.records holds each record_id exactly once."
        )
    finally:
        for service in reversed(services):
            code = service.terminate() if service.alive() else service.proc.returncode if service.proc else None
            console.print(f"{service.name} stopped (exit {code})")
        console.print("infra keeps running: `onceflow infra down` stops it")


def _fail(message: str) -> int:
    console.print(f"[red]FAILED[/]: {message}")
    return 1
