"""`onceflow sql`: SQL jobs (docs/sql.md). `explain FILE` prints the job a .sql file becomes.

Spark analyses the query, so the compute package (and pyspark) is imported only when a command
runs: the rest of the CLI never starts a JVM."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from onceflow.config import runtime_dir
from onceflow_tools.cli.options import full_width_console
from onceflow_tools.jvm_output import stderr_to

app = typer.Typer(no_args_is_help=True, help="SQL jobs: a .sql file of CREATE TABLE and one query (docs/sql.md).")
console = full_width_console()


@app.command("explain")
def explain(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The .sql file.")],
) -> None:
    """Print the job FILE becomes: its kind, key, the row-level part run in Spark, the aggregates and
    their combiners, the state it keeps, and whether its result table is updating or append-only."""
    try:
        from onceflow_compute import sql
        from onceflow_compute.sql.explain import explain as explained
    except ImportError as exc:
        console.print(f"[red]onceflow sql needs the compute package (onceflow-compute, with PySpark)[/]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    with console.status(f"analysing {file.name} with Spark ..."), stderr_to(runtime_dir() / "logs" / "sql-spark.log"):
        try:
            sql_job = sql.load(file)
        except sql.SqlError as exc:
            console.print(f"[red]{escape(str(file))}: {escape(str(exc))}[/]")
            raise typer.Exit(2) from None
    console.print(escape(explained(sql_job)), highlight=False)
