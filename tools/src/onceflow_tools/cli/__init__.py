"""The single CLI entry point: ``onceflow`` (also ``python -m onceflow_tools``)."""

from __future__ import annotations

import typer

from onceflow_tools.infra import secure
from onceflow_tools.cli import admin, batch, bench, console, demo, dlq, health, infra, job, nexmark, producer, query, sink, source, sql, stream, topology, verify

app = typer.Typer(no_args_is_help=True, help="onceflow: exactly-once stream processing.")
app.add_typer(infra.app, name="infra")
app.add_typer(admin.app, name="admin")
app.add_typer(query.app, name="query")
app.add_typer(source.app, name="source")
app.add_typer(sink.app, name="sink")
app.add_typer(stream.app, name="stream")
app.add_typer(producer.app, name="producer")
app.add_typer(dlq.app, name="dlq")
app.add_typer(job.app, name="job")
app.add_typer(sql.app, name="sql")  # lazy like batch: pyspark only when it runs
app.command("demo")(demo.demo)
app.command("health")(health.health)
app.command("nexmark")(nexmark.send)
app.command("verify")(verify.verify)
app.command("bench")(bench.bench)
app.command("console")(console.console)
app.command("topology")(topology.topology)
# Lazy: imports the compute package (and pyspark) only when it runs.
app.command("batch")(batch.batch)


@app.callback()
def _reach_the_secure_stack() -> None:
    """With ONCEFLOW_SECURE=1 every command reaches the secure stack with the settings
    `onceflow infra up --secure` printed, where the user has not set them (docs/admin.md)."""
    if secure.enabled():
        secure.apply_client_env()


def main() -> None:
    app()
