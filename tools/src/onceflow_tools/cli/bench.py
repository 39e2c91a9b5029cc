"""`onceflow bench`: the pipeline end to end in exactly-once and at-least-once mode over a sweep
of offered rates, and its dedup and compute hops against a bare transactional copier and Quix
Streams and Kafka Streams exactly-once apps on the same backlog, all in one run on this machine. Writes a table,
a JSON file and a latency-vs-throughput plot. Exit 0 once everything was measured, whether or
not the targets are met (it measures; docs/performance.md records what it found); 2 if a part
could not be measured (the rest is still reported)."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from onceflow_tools.bench import hops, pipeline
from onceflow_tools.bench.report import Report, print_tables, write
from onceflow_tools.infra import stack


def bench(
    records: int = typer.Option(200_000, help="Backlog per hop contender."),
    hop_warm_up: int = typer.Option(50_000, help="Records onceflow's hops consume before their backlog is timed."),
    saturation_records: int = typer.Option(150_000, help="Records pushed through the pipeline as fast as ingest takes them."),
    warm_up_records: int = typer.Option(20_000, help="Records through each fresh pipeline before anything is timed (Spark's JIT)."),
    fractions: str = typer.Option("0.25,0.5,0.75,1.0", help="Offered rates of the sweep, as fractions of the exactly-once sustainable rate."),
    step: float = typer.Option(15.0, help="Seconds each offered rate runs."),
    users: int = typer.Option(1_000, help="Distinct keys of the keyed count."),
    quix_commit_interval: float = typer.Option(1.0, help="Quix Streams' commit interval, seconds (its default is 5)."),
    kstreams_commit_interval: float = typer.Option(
        hops.KSTREAMS_DEFAULT_COMMIT_INTERVAL_S, help="Kafka Streams' commit.interval.ms, in seconds (its exactly_once_v2 default: 0.1)."
    ),
    parts: str = typer.Option("pipeline,hops", help="What to run: pipeline, hops, or both."),
    hop_names: str = typer.Option(
        ",".join(hops.HOPS), "--hops",
        help=f"Hop contenders: {', '.join(hops.HOPS)}. A peer may name its commit interval, to run at its default "
        "and tuned side by side: quix-dedup@5,quix-dedup@1 (Quix's default is 5 s, Kafka Streams' 0.1 s).",
    ),
    output: Path = typer.Option(Path("bench/results"), help="Folder for onceflow-bench.json and onceflow-bench.png."),
    profile: Path | None = typer.Option(
        None, help="Sample onceflow's hops with py-spy over their timed backlog: one flame graph per hop (<dir>/<hop>.svg).",
    ),
) -> None:
    """Throughput and latency of the pipeline against its at-least-once mode and its peers."""
    console = Console(width=max(Console().width, 110))
    logging.basicConfig(level=logging.WARNING)
    chosen = {p.strip() for p in parts.split(",") if p.strip()}
    if unknown := chosen - {"pipeline", "hops"}:
        raise typer.BadParameter(f"unknown parts {sorted(unknown)}: pipeline, hops")
    contenders = [h.strip() for h in hop_names.split(",") if h.strip()]
    for contender in contenders:
        try:
            hops.parse_contender(contender)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    try:
        shares = [float(f) for f in fractions.split(",") if f.strip()]
    except ValueError:
        raise typer.BadParameter(f"fractions must be numbers, got {fractions!r}") from None
    if not shares or any(not 0 < f <= 2 for f in shares):
        raise typer.BadParameter("each fraction must be in (0, 2]")

    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-bench-"))
    console.print(f"service logs in {log_dir}")
    stack.up()
    report = Report(hop_records=records)

    def note(text: str) -> None:
        console.log(text)

    def measure(part: str, run: Callable[[], None]) -> None:
        """One part; a failure is reported with the rest, not allowed to throw the rest away."""
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - any failure of a part is a finding of the run
            logging.getLogger(__name__).exception("%s failed", part)
            report.failures[part] = f"{type(exc).__name__}: {exc}"

    if "pipeline" in chosen:
        options = pipeline.PipelineOptions(
            saturation_records=saturation_records, warm_up_records=warm_up_records, step_s=step, users=users, log_dir=log_dir
        )

        def both_modes() -> None:
            eos = pipeline.run_mode("exactly_once", options, note, lambda sustainable: [f * sustainable for f in shares])
            report.modes[eos.guarantee] = eos
            # The same offered rates for both modes, so their curves share an x axis.
            alos = pipeline.run_mode("at_least_once", options, note, lambda _s: [f * eos.sustainable for f in shares])
            report.modes[alos.guarantee] = alos

        measure("pipeline", both_modes)
    if "hops" in chosen:
        hop_options = hops.HopOptions(
            records=records, warm_up_records=hop_warm_up, users=users, quix_commit_interval_s=quix_commit_interval,
            kstreams_commit_interval_s=kstreams_commit_interval, log_dir=log_dir, profile_dir=profile,
        )
        report.hop_transactions = {name: hops.describe_transaction(name, hop_options) for name in contenders}
        def warm_up() -> None:
            with console.status("warming the broker: untimed copier runs until its rate is steady"):
                report.broker_warm_up = hops.warm_broker(hop_options, note)

        measure("broker warm-up", warm_up)
        for name in contenders:
            def one(name: str = name) -> None:
                with console.status(f"{name}: {records:,} records"):
                    report.hops[name] = hops.run_hop(name, hop_options)
                note(f"{name}: {report.hops[name].records_per_s:,.0f} records/s")

            measure(name, one)
    print_tables(report, console)
    data, png = write(report, output)
    console.print(f"wrote {data}" + (f" and {png}" if png else ""))
    if report.failures:
        raise typer.Exit(2)
