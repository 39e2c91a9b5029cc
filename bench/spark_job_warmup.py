"""How the map hop's Spark job speeds up as its driver's JVM runs more jobs: one-record
``usersum`` jobs through the worker's own engine (``onceflow_compute.service.make_engine``, the
shipped settings), idle between jobs as on a quiet pipeline, p50 per window of jobs, then one
20,000-row job for scale. The JVM compiles its planner and executor code as it runs them, so
how warm it is depends on how many jobs it has run, not how many records: a burst of records is
a few big jobs. docs/performance.md, "Latency to visibility".

Run: .venv/bin/python bench/spark_job_warmup.py [--jobs 250] [--window 25] [--gap-ms 300]
"""

from __future__ import annotations

import json
import statistics
import time

import pyarrow as pa
import typer
from rich.console import Console

from onceflow_compute import jobs
from onceflow_compute.api import METADATA_COLUMNS, Aggregation
from onceflow_compute.config import ComputeSettings, EngineName
from onceflow_compute.service import make_engine

console = Console(stderr=True)


def _table(index: int, rows: int, schema: pa.Schema) -> pa.Table:
    """``rows`` rows of one user, with the metadata columns every map-hop frame carries."""
    values = {"user": [f"u{index}"] * rows, "amount": [index] * rows}
    for column in METADATA_COLUMNS:
        values[column.name] = [f"r{index}" if pa.types.is_string(column.type) else 1] * rows
    return pa.table(values, schema=pa.schema([*schema, *METADATA_COLUMNS]))


def main(
    job_count: int = typer.Option(250, "--jobs", min=1, help="One-record jobs run."),
    window: int = typer.Option(25, min=1, help="Jobs per reported p50."),
    gap_ms: int = typer.Option(300, min=0, help="Idle time between jobs."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
) -> None:
    job = jobs.load_job("usersum")
    assert isinstance(job, Aggregation), job
    engine = make_engine(ComputeSettings(job="usersum", engine=EngineName.SPARK), job)
    windows: list[dict[str, float]] = []
    times: list[float] = []
    started = time.monotonic()
    try:
        for index in range(job_count):
            time.sleep(gap_ms / 1000)
            table = _table(index, 1, job.schema)
            began = time.perf_counter()
            engine.partials(job, table)
            times.append((time.perf_counter() - began) * 1000)
            if len(times) % window == 0 or index == job_count - 1:
                recent = times[-window:]
                windows.append({"first_job": len(times) - len(recent) + 1, "last_job": len(times), "p50_ms": statistics.median(recent)})
                console.print(
                    f"jobs {windows[-1]['first_job']:4.0f}-{len(times):4d} ({time.monotonic() - started:4.0f} s in): "
                    f"p50 {windows[-1]['p50_ms']:.0f} ms"
                )
        big = _table(0, 20_000, job.schema)
        began = time.perf_counter()
        for _ in range(10):
            engine.partials(job, big)
        big_ms = (time.perf_counter() - began) * 100
        console.print(f"then a 20,000-row job: {big_ms:.0f} ms on average over 10")
    finally:
        engine.close()
    if as_json:
        print(json.dumps({"windows": windows, "job_20000_rows_ms": big_ms}, indent=2))


if __name__ == "__main__":
    typer.run(main)
