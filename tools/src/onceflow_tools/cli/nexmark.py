"""`onceflow nexmark`: push a Nexmark stream into a running ingest (Tilt's workload resource,
or any pipeline you started yourself), with concurrent clients and progress."""

from __future__ import annotations

import time
from collections import Counter

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from onceflow.admin import fleet
from onceflow_tools.workloads import nexmark
from onceflow_tools.workloads.senders import Senders

console = Console()


def send(
    address: str | None = typer.Option(
        None, "--address", "-a", show_default=False,
        help="Ingest's gRPC address (default: ingest in ONCEFLOW_SERVICES_CONFIG or infra/services.toml).",
    ),
    events: int = typer.Option(20_000, help="Events to generate (1 person : 3 auctions : 46 bids)."),
    rate: int = typer.Option(10_000, help="Events per second of event time."),
    max_delay_ms: int = typer.Option(2_000, help="How late an event may arrive (ms of event time)."),
    batch: int = typer.Option(500, help="Records per Ingest call."),
    clients: int = typer.Option(4, help="Concurrent clients."),
    resend_ratio: float = typer.Option(0.0, help="Share of batches a client sends twice (the gate drops the copies)."),
    seed: int = typer.Option(1, help="Workload seed: the same seed gives the same events."),
    run: str = typer.Option("", help="record_id prefix (default: nexmark-<time>, so each run is new to the gate)."),
) -> None:
    """Generate Nexmark events and send them through ingest; exit 1 if a client gives up."""
    if events < 1 or rate < 1 or max_delay_ms < 0 or batch < 1 or clients < 1 or not 0.0 <= resend_ratio <= 1.0:
        raise typer.BadParameter("events, rate, batch and clients must be positive; max-delay-ms >= 0; resend-ratio in [0, 1]")
    address = address or fleet.default_address("ingest")
    config = nexmark.NexmarkConfig(events=events, rate=rate, max_delay_ms=max_delay_ms, seed=seed)
    arrivals = nexmark.arrival_order(config)
    run = run or f"nexmark-{int(time.time())}"
    senders = Senders(address, nexmark.ingest_records(arrivals, run), batch, clients, resend_ratio, seed)
    kinds = Counter(e.kind for e in arrivals)
    console.print(f"{run}: {kinds['person']:,} persons, {kinds['auction']:,} auctions, {kinds['bid']:,} bids -> {address}")
    started = time.monotonic()
    with Progress(
        TextColumn("[bold]nexmark"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("send", total=events, rate="")
        senders.start()
        while senders.running():
            done = senders.acknowledged
            progress.update(task, completed=done, rate=f"{done / max(time.monotonic() - started, 1e-6):,.0f} rec/s")
            time.sleep(0.25)
        progress.update(task, completed=senders.acknowledged)
    if senders.error is not None:
        console.print(f"[red]FAILED[/]: a client gave up: {senders.error}")
        raise typer.Exit(1)
    console.print(f"sent {senders.acknowledged:,} events ({len(senders.sent_again):,} sent twice, {senders.retries:,} transport retries)")
