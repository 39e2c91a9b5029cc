"""`onceflow batch`: run a compute job over a bounded file as one Spark job, and get the table
the streaming pipeline converges to for the same records.

The job runs in the compute service's package (onceflow-compute, with PySpark), imported only
when the command runs: the rest of the CLI never starts a JVM or imports pyspark."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from onceflow.config import runtime_dir
from onceflow_tools.cli.options import full_width_console
from onceflow_tools.jvm_output import stderr_to

if TYPE_CHECKING:
    from onceflow_compute.batch import BatchResult  # the compute package (and pyspark) only when a job runs

console = full_width_console()  # a pipe or a file gets every column whole


class InputFormat(str, enum.Enum):
    JSONL = "jsonl"
    PARQUET = "parquet"


def batch(
    input_path: Annotated[
        Path,
        typer.Option(
            "--input", "-i", exists=True, readable=True, show_default=False,
            help="JSON lines (one payload object a line) or Parquet.",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", show_default=False, help="Write the final table here, as JSON lines in key order."),
    ] = None,
    input_format: Annotated[
        InputFormat | None,
        typer.Option(
            "--format", "-f", show_default=False, help="The input's format (default: by suffix, .parquet or else jsonl)."
        ),
    ] = None,
    spark_master: Annotated[
        str, typer.Option("--spark-master", "--master", envvar="ONCEFLOW_COMPUTE_SPARK_MASTER", help="Spark master URL.")
    ] = "local[*]",
    limit: Annotated[int, typer.Option(help="Rows to show when there is no --output.")] = 20,
    job: Annotated[
        str | None,
        typer.Option("--job", "-j", show_default=False, help="A built-in job (wordcount, usersum, bigspend) or a module defining `job`."),
    ] = None,
    sql_file: Annotated[
        Path | None,
        typer.Option(
            "--sql", exists=True, dir_okay=False, readable=True, show_default=False,
            help="A SQL job's .sql file, run as ONE Spark SQL query over the input: the reference answer (docs/sql.md).",
        ),
    ] = None,
) -> None:
    """Run JOB over a bounded input as one Spark batch job: the final result table, as streaming gives it."""
    if (job is None) == (sql_file is None):
        console.print("[red]give one of --job and --sql[/]")
        raise typer.Exit(2)
    try:
        from onceflow_compute import batch as compute_batch
        from onceflow_compute.jobs import load_job
    except ImportError as exc:
        console.print(
            f"[red]onceflow batch needs the compute package (onceflow-compute, with PySpark)[/]: {escape(str(exc))}\n"
            "Install it into this environment, e.g. `uv sync --all-packages`."
        )
        raise typer.Exit(2) from None

    if sql_file is not None:
        result = _sql_batch(sql_file, input_path, input_format.value if input_format is not None else None, spark_master)
        _show(result, output, limit)
        return
    assert job is not None
    try:
        compute_job = load_job(job)
    except ValueError as exc:
        console.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    fmt = input_format.value if input_format is not None else None
    spark_log = runtime_dir() / "logs" / "batch-spark.log"
    with console.status(f"running {compute_job.name} over {input_path.name} on Spark {spark_master} ..."):
        try:
            with stderr_to(spark_log):  # the JVM's warnings and notices: kept, not printed
                result = compute_batch.run_batch(job, input_path, input_format=fmt, spark_master=spark_master)  # by name: shipped
        except compute_batch.JobFailed as exc:
            console.print(f"[red]{escape(str(exc))}[/] (Spark's own log: {escape(str(spark_log))})")
            raise typer.Exit(1) from None
        except (OSError, ValueError) as exc:  # an unreadable file; Arrow's errors are ValueErrors
            console.print(f"[red]{escape(str(input_path))}[/]: {escape(str(exc))}")
            raise typer.Exit(2) from None

    _show(result, output, limit)


def _show(result: BatchResult, output: Path | None, limit: int) -> None:
    if output is not None:
        with output.open("wb") as out:
            result.write_jsonl(out)
    summary(result, output)
    if output is None:
        rows(result, limit)


def _sql_batch(sql_file: Path, input_path: Path, fmt: str | None, spark_master: str) -> BatchResult:
    """The SQL text as one Spark SQL query over the input (the SQL job's reference answer)."""
    from onceflow_compute import batch as compute_batch
    from onceflow_compute.sql import SqlError
    from onceflow_compute.sql.batch import run_sql_batch

    spark_log = runtime_dir() / "logs" / "batch-spark.log"
    with console.status(f"running {sql_file.name} over {input_path.name} on Spark {spark_master} ..."), stderr_to(spark_log):
        engine = compute_batch.spark_engine(spark_master)
        try:
            assert engine.session is not None
            return run_sql_batch(sql_file, input_path, engine.session, fmt)
        except SqlError as exc:
            console.print(f"[red]{escape(str(sql_file))}: {escape(str(exc))}[/]")
            raise typer.Exit(2) from None
        except compute_batch.JobFailed as exc:
            console.print(f"[red]{escape(str(exc))}[/] (Spark's own log: {escape(str(spark_log))})")
            raise typer.Exit(1) from None
        except (OSError, ValueError) as exc:
            console.print(f"[red]{escape(str(input_path))}[/]: {escape(str(exc))}")
            raise typer.Exit(2) from None
        finally:
            engine.close()


def letters(result: BatchResult) -> None:
    """The records the job would dead-letter, each with its line (or row) and reason."""
    if not result.examples:
        return
    table = Table(title=f"dead letters: the first {len(result.examples)} of {result.dropped:,}, with their reasons")
    table.add_column("line")
    table.add_column("reason", overflow="fold")
    for line, reason in result.examples:
        table.add_row(str(line), escape(reason))
    console.print(table)


def summary(result: BatchResult, output: Path | None) -> None:
    table = Table(show_header=False, box=None)
    table.add_row("job", f"{result.job} ({result.kind})")
    table.add_row("rows in", f"{result.rows_in:,}")
    table.add_row("dropped", f"[yellow]{result.dropped:,}[/]" if result.dropped else "0")
    for reason, count in result.reasons.most_common():
        table.add_row("", f"{count:,} {escape(reason)}")
    table.add_row("result rows", f"{len(result.table):,}")
    table.add_row("seconds", f"{result.seconds:.2f} (read {result.read_seconds:.2f}, job {result.job_seconds:.2f})")
    if output is not None:
        table.add_row("output", escape(str(output)))
    console.print(table)


def rows(result: BatchResult, limit: int) -> None:
    shown = result.sorted_rows()[: max(limit, 0)]
    if not shown:
        return
    columns = list(dict.fromkeys(name for row in shown for name in row))
    table = Table(title=f"first {len(shown)} of {len(result.table):,} rows, by key")
    for column in columns:
        table.add_column(column)
    for row in shown:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    console.print(table)


def _cell(value: object) -> str:
    return escape(json.dumps(value) if isinstance(value, (dict, list)) or value is None else str(value))
