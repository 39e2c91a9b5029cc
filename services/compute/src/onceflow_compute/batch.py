"""Batch mode: the same job over bounded input (a JSON lines or Parquet file), as one Spark job.

The final table is what the streaming pipeline's result table converges to for the same
records: every record that streaming would let into the job is read here with the same Arrow
parser and schema (:mod:`onceflow_compute.frames`), the job runs through the same engine code
(:class:`~onceflow_compute.engines.SparkEngine`), and the partials become rows through the same
``aggregate.partial`` / ``Aggregation.row`` the merge hop uses. A join is the exception: its
batch answer is Spark SQL's own join of the two sides, not the streaming join's code, so the
two implementations check each other. Values take the JSON round trip
the results topic gives them, so the two tables compare equal with ``==`` (ints stay ints).

Input records carry the job's payload fields; the metadata columns (``_record_id``, ``_key``,
``_event_time_ms``, ``_ingest_time_ms``) may be given as fields of the record too. Absent ones
are null, except ``_record_id``, which defaults to the record's 1-based line (JSON lines) or
row (Parquet) number, as a string. Blank lines are skipped. Records that are malformed, break
the schema or miss a required (non-nullable) field are dropped and counted, as are records the
job itself raises on (found by bisection, as the map hop does).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow_compute import jobs
from onceflow_compute.api import METADATA_COLUMNS, Aggregation, Job, Join, JSONValue, Transform, encode_json
from onceflow_compute.dataflow.windows import GLOBAL, MAX_TIME, Tumbling
from onceflow_compute.engines import Engine, SparkEngine
from onceflow_compute.frames import parse_checked, parse_options
from onceflow_compute.job_runner import JobFailed, JobRunner
from onceflow_compute.shipping import modules_to_ship
from onceflow_compute.stages import partials_by_key
from onceflow_compute.windowed import firing_changes, windowed_engine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("jsonl", "parquet")
PARQUET_SUFFIXES = (".parquet", ".pq")
# Lines parsed together: a clean chunk costs one vectorised parse; a dirty one is bisected.
CHUNK_LINES = 50_000
# How many dropped records a result keeps as examples (all are counted).
EXAMPLES = 20
# Arrow's parse errors say where in the parsed chunk: meaningless once bisected to one line.
_IN_ROW = re.compile(r" in row \d+$")


@dataclass
class BatchInput:
    """The records that enter the job (payload fields, then the metadata columns, exactly as
    a micro-batch's frame has them) and what was dropped on the way."""

    table: pa.Table
    # The 1-based line (JSON lines) or row (Parquet) number of each row of ``table``.
    numbers: list[int]
    rows_in: int
    # (line or row number, reason), for every dropped record.
    rejected: list[tuple[int, str]] = field(default_factory=list)


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


def resolve_format(path: str | Path, input_format: str | None = None) -> str:
    """``jsonl`` or ``parquet``: as given, else by the file's suffix (a directory is Parquet)."""
    if input_format:
        if input_format not in FORMATS:
            raise ValueError(f"format {input_format!r}: expected one of {', '.join(FORMATS)}")
        return input_format
    path = Path(path)
    return "parquet" if path.is_dir() or path.suffix.lower() in PARQUET_SUFFIXES else "jsonl"


def spark_engine(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    app_name: str = "onceflow-batch",
    ship: Sequence[str] = (),
) -> SparkEngine:
    """A Spark engine configured as the workers' (ONCEFLOW_COMPUTE_SPARK_* unless given)."""
    from onceflow_compute import spark_cds
    from onceflow_compute.config import ComputeSettings

    settings = ComputeSettings()
    return SparkEngine(
        master or settings.spark_master,
        shuffle_partitions or settings.spark_shuffle_partitions,
        driver_memory or settings.spark_driver_memory,
        app_name=app_name,
        java_options=spark_cds.java_options(settings.spark_java_options),
        executor_python=settings.spark_executor_python,
        conf=settings.spark_conf,
        ship=ship,
    )


class SessionEngine(SparkEngine):
    """The Spark engine over a session someone else owns (and stops)."""

    def __init__(self, session: SparkSession) -> None:
        # Not SparkEngine.__init__: that builds a session.
        self._adopt(session)

    def close(self) -> None:
        pass


def as_engine(session_or_engine: SparkSession | Engine) -> Engine:
    if hasattr(session_or_engine, "partials") and hasattr(session_or_engine, "transform"):
        return session_or_engine  # type: ignore[return-value]
    if hasattr(session_or_engine, "createDataFrame"):  # a classic or a Spark Connect session
        return SessionEngine(session_or_engine)
    raise TypeError(f"expected a SparkSession or an engine, got {type(session_or_engine).__name__}")


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
    here for the whole input; past it the rest of the failing part counts as failed) and
    dropped; when the job fails on every record, JobFailed.
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
    # records it raises on (at most ``bisect_budget`` engine runs).
    outputs, failed = JobRunner(job, engine, bisect_budget, proven=True).run(table)
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
        rows = build(frame).where(F.col(job.on).isNotNull() & F.col(job.time_column).isNotNull())
        columns = rows.columns
        if isinstance(job.window, Tumbling):
            size, offset = job.window.size_ms, job.window.offset_ms
            start = F.floor((F.col(job.time_column).cast("long") - offset) / size) * size + offset
        else:
            start = F.lit(0)
        sides.append(
            rows.select(
                F.col(job.on).cast("string").alias(f"{prefix}_on"),
                start.cast("long").alias(f"{prefix}_window"),
                F.struct(*[F.col(c) for c in columns]).alias(prefix),
            )
        )
    left, right = sides
    condition = (F.col("l_on") == F.col("r_on")) & (F.col("l_window") == F.col("r_window"))
    how = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}[job.how.value]
    joined = left.join(right, condition, how).select("l", "r", F.coalesce("l_window", "r_window").alias("window"))
    rows: dict[str, dict[str, JSONValue]] = {}
    for row in joined.toArrow().to_pylist():
        l, r = row["l"], row["r"]
        window = job.window_of(row["window"]) if job.windowed else GLOBAL
        rows[job.result_key(l, r, window)] = _json(job.row(l, r, window))
    return rows


