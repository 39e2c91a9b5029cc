"""`onceflow job ...`: a job's versions (docs/jobs.md#versions-and-bluegreen). A shell over
``onceflow_tools.jobs.lifecycle``, which does the work."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from confluent_kafka import KafkaException

from onceflow import streams
from onceflow.config import CommonSettings, runtime_dir
from onceflow.kafka.registry import ConcurrentChange, read_registry
from onceflow.topology import versioned
from onceflow_sink.versions import check_retirable, record_of
from onceflow_tools.cli import batch as batch_view
from onceflow_tools.cli.options import full_width_console
from onceflow_tools.jvm_output import stderr_to
from onceflow_tools.jobs import lifecycle
from onceflow_tools.jobs.lifecycle import EARLIEST, JobCommandError

app = typer.Typer(
    no_args_is_help=True,
    help="A job's versions: deploy one beside the live one, watch it catch up, promote it, retire the old one.",
)
console = full_width_console()

Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Module = Annotated[
    str | None, typer.Argument(help="A built-in job or a dotted module path defining `job` (or `sql`); or --sql FILE.", show_default=False)
]
SqlFile = Annotated[
    Path | None,
    typer.Option("--sql", exists=True, dir_okay=False, readable=True, show_default=False, help="A SQL job (docs/sql.md) instead of a module."),
]
Name = Annotated[str, typer.Argument(help="The job's name (as its module's `job` says).")]
VersionArg = Annotated[str, typer.Argument(help="The version: 2 (or v2).")]


@contextmanager
def _refusals() -> Iterator[None]:
    """A refused command prints why and exits 1; nothing changed."""
    try:
        yield
    except (JobCommandError, ConcurrentChange) as exc:
        console.print(f"[red]refused:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _start_text(start_from: str) -> str:
    return start_from if start_from == EARLIEST else _when(int(start_from))


def _quiet_spark(module: str) -> AbstractContextManager[object]:
    """Loading a SQL job starts Spark to analyse it: its JVM's chatter goes to a log, not the terminal."""
    return stderr_to(runtime_dir() / "logs" / "sql-spark.log") if module.startswith("sql:") else nullcontext()


def _job_spec(module: str | None, sql_file: Path | None) -> str:
    """What the workers load: the module, or ``sql:`` and the file's absolute path (a worker
    started elsewhere, or a reprocess later, must find the same file)."""
    if (module is None) == (sql_file is None):
        console.print("[red]refused:[/] name a job module or --sql FILE (one of the two)", highlight=False)
        raise typer.Exit(2)
    if sql_file is not None:
        return f"sql:{sql_file.resolve()}"
    assert module is not None
    if module.startswith("sql:") and module.endswith(".sql"):
        return f"sql:{Path(module.removeprefix('sql:')).resolve()}"
    return module


@app.command()
def deploy(
    module: Module = None,
    sql_file: SqlFile = None,
    version: Annotated[str | None, typer.Option("--version", help="Its version number (default: the next).", show_default=False)] = None,
    start_from: Annotated[
        str, typer.Option("--from", help="Where it reads dedup.records from: earliest, or a time (ISO-8601, or ms since the epoch).")
    ] = EARLIEST,
    partitions: Annotated[
        int, typer.Option("--partitions", min=0, max=1024, help="Partitions of its own topics (a rescale); 0: as topics.toml declares.")
    ] = 0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64, help="Compute workers to start here (up to its partitions).")] = 1,
    start: Annotated[
        bool, typer.Option("--start/--no-start", help="Start its workers on this machine; --no-start prints their settings instead.")
    ] = True,
) -> None:
    """Deploy a new version as a shadow: its own topics, groups and table, built from --from while
    the live version keeps serving."""
    common = CommonSettings()
    module = _job_spec(module, sql_file)
    with _refusals(), _quiet_spark(module):
        number = lifecycle.version_argument(version) if version else None
        deployed = lifecycle.deploy(common, module, number, start_from, partitions, workers, start)
    console.print(f"deployed {deployed.name} (shadow) from module {module}", highlight=False)
    for note in deployed.notes:
        console.print(f"  {note}", highlight=False)
    for worker in deployed.workers:
        console.print(f"  worker {worker.instance}: pid {worker.pid}, admin {worker.address}, log {worker.log}", highlight=False)
    if not start:
        console.print("  run its workers with these settings (and the pipeline's common ones; one instance name each):", highlight=False)
        for key, value in deployed.env.items():
            if key not in ("ONCEFLOW_COMPUTE_HOST", "ONCEFLOW_COMPUTE_PORT", "ONCEFLOW_COMPUTE_METRICS_PORT"):
                console.print(f"    {key}={value}", highlight=False)
    console.print(f"next: onceflow job status {deployed.job}, then onceflow job promote {deployed.job} {deployed.version.version}", highlight=False)


