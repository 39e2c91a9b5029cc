"""`onceflow demo`: the main job, end to end on real parts.

Start Kafka and Redis, then the whole pipeline: ingest (acking on), the acker, the dedup gate,
a compute worker (PySpark, the per-user sum job) and the sink. Push a generated workload of
payments through ingest with concurrent clients, some of which retry batches they already sent
(as a client does after a lost reply); halfway through, kill -9 the compute worker and restart
it (the supervisor's job). Then account for every record: ingest.records holds every accepted
record (duplicates only from client retries), dedup.records holds each record_id exactly once,
and the per-user totals the sink serves from Redis equal the totals computed here from the
records generated, each counted once."""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
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
from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow.v1.ingest_pb2 import IngestRecord

console = Console()
JOB = "usersum"



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
    users: int = typer.Option(1000, help="Distinct users (result rows)."),
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
        ("dedup", "onceflow_dedup", {"ONCEFLOW_DEDUP_INSTANCE": "demo"}),
        ("compute", "onceflow_compute", {"ONCEFLOW_COMPUTE_INSTANCE": "demo", "ONCEFLOW_COMPUTE_JOB": JOB}),
        ("sink", "onceflow_sink", {"ONCEFLOW_SINK_INSTANCE": "demo"}),
        ("ingest", "onceflow_ingest", {"ONCEFLOW_INGEST_INSTANCE": "demo"}),
    ):
        port = free_port()
        prefix = f"ONCEFLOW_{name.upper()}_"
        env |= {f"{prefix}PORT": str(port), f"{prefix}METRICS_PORT": "0"}
        services.append(ServiceProcess(name, module, env, log_dir, cwd=repo_root()))
        addresses[name] = f"127.0.0.1:{port}"
    address = addresses["ingest"]
    by_name = {service.name: service for service in services}
    try:
        for service in services:
            service.start()
            service.wait_healthy(addresses[service.name], timeout_s=120)
            console.print(f"{service.name}: [green]serving[/] on {addresses[service.name]} (log {service.log_path})")
        run_id = f"demo-{int(time.time())}"
        rng = random.Random(seed)
        payments = [(f"{run_id}-user-{rng.randrange(users)}", rng.randrange(1, 1000)) for _ in range(records)]
        all_batches = [
            [
                IngestRecord(
                    record_id=f"{run_id}-{i}".encode(),
                    key=payments[i][0].encode(),
                    payload=json.dumps({"user": payments[i][0], "amount": payments[i][1]}).encode(),
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
            killed = False
            while any(s.is_alive() for s in senders):
                done = sum(s.acknowledged for s in senders)
                if not killed and done >= records // 2:
                    # The fault the demo proves itself against: a worker dies mid-batch.
                    by_name["compute"].kill9()
                    by_name["compute"].start()
                    killed = True
                    progress.console.print("compute: [red]kill -9[/] at half the workload, restarted")
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
        expected_rows = _expected_totals(payments)
        with console.status("waiting for compute and the sink to apply every record ..."):
            rows = _wait_for_table(addresses["sink"], run_id, expected_rows, timeout_s=300)
        wrong = {user for user in expected_rows if rows.get(user) != expected_rows[user]}
        extra = set(rows) - set(expected_rows)
        results_hanging = inspect.hanging_transactions(
            common, [common.topic(t) for t in ("compute.partials", "compute.results")]
        )
        table = Table(title=f"the {JOB} table in Redis (via the sink's Query API)", show_header=False)
        for name, value in [
            ("users", f"{len(expected_rows):,}"),
            ("rows served", f"{len(rows):,}"),
            ("rows equal to the exact answer", f"{len(expected_rows) - len(wrong):,}"),
            ("rows wrong or missing", f"{len(wrong):,}"),
            ("unexpected rows", f"{len(extra):,}"),
            ("records counted", f"{sum(r['count'] for r in rows.values()):,} of {records:,}"),
            ("hanging transactions", str(sum(len(p) for p in results_hanging.values()))),
        ]:
            table.add_row(name, value)
        console.print(table)
        if wrong or extra or results_hanging:
            for user in sorted(wrong)[:5]:
                console.print(f"  {user}: expected {expected_rows[user]}, got {rows.get(user)}")
            raise typer.Exit(_fail("the result table differs from the exact answer"))
        console.print(
            "[green]ok[/]: every accepted record is in ingest.records (duplicates only from client "
            "re-sends), dedup.records holds each record_id exactly once, and every per-user total in "
            "Redis counts each record exactly once, through a kill -9 of the compute worker."
        )
    finally:
        for service in reversed(services):
            try:
                code = service.terminate() if service.alive() else service.proc.returncode if service.proc else None
                console.print(f"{service.name} stopped (exit {code})")
            except AssertionError as exc:  # ignored SIGTERM: killed; the others must still stop
                console.print(f"[red]{service.name}[/]: {exc}")
            finally:
                service.ensure_dead()
        console.print("infra keeps running: `onceflow infra down` stops it")


def _expected_totals(payments: list[tuple[str, int]]) -> dict[str, dict[str, object]]:
    rows: dict[str, dict[str, object]] = {}
    for user, amount in payments:
        row = rows.setdefault(user, {"user": user, "total": 0, "count": 0, "smallest": amount, "largest": amount})
        row["total"] += amount  # type: ignore[operator]
        row["count"] += 1  # type: ignore[operator]
        row["smallest"] = min(row["smallest"], amount)  # type: ignore[type-var]
        row["largest"] = max(row["largest"], amount)  # type: ignore[type-var]
    return rows


def _wait_for_table(address: str, run_id: str, expected: dict[str, dict[str, object]], timeout_s: float) -> dict[str, dict]:
    """The run's rows as the sink serves them, once they stop changing or match."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, dict] = {}
    with grpc.insecure_channel(address) as channel:
        query = sink_pb2_grpc.QueryStub(channel)
        while True:
            reply = query.Scan(sink_pb2.ScanRowsRequest(job=JOB, prefix=f"{run_id}-", limit=10_000), timeout=10)
            rows = {row.key: json.loads(row.value) for row in reply.rows}
            if rows == expected or time.monotonic() > deadline:
                return rows
            last = rows
            time.sleep(1.0)
    return last


def _fail(message: str) -> int:
    console.print(f"[red]FAILED[/]: {message}")
    return 1