def _aggregate_rows(job: Aggregation, outputs: list[pa.Table]) -> dict[str, dict[str, JSONValue]]:
    merged: dict[tuple[str, int], list[JSONValue]] = {}
    for output in outputs:
        for key, bucket, partials in partials_by_key(job, output):
            at = (key, bucket)
            merged[at] = job.merge(merged[at], partials) if at in merged else partials
    # As the merge hop: partials decoded from the JSON the map hop wrote, the row as the
    # results topic carries it.
    if not job.windowed:
        return {key: _json(job.row(key, _json(partials))) for (key, _bucket), partials in merged.items()}
    # Bounded input: every window is complete, so each fires once, on time, with everything.
    engine = windowed_engine(job)
    for (key, bucket), partials in merged.items():
        engine.add(key, bucket, _json(partials))
    engine.advance_watermark(MAX_TIME)
    table: dict[str, dict[str, JSONValue]] = {}
    for firing in engine.fire(0):
        for result_key, _op, row in firing_changes(job, firing):
            table[result_key] = _json(row)
    return table


def _transform_rows(job: Transform, outputs: list[pa.Table]) -> dict[str, dict[str, JSONValue]]:
    rows: dict[str, dict[str, JSONValue]] = {}
    for output in outputs:
        if job.key not in output.column_names:
            raise JobFailed(f"job {job.name}: the transform's output has no key column {job.key!r}")
        for row in output.to_pylist():
            rows[str(row[job.key])] = _json(row)  # each row upserts its key: the last one wins
    return rows


def _json(value: JSONValue) -> JSONValue:
    """The value as it comes back from the JSON the topics carry (encode_json's rules, but
    the row's column order kept for display)."""
    return json.loads(json.dumps(value, separators=(",", ":"), allow_nan=False))


# --- reading -------------------------------------------------------------------------------


def read_input(job: Job, path: str | Path, input_format: str | None = None) -> BatchInput:
    if resolve_format(path, input_format) == "parquet":
        return read_parquet(job, path)
    with open(path, "rb") as lines:
        return read_jsonl(job, lines)


def _input_schema(job: Job) -> pa.Schema:
    """The job's fields, then the metadata fields (nullable while reading)."""
    metadata = [f.with_nullable(True) for f in METADATA_COLUMNS if f.name not in job.schema.names]
    return pa.schema([*job.schema, *metadata])


def _frame_schema(job: Job) -> pa.Schema:
    """As a micro-batch's frame: the payload fields, then METADATA_COLUMNS."""
    return pa.schema([*job.schema, *(f for f in METADATA_COLUMNS if f.name not in job.schema.names)])


