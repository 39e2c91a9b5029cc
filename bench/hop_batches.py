"""How each hop batched while the pipeline ran flat out, per guarantee, from the services' own
Prometheus metrics.

Each guarantee gets a fresh pipeline (ingest -> gate -> compute ``usersum`` -> sink, acker on),
warmed up, then pushed ``--records`` records as fast as ingest takes them (the saturation run of
``onceflow bench``). The metrics of every service are scraped before and after, and the
difference is reported per hop: transactions, records per transaction, time per transaction
(``onceflow_batch_records``, ``onceflow_commit_seconds``) and the map hop's Spark time per job
(``onceflow_compute_job_seconds``). A keyed aggregation's map hop emits one partial per key per
batch, so its batch count sets how much the merge hop and the sink carry. Also every process's
CPU time over the run, per record and per kind of process (``onceflow_tools.bench.cpu``): on a
machine where all of them share the cores, that is what sets the rate.

Run: .venv/bin/python bench/hop_batches.py [--records 100000] [--guarantee exactly_once --guarantee at_least_once] [--compute KEY=VALUE]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from onceflow_tools.bench import cpu, histograms
from onceflow_tools.bench.pipeline import GUARANTEES, PipelineOptions, PipelineRun, completion_rate, compute_settings
from onceflow_tools.infra import stack
from onceflow_tools.process import free_port

console = Console(stderr=True)

SERVICES = ("ingest", "dedup", "compute", "sink", "acker")
HISTOGRAMS = ("onceflow_batch_records", "onceflow_commit_seconds", "onceflow_compute_job_seconds")


def _measure(
    guarantee: str, records: int, compute: tuple[tuple[str, str], ...], log_dir: Path
) -> tuple[float, float, histograms.Samples, cpu.Usage]:
    run = PipelineRun(guarantee, PipelineOptions(log_dir=log_dir, compute=compute), console.log)
    ports = {service: free_port() for service in SERVICES}
    for service, port in ports.items():
        run.supervisor.settings.setdefault(service, {})["METRICS_PORT"] = str(port)
    with run:
        run.send("warm:", run.options.warm_up_records, 0)
        before, ticks, started = histograms.scrape(ports, HISTOGRAMS), cpu.snapshot(), time.monotonic()
        console.log(f"{guarantee}: {records:,} records as fast as ingest takes them")
        times, _latencies = run.send("sat:", records, 0)
        wall = time.monotonic() - started
        used = cpu.usage(ticks, cpu.snapshot(), wall, bench="hop_batches")
        after = histograms.scrape(ports, HISTOGRAMS)
    delta, reset = histograms.difference(before, after)
    if reset:
        console.log(f"[red]{guarantee}: counters went back (a service restarted?): {reset}; their rows are left out")
    return completion_rate(times), records / wall, delta, used


def main(
    records: int = typer.Option(100_000, help="Records pushed through each pipeline."),
    guarantee: list[str] = typer.Option(list(GUARANTEES), help="exactly_once and/or at_least_once (repeatable)."),
    compute: list[str] = typer.Option([], help="A compute setting, KEY=VALUE without the ONCEFLOW_COMPUTE_ prefix (repeatable)."),
) -> None:
    if unknown := [g for g in guarantee if g not in GUARANTEES]:
        raise typer.BadParameter(f"{unknown}: each one of {', '.join(GUARANTEES)}")
    try:
        settings = compute_settings(compute)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    stack.up()
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-batches-"))
    console.log(f"service logs in {log_dir}")
    results = {g: _measure(g, records, settings, log_dir) for g in guarantee}

    table = Table(title=f"{records:,} records flat out; per hop: transactions × mean records, mean seconds each")
    table.add_column("figure")
    for g in guarantee:
        table.add_column(g, justify="right")
    table.add_row("completion rate, middle 80% (records/s)", *(f"{results[g][0]:,.0f}" for g in guarantee))
    table.add_row("records ÷ wall time, send to last tree (records/s)", *(f"{results[g][1]:,.0f}" for g in guarantee))
    hops = sorted({hop for g in guarantee for (name, hop) in results[g][2] if name == "onceflow_batch_records"})
    for hop in hops:
        cells = []
        for g in guarantee:
            samples = results[g][2]
            total, count = samples.get(("onceflow_batch_records", hop), (0.0, 0.0))
            seconds, commits = samples.get(("onceflow_commit_seconds", hop), (0.0, 0.0))
            cells.append(f"{count:,.0f} × {total / count:,.0f}, {seconds / commits:.3f} s" if count and commits else "-")
        table.add_row(hop, *cells)
    jobs = sorted({hop for g in guarantee for (name, hop) in results[g][2] if name == "onceflow_compute_job_seconds"})
    for job in jobs:
        cells = []
        for g in guarantee:
            seconds, count = results[g][2].get(("onceflow_compute_job_seconds", job), (0.0, 0.0))
            cells.append(f"{count:,.0f} jobs, {seconds / count:.3f} s" if count else "-")
        table.add_row(f"Spark jobs ({job})", *cells)
    # CPU per record: on a machine where every process shares two cores, the rate is the cores
    # divided by this. The totals count the pipeline's processes only: not the bench's clients,
    # nor whatever else ran on the machine.
    kinds = sorted({k for g in guarantee for k in results[g][3].seconds}, key=lambda k: -results[guarantee[0]][3].seconds.get(k, 0.0))
    per_record = {g: {k: 1e6 * s / records for k, s in results[g][3].seconds.items()} for g in guarantee}
    for kind in kinds:
        if max(per_record[g].get(kind, 0.0) for g in guarantee) >= 1:
            table.add_row(f"CPU µs per record: {kind}", *(f"{per_record[g].get(kind, 0.0):,.0f}" for g in guarantee))
    used = {g: results[g][3] for g in guarantee}
    table.add_row(
        "CPU µs per record: the pipeline (services, broker, Spark, Redis)",
        *(f"{1e6 * used[g].pipeline_seconds() / records:,.0f}" for g in guarantee),
    )
    table.add_row(
        "the pipeline's CPU, % of one core over the run",
        *(f"{100 * used[g].pipeline_seconds() / used[g].elapsed_s:,.0f}" for g in guarantee),
    )
    Console().print(table)


if __name__ == "__main__":
    typer.run(main)
