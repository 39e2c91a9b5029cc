"""The Kafka source's rate against the bare transactional copier, in the same run on the same
broker and the same backlog (issue 22's target: at least 0.5x).

Both read a pre-filled topic of usersum JSON records keyed by user and commit their outputs and
offsets in one transaction per batch, with the shared loop's batch bounds. The copier
(`onceflow_tools.bench.copier`, `onceflow bench`'s ceiling for one hop) writes the records as
they are; the source maps each one (record_id, limits), wraps it in an envelope and, with
acking on, flushes inside the transaction to name each record's offset in its INIT, then writes
the INITs: the cost of being an exactly-once spout. Each contender is timed from its group's
first commit until it has committed the whole backlog (startup and group join not counted),
`REPEATS` times interleaved; the median is reported.

Run: .venv/bin/python bench/source_throughput.py [--records N]   (also part of `make bench`)
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from onceflow import topology
from onceflow.config import repo_root
from onceflow_source.config import SourceSettings
from onceflow_tools.bench import hops, workload
from onceflow_tools.bench.watch import BacklogRun, GroupWatch
from onceflow_tools.infra import stack
from onceflow_tools.process import free_port, pipeline_service

console = Console(width=160)
REPEATS = 3
TARGET = 0.5


def _source(options: hops.HopOptions, acking: bool) -> BacklogRun:
    with hops.namespace("src") as common:  # the same namespace the hop bench uses
        topic = common.topic(hops.PEER_INPUT)
        workload.write_backlog(common, topic, hops.peer_records(options, keyed_by_record_id=False))
        process = pipeline_service(
            "source", f"127.0.0.1:{free_port()}", common.topic_prefix, "bench", options.log_dir,
            log_name=f"source-acking-{acking}", TOPIC=topic, ACKING=str(acking).lower(),
        )
        group = SourceSettings(common=common, topic=topic).group_id_of(topology.SOURCE, job=topic)
        return hops.time_process(process, GroupWatch(common, group, topic), options.records)


def _copier(options: hops.HopOptions) -> BacklogRun:
    return hops.copier(options)


def main(
    records: int = typer.Option(50_000, help="Records per measurement."),
    output: Path = typer.Option(Path("bench/results/source_throughput.json"), help="JSON results."),
) -> None:
    stack.up(create_topics=False)
    options = hops.HopOptions(records=records, log_dir=Path(tempfile.mkdtemp(prefix="onceflow-bench-")))
    contenders = {
        "copier": lambda: _copier(options),
        "source (acking on)": lambda: _source(options, acking=True),
        "source (acking off)": lambda: _source(options, acking=False),
    }
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for repeat in range(REPEATS):
        for name, run in contenders.items():
            rate = run().records_per_s
            rates[name].append(rate)
            console.print(f"run {repeat + 1}/{REPEATS} {name}: {rate:,.0f} records/s")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    table = Table(title=f"Kafka source vs the transactional copier, {records:,} records, median of {REPEATS}")
    for column in ("contender", "records/s", "÷ copier", "runs"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for name, median in medians.items():
        table.add_row(name, f"{median:,.0f}", f"{median / medians['copier']:.2f}x",
                      ", ".join(f"{r:,.0f}" for r in rates[name]))
    console.print(table)
    ratio = medians["source (acking on)"] / medians["copier"]
    console.print(f"source (acking on) ÷ copier = {ratio:.2f}x (target ≥ {TARGET}x): {'met' if ratio >= TARGET else 'NOT met'}")
    path = repo_root() / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": records, "repeats": REPEATS, "rates": rates, "medians": medians,
                                "ratio_acking_on": ratio, "target": TARGET}, indent=2))
    console.print(f"written to {output}")


if __name__ == "__main__":
    typer.run(main)