def read_jsonl(job: Job, source: Iterable[bytes]) -> BatchInput:
    """JSON lines, parsed as the map hop parses payloads (one Arrow parse per clean chunk)."""
    options = parse_options(_input_schema(job))
    tables: list[pa.Table] = []
    numbers: list[int] = []
    rejected: list[tuple[int, str]] = []
    rows_in = 0
    for chunk in _chunks(source, CHUNK_LINES):
        rows_in += len(chunk)
        lines = [line for _n, line in chunk]
        table, reasons = parse_checked(lines, options)
        if reasons:
            rejected.extend((chunk[i][0], _IN_ROW.sub("", reason)) for i, reason in sorted(reasons.items()))
            chunk = [entry for i, entry in enumerate(chunk) if i not in reasons]
            table, _ = parse_checked([line for _n, line in chunk], options)
        if table is not None:
            tables.append(table)
            numbers.extend(n for n, _line in chunk)
    return BatchInput(_to_frame(job, tables, numbers), numbers, rows_in, rejected)


def _chunks(source: Iterable[bytes], size: int) -> Iterator[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    for number, raw in enumerate(source, start=1):
        line = raw.strip()
        if not line:
            continue
        chunk.append((number, line))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def read_parquet(job: Job, path: str | Path) -> BatchInput:
    """A Parquet file (or directory): columns by name, cast to the schema's types; rows whose
    values do not cast, or that miss a required field, are dropped."""
    import pyarrow.parquet as pq

    source = pq.read_table(path)
    count = source.num_rows
    bad: dict[int, str] = {}
    columns: dict[str, pa.ChunkedArray] = {}
    for fld in _input_schema(job):
        if fld.name in source.column_names:
            column = source.column(fld.name)
        else:
            column = pa.chunked_array([pa.nulls(count, fld.type)], fld.type)
        for index, error in _failures(count, lambda a, b, c=column, t=fld.type: _cast_error(c.slice(a, b - a), t)).items():
            bad.setdefault(index, f"schema violation: {fld.name}: {error}")
        columns[fld.name] = column
        if not fld.nullable:
            for index in pc.indices_nonzero(column.is_null()).to_pylist():
                bad.setdefault(index, "schema violation: a required field is missing")
    keep = pa.array([i for i in range(count) if i not in bad], pa.int64())
    schema = _input_schema(job)
    tables = [pa.table([columns[f.name].take(keep).cast(f.type) for f in schema], schema=schema)] if len(keep) else []
    rejected = [(index + 1, reason) for index, reason in sorted(bad.items())]
    numbers = [i + 1 for i in keep.to_pylist()]
    return BatchInput(_to_frame(job, tables, numbers), numbers, count, rejected)


def _cast_error(column: pa.ChunkedArray, target: pa.DataType) -> str | None:
    try:
        column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        return str(exc)
    return None


def _failures(count: int, error: Callable[[int, int], str | None]) -> dict[int, str]:
    """The rows of [0, count) on which ``error`` (over a range of rows) fails alone."""
    found: dict[int, str] = {}

    def bisect(start: int, stop: int) -> None:
        if start >= stop:
            return
        reason = error(start, stop)
        if reason is None:
            return
        if stop - start == 1:
            found[start] = reason
            return
        middle = (start + stop) // 2
        bisect(start, middle)
        bisect(middle, stop)

    bisect(0, count)
    return found


def _to_frame(job: Job, tables: list[pa.Table], numbers: list[int]) -> pa.Table:
    """The parsed records as a frame's table; a missing _record_id is the record's number."""
    schema = _frame_schema(job)
    if not tables:
        return schema.empty_table()
    read = pa.concat_tables([t.select(_input_schema(job).names) for t in tables])
    arrays: list[Any] = []
    for fld in schema:
        column = read.column(fld.name).combine_chunks()
        if fld.name == "_record_id" and column.null_count:
            column = pc.coalesce(column, pa.array([str(n) for n in numbers], pa.string()))
        arrays.append(column.cast(fld.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _reason_kind(reason: str) -> str:
    """Reasons grouped for the summary (Arrow's messages name columns and values: one line
    per kind of problem reads better)."""
    if "required field" in reason:
        return "a required field is missing"
    if reason.startswith("schema violation"):
        return "malformed or not the schema's types"
    return reason
