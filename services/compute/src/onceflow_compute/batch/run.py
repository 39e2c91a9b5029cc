"""Batch mode: the same job over bounded input (a JSON lines or Parquet file, read.py), as one
Spark job.

The final table is what the streaming pipeline's result table converges to for the same
records: every record that streaming would let into the job is read with the same Arrow parser
and schema (:mod:`onceflow_compute.frames`), the job runs through the map hop's own runner
(:func:`~onceflow_compute.engine.run.run_job`, bisecting the records it raises on), and the
partials are merged by the same loop (:func:`~onceflow_compute.merge.partials.merge_partials`) and
become rows through the same ``Aggregation.row`` the merge hop uses. A join is the exception: its
batch answer is Spark SQL's own join of the two sides, not the streaming join's code, so the
two implementations check each other. Values take the JSON round trip the results topic gives
them, so the two tables compare equal with ``==`` (ints stay ints).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.v1.results_pb2 import ResultChange

from onceflow_compute import jobs
from onceflow_compute.api import Aggregation, Job, Join, JSONValue, Transform, encode_json
from onceflow_compute.batch.read import read_input
from onceflow_compute.dataflow.windows import GLOBAL, MAX_TIME, Tumbling
from onceflow_compute.engine import Engine
from onceflow_compute.engine.run import run_job, transform_rows
from onceflow_compute.engine.shipping import modules_to_ship
from onceflow_compute.engine.spark import SparkEngine, as_engine, spark_engine
from onceflow_compute.merge.partials import merge_partials
from onceflow_compute.merge.windowed import firing_changes, windowed_engine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# How many dropped records a result keeps as examples (all are counted).
EXAMPLES = 20


@dataclass
class BatchResult:
    job: str
    kind: str  # "aggregation" or "transform"
    # result key -> row: what the streaming result table holds once every record is processed.
    table: dict[str, dict[str, JSONValue]]
    rows_in: int  # records read (non-blank lines, or Parquet rows)
    dropped: int  # malformed, schema violations, missing required fields, job failures
    reasons: Counter[str]  # dropped records per reason
    examples: list[tuple[int, str]]  # the first dropped records: (line or row number, reason)
    read_seconds: float
    job_seconds: float

    @property
    def seconds(self) -> float:
        return self.read_seconds + self.job_seconds

    def sorted_rows(self) -> list[dict[str, JSONValue]]:
        return [self.table[key] for key in sorted(self.table)]

    def write_jsonl(self, out: IO[bytes]) -> int:
        """The table as JSON lines in key order, each row as the results topic carries it."""
        for row in self.sorted_rows():
            out.write(encode_json(row) + b"\n")
        return len(self.table)


def run_batch(
    job: Job | str,
    input_path: str | Path,
    session_or_engine: SparkSession | Engine | None = None,
    *,
    input_format: str | None = None,
    spark_master: str | None = None,
    bisect_budget: int = 64,
) -> BatchResult:
    """Run ``job`` (or a job name, as ``jobs.load_job`` takes) over the file at ``input_path``.

    ``session_or_engine``: a SparkSession (left running), an engine (left open), or None for a
    new Spark engine on ``spark_master`` that is stopped before returning.
    ``result.table`` is the final table: result key -> row. Records the job raises on are
    found by bisection with at most ``bisect_budget`` engine runs (the map hop's budget, but
    here for the whole input) and dropped; when the job fails on every record, or on more than
    the budget isolates, JobFailed.
    """
    ship: list[str] = []
    if isinstance(job, str):  # a job named by its module: ship the module and its combiners'
        module, job = job, jobs.load_job(job)
        ship = modules_to_ship(module, job)
    started = time.monotonic()
    batch_input = read_input(job, input_path, input_format)
    read_seconds = time.monotonic() - started
    owned = session_or_engine is None
    engine = spark_engine(spark_master, ship=ship) if session_or_engine is None else as_engine(session_or_engine)
    try:
        started = time.monotonic()
        table, failed = run_table(job, batch_input.table, engine, bisect_budget)
        job_seconds = time.monotonic() - started
    finally:
        if owned:
            engine.close()
    rejected = list(batch_input.rejected)
    rejected.extend(
        (batch_input.numbers[index], f"job {job.name} failed on this record: {error}") for index, error in sorted(failed.items())
    )
    rejected.sort()
    return BatchResult(
        job=job.name,
        kind=job.kind,
        table=table,
        rows_in=batch_input.rows_in,
        dropped=len(rejected),
        reasons=Counter(_reason_kind(reason) for _number, reason in rejected),
        examples=rejected[:EXAMPLES],
        read_seconds=read_seconds,
        job_seconds=job_seconds,
    )


def run_table(
    job: Job, table: pa.Table, engine: Engine, bisect_budget: int = 64
) -> tuple[dict[str, dict[str, JSONValue]], dict[int, str]]:
    """The final table of ``job`` over ``table`` (a frame's table: payload + metadata columns),
    and the rows the job failed on (row index -> reason)."""
    if not table.num_rows:
        return {}, {}
    # The map hop's own runner: the job on the whole table; if it raises, bisection finds the
    # records it raises on (at most ``bisect_budget`` engine runs). One table: a lone failing
    # record is reported as dropped, not raised.
    run = run_job(job, engine, table, bisect_budget, lone_failure_is_poison=True)
    outputs, failed = run.outputs, run.failed
    if isinstance(job, Transform):
        return _transform_rows(job, outputs), failed
    if isinstance(job, Join):
        kept = pa.array([i not in failed for i in range(table.num_rows)], pa.bool_())
        return _join_rows(job, pc.filter(table, kept), engine), failed
    return _aggregate_rows(job, outputs), failed


def _join_rows(job: Join, table: pa.Table, engine: Engine) -> dict[str, dict[str, JSONValue]]:
    """Spark SQL's join of the two sides (within each window when windowed)."""
    if not isinstance(engine, SparkEngine):
        raise ValueError(f"job {job.name}: joins need the Spark engine")
    from pyspark.sql import functions as F

    frame = engine.frame(table)
    sides = []
    for prefix, build in (("l", job.left), ("r", job.right)):
        side_rows = build(frame).where(F.col(job.on).isNotNull() & F.col(job.time_column).isNotNull())
        columns = side_rows.columns
        if isinstance(job.window, Tumbling):
            size, offset = job.window.size_ms, job.window.offset_ms
            start = F.floor((F.col(job.time_column).cast("long") - offset) / size) * size + offset
        else:
            start = F.lit(0)
        sides.append(
            side_rows.select(
                F.col(job.on).cast("string").alias(f"{prefix}_on"),
                start.cast("long").alias(f"{prefix}_window"),
                # As JSON, as the streaming map hop carries a side's row (an outer join's padded
                # side is a NULL struct, which Arrow refuses where the struct has required fields).
                F.to_json(F.struct(*[F.col(c) for c in columns]), {"ignoreNullFields": "false"}).alias(prefix),
            )
        )
    left, right = sides
    condition = (F.col("l_on") == F.col("r_on")) & (F.col("l_window") == F.col("r_window"))
    how = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}[job.how.value]
    joined = left.join(right, condition, how).select("l", "r", F.coalesce("l_window", "r_window").alias("window"))
    rows: dict[str, dict[str, JSONValue]] = {}
    for row in joined.toArrow().to_pylist():
        l, r = (None if row[side] is None else json.loads(row[side]) for side in ("l", "r"))
        window = job.window_of(row["window"]) if job.windowed else GLOBAL
        rows[job.result_key(l, r, window)] = _json(job.row(l, r, window))
    return rows


