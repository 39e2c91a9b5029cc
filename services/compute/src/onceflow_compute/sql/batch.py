"""Batch mode for SQL: the same text as ONE Spark SQL query over the bounded input, the
reference answer the streaming job's table must equal (docs/sql.md#batch-mode).

The input is read as the job reads it (the same Arrow parser and schema: a record streaming
would dead-letter is dropped here too), registered as the table's view, and queried. Two
differences from SQL's own table, which the streaming table also has: a group whose key is NULL
is left out, and the key is its string form (a GROUP BY of several expressions: each its string
form, keyed by their JSON array). A windowed row's window is in epoch milliseconds and its key
ends with ``@start-end``. A transform's rows, which SQL does not key, are numbered in their JSON
order."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow_compute.api import JSONValue
from onceflow_compute.batch.read import read_input
from onceflow_compute.batch.run import BatchResult
from onceflow_compute.engine.run import JobFailed, describe
from onceflow_compute.sql.job import SqlJob, load
from onceflow_compute.sql.plan import COMPOSITE_KEY, WINDOW_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession


def reference_table(sql_job: SqlJob, session: SparkSession, table: pa.Table) -> dict[str, dict[str, JSONValue]]:
    """The query's answer over ``table`` (payload + metadata columns, as read)."""
    from pyspark.sql import functions as F

    plan = sql_job.plan
    for declared in sql_job.tables.values():
        declared.with_computed(session.createDataFrame(table.select(declared.schema.names))).createOrReplaceTempView(declared.name)
    try:
        answer = session.sql(sql_job.query)
        if sql_job.keyed:
            for part in plan.keys:
                answer = answer.withColumn(part.name, F.col(f"`{part.name}`").cast("string"))
            if len(plan.keys) == 1:
                answer = answer.where(F.col(f"`{plan.key}`").isNotNull())
            else:
                answer = answer.withColumn(COMPOSITE_KEY, F.to_json(F.array(*[F.col(f"`{p.name}`") for p in plan.keys])))
        if plan.window is not None:
            for column in WINDOW_COLUMNS.values():
                answer = answer.withColumn(column, F.unix_millis(F.col(column)))
        rows = [_json(row) for row in answer.toArrow().to_pylist()]
    except Exception as exc:  # noqa: BLE001 - Spark's errors, reported as the job's failure
        raise JobFailed(f"job {sql_job.name}: {describe(exc)}") from None
    finally:
        for declared in sql_job.tables.values():
            session.catalog.dropTempView(declared.name)
    if sql_job.keyed:
        keyed = {}
        for row in rows:
            key = str(row.pop(COMPOSITE_KEY)) if len(plan.keys) != 1 else str(row[plan.key])
            if plan.window is not None:
                key = f"{key}@{row['window_start']}-{row['window_end']}"
            keyed[key] = row
        return keyed
    rows.sort(key=lambda row: json.dumps(row, sort_keys=True))
    width = len(str(len(rows)))
    return {str(number).zfill(width): row for number, row in enumerate(rows, 1)}


def run_sql_batch(path: str | Path, input_path: str | Path, session: SparkSession, input_format: str | None = None) -> BatchResult:
    started = time.monotonic()
    sql_job = load(path, session)
    batch_input = read_input(sql_job.job, input_path, input_format)
    read_seconds = time.monotonic() - started
    started = time.monotonic()
    table = reference_table(sql_job, session, batch_input.table) if batch_input.table.num_rows else {}
    rejected = sorted(batch_input.rejected)
    return BatchResult(
        job=sql_job.name, kind=f"{sql_job.job.kind}, as one Spark SQL query", table=table, rows_in=batch_input.rows_in,
        dropped=len(rejected), reasons=Counter(reason.split(":", 1)[0] for _n, reason in rejected), examples=rejected[:20],
        read_seconds=read_seconds, job_seconds=time.monotonic() - started,
    )


def _json(row: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """As the results topic carries it (ints stay ints)."""
    value: dict[str, JSONValue] = json.loads(json.dumps(row, separators=(",", ":"), allow_nan=False))
    return value
