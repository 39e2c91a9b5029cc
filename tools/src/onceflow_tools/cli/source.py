"""`onceflow source kafka`: run the Kafka source (services/source) in the foreground on a topic
of yours, with a progress line every two seconds. The rest of its settings come from the
environment (ONCEFLOW_SOURCE_*, ONCEFLOW_KAFKA_BOOTSTRAP, ONCEFLOW_TOPIC_PREFIX ...)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from onceflow import logs
from onceflow.service_main import EXIT_USAGE
from onceflow_source.config import SourceSettings
from onceflow.topology import Topic
from onceflow_source.service import SourceRefused, build, check_source, read_origin, record_id_form
from onceflow_tools.cli.foreground import run_with_progress

app = typer.Typer(no_args_is_help=True, help="Bring your own data: copy an existing topic into the pipeline.")
console = Console()


@app.command("kafka")
def kafka(
    topic: str = typer.Option(..., "--topic", "-t", help="The topic to copy (as named on the cluster; no prefix added)."),
    bootstrap: str = typer.Option(
        "", help="The topic's cluster; default the pipeline's. On another, its positions go to source.offsets, in the transaction."
    ),
    id_field: str = typer.Option(
        "", "--id-field",
        help="JSON field of the value holding the record_id (default: kafka://<cluster id>/<topic>/<topic id>/<partition>/<offset>).",
    ),
    stream: str = typer.Option("", "--stream", help="The stream the records belong to (default: the default stream); it must exist."),
    instance: str = typer.Option("", help="Instance name, stable across restarts (default ONCEFLOW_SOURCE_INSTANCE)."),
    port: int = typer.Option(-1, help="gRPC port (Admin, health); default ONCEFLOW_SOURCE_PORT (15056), 0 picks one."),
    metrics_port: int = typer.Option(-1, help="Prometheus port; default ONCEFLOW_SOURCE_METRICS_PORT (9106), 0: none."),
) -> None:
    """Copy TOPIC into ingest.records exactly once until Ctrl-C; unmappable records go to source.dlq."""
    given = {"bootstrap": bootstrap, "id_field": id_field, "stream": stream, "instance": instance, "port": port, "metrics_port": metrics_port}
    # Only the options given: the rest come from ONCEFLOW_SOURCE_*; pydantic validates both alike.
    overrides: dict[str, Any] = {"topic": topic, **{name: value for name, value in given.items() if value not in ("", -1)}}
    settings = SourceSettings(**overrides)
    logs.setup("source", settings.instance, "WARNING")  # the progress line, not the service's info log
    try:
        external = check_source(settings)
    except SourceRefused as exc:
        console.print(f"[red]refused:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    try:
        origin = read_origin(settings, external)
    except SourceRefused as exc:
        console.print(f"[red]refused:[/red] {exc}")
        raise typer.Exit(EXIT_USAGE) from None
    loop, server, stage = build(settings, external, origin)
    ids = record_id_form(settings, origin)
    console.print(f"copying {topic} -> {settings.common.topic(Topic.INGEST_RECORDS)} (record_id: {ids}); Ctrl-C stops")

    def progress() -> str:
        lag = sum(p.lag for p in loop.stats.partitions)
        return (f"copied {stage.counts.copied:,}  dead letters {stage.counts.dead_lettered:,}  "
                f"transactions {loop.stats.committed:,} (aborted {loop.stats.aborted})  lag {lag:,}  {loop.state.value}")

    def summary() -> str:
        return f"copied {stage.counts.copied:,}, dead letters {stage.counts.dead_lettered:,}"

    run_with_progress(console, loop, server, settings.metrics_port, settings.host, progress, summary)