def _aggregate_rows(job: Aggregation, outputs: list[pa.Table]) -> dict[str, dict[str, JSONValue]]:
    merged = merge_partials(job, outputs)
    # As the merge hop: partials decoded from the JSON the map hop wrote, the row as the
    # results topic carries it.
    if not job.windowed:
        rows = {key: _json(job.row(key, _json(partials))) for (key, _bucket), partials in merged.items()}
        return {key: row for key, row in rows.items() if job.shown(row)}
    # Bounded input: every window is complete, so each fires once, on time, with everything.
    engine = windowed_engine(job)
    for (key, bucket), partials in merged.items():
        engine.add(key, bucket, _json(partials))
    engine.advance_watermark(MAX_TIME)
    table: dict[str, dict[str, JSONValue]] = {}
    for firing in engine.fire(0):
        for result_key, op, row in firing_changes(job, firing):
            if op == ResultChange.RETRACT:
                table.pop(result_key, None)
            else:
                table[result_key] = _json(row)
    return table


def _transform_rows(job: Transform, outputs: list[pa.Table]) -> dict[str, dict[str, JSONValue]]:
    # Each row upserts its key: the last one wins.
    return {key: _json(row) for key, row in transform_rows(job, outputs)}


def _json(value: JSONValue) -> JSONValue:
    """The value as it comes back from the JSON the topics carry (encode_json's rules, but
    the row's column order kept for display)."""
    return json.loads(json.dumps(value, separators=(",", ":"), allow_nan=False))


def _reason_kind(reason: str) -> str:
    """Reasons grouped for the summary (Arrow's messages name columns and values: one line
    per kind of problem reads better)."""
    if "required field" in reason:
        return "a required field is missing"
    if reason.startswith("schema violation"):
        return "malformed or not the schema's types"
    return reason
