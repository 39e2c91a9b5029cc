"""The job over one table, the way the map hop and batch mode both run it: on the engine, and
when it raises, bisected to the records it raises on alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from onceflow_compute.api import Aggregation, Job, Join, JSONValue, Transform
from onceflow_compute.bisection import BisectionBudgetSpent, bisect
from onceflow_compute.engine import Engine, EngineStalled

IMPORT_ERROR = re.compile(r"\b(ModuleNotFoundError|ImportError)\b")


class JobFailed(RuntimeError):
    """The job failed on every record of a batch: the job (or the engine) is broken, not a
    record. The loop aborts, backs off and reports the service unhealthy."""


@dataclass
class JobRun:
    # The engine's output tables, one per part of the table that ran (one unless bisected).
    outputs: list[pa.Table]
    # Row -> reason, for the rows the job failed on alone.
    failed: dict[int, str]


def run_job(job: Job, engine: Engine, table: pa.Table, bisect_budget: int = 64, *, lone_failure_is_poison: bool) -> JobRun:
    """The job's output tables and the rows it failed on alone. Raises JobFailed when the job,
    not a record, is to blame: everything failed, the engine stalled, Spark refused the plan,
    or the failures could not be isolated within ``bisect_budget`` engine runs.

    A table of one record that fails is poison only with ``lone_failure_is_poison``: the map
    hop says so once the job has worked on something in this process (before that, it may as
    well be the job); batch mode always does (a one-record input that fails is reported)."""

    def attempt(start: int, stop: int) -> pa.Table:
        return engine_output(job, engine, table.slice(start, stop - start))

    def reason(exc: Exception) -> str:
        if isinstance(exc, EngineStalled):
            raise JobFailed(f"job {job.name}: {exc}") from exc  # the engine, not a record: no bisection
        error = describe(exc)
        if type(exc).__name__ == "AnalysisException":
            # Spark refused the plan itself (a missing column, a bad expression): no record
            # is to blame, so there is nothing to bisect.
            raise JobFailed(f"job {job.name}: Spark cannot plan it: {error}") from exc
        if IMPORT_ERROR.search(error):
            # The executors' Python lacks a module: the environment is broken, not a record.
            raise JobFailed(
                f"job {job.name}: Spark's Python workers cannot import what it needs: {error} "
                "(on a cluster: does ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON name a Python with onceflow-compute "
                "and the job's dependencies? The job's own package is shipped)"
            ) from exc
        return error

    try:
        found = bisect(table.num_rows, attempt, reason, bisect_budget)
    except BisectionBudgetSpent as exc:
        raise JobFailed(
            f"job {job.name} fails on many records; they could not be isolated within "
            f"{bisect_budget} engine runs; last error: {exc.last_reason}"
        ) from None
    failed = found.failed
    if failed and len(failed) == table.num_rows and (len(failed) > 1 or not lone_failure_is_poison):
        raise JobFailed(f"job {job.name} failed on all {len(failed)} records: {next(iter(failed.values()))}")
    return JobRun(found.outputs, failed)


def engine_output(job: Job, engine: Engine, table: pa.Table) -> pa.Table:
    """One engine run: an aggregation's partials, a join's side rows, a transform's rows."""
    if isinstance(job, Aggregation):
        return engine.partials(job, table)
    if isinstance(job, Join):
        return engine.join_rows(job, table)
    return engine.transform(job, table)


def transform_rows(job: Transform, outputs: list[pa.Table]) -> Iterator[tuple[str, dict[str, JSONValue]]]:
    """A transform's output rows with their result keys, in order (the map hop upserts each;
    batch mode keeps the last per key). An output without the key column is the job's fault."""
    for table in outputs:
        if job.key not in table.column_names:
            raise JobFailed(f"job {job.name}: the transform's output has no key column {job.key!r}")
        for row in table.to_pylist():
            yield str(row[job.key]), row


def describe(exc: BaseException) -> str:
    """The error's one meaningful line (issue 45: it goes into the letter, the log, Status and
    the console). A Python traceback's is its last (Spark's PythonException carries the worker's
    whole traceback); anything else's is its first: an AnalysisException's message comes first
    and its logical plan after ("+- LogicalRDD , false" was all Status showed)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        summary = ""
    elif type(exc).__name__ == "PythonException" or any(line.startswith("Traceback (most recent call last)") for line in lines):
        summary = lines[-1]
    else:
        summary = lines[0]
    return f"{type(exc).__name__}: {summary}"[:1000]