@app.command()
def check(
    sample: Annotated[
        Path, typer.Option("--sample", exists=True, readable=True, show_default=False, help="JSON lines (one payload a line) or Parquet.")
    ],
    module: Module = None,
    sql_file: SqlFile = None,
    limit: Annotated[int, typer.Option(help="Result rows to show.")] = 20,
    offline: Annotated[bool, typer.Option("--offline", help="Do not ask the pipeline (its stream, its live state).")] = False,
    spark_master: Annotated[
        str, typer.Option("--spark-master", envvar="ONCEFLOW_COMPUTE_SPARK_MASTER", help="Spark master URL.")
    ] = "local[*]",
) -> None:
    """The dry run before a deploy: load MODULE, say what it would read and whether the live
    version's state would carry over, then run it on the sample in batch mode and print its
    rows and the records it would dead-letter, each with its reason. Changes nothing."""
    from onceflow_compute import batch as compute_batch  # the compute package (and pyspark) only when it runs

    module = _job_spec(module, sql_file)
    with _refusals(), _quiet_spark(module):
        job = lifecycle.load_module(module)
    name, stream = job.name, streams.display(job.stream)
    console.print(f"job {name} ({job.kind}), reads stream {stream}", highlight=False)
    if not offline:
        try:
            for note in lifecycle.check_notes(CommonSettings(), job):
                console.print(f"  {note}", highlight=False)
        except KafkaException as exc:
            console.print(f"  the pipeline did not answer ({exc}): its stream and state not checked (--offline skips this)", highlight=False)
    spark_log = runtime_dir() / "logs" / "batch-spark.log"
    with console.status(f"running {name} over {sample.name} on Spark {spark_master} ..."), stderr_to(spark_log):
        try:
            result = compute_batch.run_batch(module, sample, spark_master=spark_master)
        except compute_batch.JobFailed as exc:
            console.print(f"[red]the job fails:[/] {exc} (Spark's own log: {spark_log})", highlight=False)
            raise typer.Exit(1) from None
        except (OSError, ValueError) as exc:
            console.print(f"[red]{sample}[/]: {exc}", highlight=False)
            raise typer.Exit(2) from None
    batch_view.summary(result, None)
    batch_view.rows(result, limit)
    batch_view.letters(result)


@app.command("list")
def list_(as_json: Json = False) -> None:
    """Every job in the registry, with its live version."""
    records = read_registry(CommonSettings())
    if as_json:
        typer.echo(json.dumps({job: json.loads(record.encode()) for job, record in sorted(records.items())}))
        return
    if not records:
        console.print("no job has been deployed with `onceflow job deploy`", highlight=False)
        return
    table = Table()
    for column in ("job", "live", "versions"):
        table.add_column(column, overflow="fold")
    for job, record in sorted(records.items()):
        versions = ", ".join(f"{v} {record.versions[v].state.value}" for v in sorted(record.versions))
        table.add_row(job, record.live_name if record.live else "(none)", versions)
    console.print(table)


