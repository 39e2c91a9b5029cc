"""`onceflow sink kafka`: run a Kafka output (services/sink, `onceflow_sink.kafka_output`) in the
foreground: one job's result table written to a topic of yours as a changelog stream, exactly
once, with a progress line every two seconds. The rest of its settings come from the environment
(ONCEFLOW_SINK_KAFKA_*, ONCEFLOW_KAFKA_BOOTSTRAP, ONCEFLOW_TOPIC_PREFIX ...)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from onceflow import logs
from onceflow.service_main import EXIT_USAGE
from onceflow_sink.kafka_output import NAME, OutputRefused, build, check, describe
from onceflow_sink.kafka_output_config import KafkaOutputSettings
from onceflow_tools.cli.foreground import run_with_progress

app = typer.Typer(no_args_is_help=True, help="Results where you keep your data: a job's table into a Kafka topic.")
console = Console()


@app.command("kafka")
def kafka(
    job: str = typer.Option(..., "--job", "-j", help="The job (or version, `orders@2`) whose result table is written."),
    topic: str = typer.Option(..., "--topic", "-t", help="The output topic, as named on its cluster (no prefix added); created compacted if missing."),
    format: str = typer.Option("json", "--format", help="How rows are written: json (the only format for now)."),
    bootstrap: str = typer.Option(
        "", help="The output topic's cluster; default the pipeline's. On another, positions go to sink.kafka.offsets there, in the transaction."
    ),
    instance: str = typer.Option("", help="Instance name in logs and Admin (default ONCEFLOW_SINK_KAFKA_INSTANCE)."),
    port: int = typer.Option(-1, help="gRPC port (Admin, health); default ONCEFLOW_SINK_KAFKA_PORT (0 picks one)."),
    metrics_port: int = typer.Option(-1, help="Prometheus port; default ONCEFLOW_SINK_KAFKA_METRICS_PORT (0: none)."),
) -> None:
    """Write JOB's changes to TOPIC exactly once until Ctrl-C: rows as JSON, tombstones for retractions."""
    given = {"bootstrap": bootstrap, "instance": instance, "port": port, "metrics_port": metrics_port}
    # Only the options given: the rest come from ONCEFLOW_SINK_KAFKA_*; pydantic validates both alike.
    overrides: dict[str, Any] = {"job": job, "topic": topic, "format": format,
                                 **{name: value for name, value in given.items() if value not in ("", -1)}}
    try:
        settings = KafkaOutputSettings(**overrides)
    except ValueError as exc:
        console.print(f"[red]refused:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    logs.setup(NAME, settings.instance, "WARNING")  # the progress line, not the service's info log
    try:
        clusters = check(settings)
    except OutputRefused as exc:
        console.print(f"[red]refused:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    loop, server, stage = build(settings, clusters)
    console.print(f"{describe(settings, clusters, loop.transactional_id)}; Ctrl-C stops")

    def progress() -> str:
        c = stage.counts
        lag = sum(p.lag for p in loop.stats.partitions)
        return (f"rows {c.upserts:,}  tombstones {c.tombstones:,}  dead letters {c.dead_lettered:,}  "
                f"transactions {loop.stats.committed:,} (aborted {loop.stats.aborted})  lag {lag:,}  {loop.state.value}")

    def summary() -> str:
        c = stage.counts
        return f"rows {c.upserts:,}, tombstones {c.tombstones:,}, dead letters {c.dead_lettered:,}"

    run_with_progress(console, loop, server, settings.metrics_port, settings.host, progress, summary)