@app.command()
def status(
    job: Name,
    sample: Annotated[float, typer.Option("--sample", min=0, help="Seconds over which each version's rate is measured.")] = 1.0,
    as_json: Json = False,
) -> None:
    """Every running version: state, how far behind, records/s and the time to catch up."""
    common = CommonSettings()
    with _refusals():
        rows = lifecycle.status(common, job, sample)
    if as_json:
        typer.echo(json.dumps([
            {
                "name": r.name, "state": r.version.state.value, "module": r.version.module, "live": r.live,
                "from": r.version.start_from, "partitions": r.version.partitions,
                "map_behind": r.map_behind.records, "merge_behind": None if r.merge_behind is None else r.merge_behind.records,
                "records_per_s": r.records_per_s, "catch_up_s": r.catch_up_s, "workers_in_group": r.group_members,
                "local_workers": [w.instance for w in local.workers],
            }
            for local in rows
            for r in [local.status]
        ]))
        return
    table = Table()
    for column in ("version", "state", "module", "from", "map behind", "merge behind", "records/s", "catch up", "workers (here)"):
        table.add_column(column, overflow="fold")
    for local in rows:
        r = local.status
        eta = r.catch_up_s
        table.add_row(
            r.name, r.version.state.value + (" (readers)" if r.live else ""), r.version.module, _start_text(r.version.start_from),
            f"{r.map_behind.records}{'' if r.map_behind.exact else '+'}",
            "-" if r.merge_behind is None else str(r.merge_behind.records),
            "-" if r.records_per_s is None else f"{r.records_per_s:,.0f}",
            "caught up" if eta == 0 else ("unknown (not moving)" if eta is None else f"{eta:,.0f} s"),
            f"{r.group_members} ({len(local.workers)})",
        )
    console.print(table)


@app.command()
def promote(
    job: Name,
    version: VersionArg,
    force: Annotated[bool, typer.Option("--force", help="Promote even while it lags: readers see a partial table.")] = False,
    wait: Annotated[float, typer.Option("--wait", min=0, help="Wait up to this many seconds for it to catch up.")] = 0.0,
) -> None:
    """Switch the job's readers (Query, ResultsTail, the console) to VERSION, atomically; refused
    while it lags behind the live version."""
    common = CommonSettings()
    with _refusals():
        number = lifecycle.version_argument(version)
        record = lifecycle.promote(
            common, job, number, force, wait,
            on_wait=lambda missing: console.print(f"waiting: {'; '.join(missing)}", highlight=False),
        )
    console.print(f"{record.live_name} is live: {job}'s readers read it now", highlight=False)
    previous = [v for v in record.versions.values() if v.state.value == "previous"]
    for v in previous:
        console.print(
            f"  {versioned(job, v.version)} still runs: `onceflow job promote {job} {v.version}` goes back, "
            f"`onceflow job retire {job} {v.version}` removes it", highlight=False,
        )


@app.command()
def retire(
    job: Name,
    version: VersionArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Stop a version that is not live, and delete its topics, groups and table."""
    common = CommonSettings()
    with _refusals():
        number = lifecycle.version_argument(version)
        name = versioned(job, number)
        check_retirable(record_of(common, job), number)  # a refusal before the question, not after
        if not yes and not typer.confirm(f"stop {name} and delete its topics, groups and table?"):
            raise typer.Exit(1)
        deleted = lifecycle.retire(common, job, number)
    console.print(f"{name} retired", highlight=False)
    for item in deleted:
        console.print(f"  {item}", highlight=False)


@app.command()
def reprocess(
    job: Name,
    start_from: Annotated[str, typer.Option("--from", help="earliest, or a time (ISO-8601, or ms since the epoch).")] = EARLIEST,
    workers: Annotated[int, typer.Option("--workers", min=1, max=64)] = 1,
    start: Annotated[bool, typer.Option("--start/--no-start")] = True,
) -> None:
    """Deploy the live version's code again as a new version from --from: the bug-fix path."""
    common = CommonSettings()
    with _refusals():
        deployed = lifecycle.reprocess(common, job, start_from, worker_count=workers, start=start)
    console.print(f"deployed {deployed.name} (shadow): {deployed.version.note}", highlight=False)
    for note in deployed.notes:
        console.print(f"  {note}", highlight=False)
