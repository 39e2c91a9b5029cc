"""A .sql file -> an ordinary onceflow job (an Aggregation or a Transform), so the map/merge hops,
combiners, retractions and exactly-once machinery run it unchanged."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow_compute.api import Aggregate, Aggregation, Avg, Combine, Count, Job, Join, JSONValue, Max, Min, Sum, Transform
from onceflow_compute.sql.ddl import Table, is_create_table, parse_table
from onceflow_compute.sql.joins import JoinSpec, Side
from onceflow_compute.sql.plan import AggregateSpec, Plan, analyse, empty_frame
from onceflow_compute.sql.text import SqlError, job_name, padded, position, statements

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RECORD_ID = "_record_id"  # a transform's rows are keyed by their record: unique, as docs/jobs.md asks


class DistinctValues:
    """COUNT(DISTINCT ...): the accumulator is the sorted list of the values seen (a set, as JSON)."""

    def init(self) -> JSONValue:
        return []

    def add(self, acc: Any, value: Any) -> JSONValue:
        if value is not None:
            at = bisect.bisect_left(acc, value)
            if at == len(acc) or acc[at] != value:
                acc.insert(at, value)
        return acc

    def merge(self, a: Any, b: Any) -> JSONValue:
        return sorted(set(a) | set(b))

    def result(self, acc: Any) -> JSONValue:
        return len(acc)


@dataclass(frozen=True)
class SqlJob:
    name: str
    source: str  # the file's text
    query: str  # the query, padded to its place in the file
    tables: dict[str, Table]
    plan: Plan
    job: Job

    @property
    def updating(self) -> bool:
        """Rows change after they are written (retracted first). A window without allowed
        lateness fires each row once, on time: append-only."""
        if self.plan.join is not None:  # an outer side's padded row is retracted when its partner comes
            return self.plan.join.how.value != "inner"
        if self.plan.kind != "aggregation":
            return False
        if self.plan.having is not None:  # a row stops passing: retracted
            return True
        return self.plan.window is None or self.plan.table.watermark_delay_ms > 0 or self.plan.window.function == "session_window"

    @property
    def keyed(self) -> bool:
        """Results keyed by the GROUP BY (else by record: a transform)."""
        return self.plan.kind == "aggregation"


def argument_column(index: int) -> str:
    return f"__sql_arg{index}"


def part_column(index: int) -> str:
    return f"__sql_part{index}"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _aggregate(index: int, spec: AggregateSpec) -> Aggregate:
    column = argument_column(index)
    if spec.function == "COUNT" and spec.argument is None:
        return Count(spec.name)
    if spec.function == "COUNT":  # rows whose argument is not null: each group has one row at least, so never null
        return Sum(column, name=spec.name)
    if spec.function == "COUNT_DISTINCT":
        return Combine(column, name=spec.name, combiner=DistinctValues())
    return {"SUM": Sum, "MIN": Min, "MAX": Max, "AVG": Avg}[spec.function](column, name=spec.name)


def _argument_sql(spec: AggregateSpec) -> str:
    if spec.function == "COUNT":
        return f"CASE WHEN ({spec.argument}) IS NULL THEN 0 ELSE 1 END"
    assert spec.argument is not None
    return spec.argument


def row_level(plan: Plan) -> list[str]:
    """The SELECT list run in Spark on each micro-batch (after the WHERE)."""
    if plan.kind == "transform":
        return [f"{_quoted(plan.alias)}.{RECORD_ID} AS {RECORD_ID}"] + [f"{sql} AS {_quoted(name)}" for name, sql in plan.projections]
    arguments = [
        f"{_argument_sql(spec)} AS {argument_column(i)}"
        for i, spec in enumerate(plan.aggregates)
        if not (spec.function == "COUNT" and spec.argument is None)
    ]
    # A composite key's parts ride along as columns of the row (their string forms, as a single key's).
    parts = [f"CAST({part.sql} AS STRING) AS {part_column(i)}" for i, part in enumerate(plan.keys)] if len(plan.keys) != 1 else []
    # The windowed Aggregation's time column, as epoch ms: the payload column the map hop read it from.
    time = [f"unix_millis({_event_time(plan)}) AS {_quoted(time_column(plan))}"] if plan.window is not None else []
    return [f"{plan.key_sql} AS {_quoted(plan.key)}", *parts, *arguments, *time]


def time_column(plan: Plan) -> str:
    source = plan.table.event_time_source
    assert source is not None  # a window is over the table's watermark column (plan.py)
    return source


def _event_time(plan: Plan) -> str:
    assert plan.window is not None
    return f"{_quoted(plan.alias)}.{_quoted(plan.window.column)}"


def row_filter(plan: Plan) -> str | None:
    """The WHERE run on each micro-batch: the query's, and for a window a time (as Spark's window() does)."""
    conditions = [c for c in (plan.filter, f"{_event_time(plan)} IS NOT NULL" if plan.window is not None else None) if c]
    if len(conditions) < 2:
        return conditions[0] if conditions else None
    return " AND ".join(f"({c})" for c in conditions)


def micro_batch(plan: Plan) -> Any:
    """DataFrame -> DataFrame: the query's row-level part, over a batch of the table's rows."""
    columns, condition, alias, table = row_level(plan), row_filter(plan), plan.alias, plan.table

    def run(frame: DataFrame) -> DataFrame:
        rows: DataFrame = table.with_computed(frame).alias(alias)
        if condition is not None:
            rows = rows.where(condition)
        return rows.selectExpr(*columns)

    return run


JOIN_KEY = "__sql_on"


def output_column(position: int) -> str:
    return f"__sql_out{position}"


def side_batch(side: Side, label: str) -> Any:
    """DataFrame -> DataFrame: one side's rows of a batch, with the join key, the record's id and
    time (which the join keeps), and the result columns this side computes.

    SQL never matches a NULL key, yet an outer join keeps that row, padded. The join drops rows
    without a key, so a NULL key becomes one no row of the other side can have: a control
    character, the side's ``label`` and the record's id."""
    alias = _quoted(side.alias)
    key = f"CAST({side.keys[0]} AS STRING)" if len(side.keys) == 1 else \
        "to_json(array(" + ", ".join(f"CAST({k} AS STRING)" for k in side.keys) + "))"
    missing = " OR ".join(f"({k}) IS NULL" for k in side.keys)
    key = f"CASE WHEN {missing} THEN concat(char(1), '{label}', {alias}.{RECORD_ID}) ELSE {key} END"
    columns = [f"{key} AS {JOIN_KEY}", f"{alias}.{RECORD_ID} AS {RECORD_ID}", f"coalesce({alias}._event_time_ms, 0) AS _event_time_ms"]
    # (The join keeps every row, the global window: the time only has to be there; batch input may have none.)
    columns += [f"{sql} AS {output_column(at)}" for at, sql in side.outputs]
    table, inner, inner_filter, filters = side.table, side.inner_alias, side.inner_filter, side.filters

    def run(frame: DataFrame) -> DataFrame:
        rows: DataFrame = table.with_computed(frame).alias(inner)
        if inner_filter is not None:
            rows = rows.where(inner_filter)
        rows = rows.alias(side.alias)
        for condition in filters:
            rows = rows.where(condition)
        return rows.selectExpr(*columns)

    run.columns = columns  # type: ignore[attr-defined]  # for explain
    return run


def flatten(spec: JoinSpec) -> Any:
    """The result row from the sides' rows: each column from the side that computes it (NULL
    for a side an outer join padded)."""
    columns = spec.columns
    sides = [tuple(p for p, _sql in spec.left.outputs), tuple(p for p, _sql in spec.right.outputs)]

    def project(left: dict[str, JSONValue] | None, right: dict[str, JSONValue] | None) -> dict[str, JSONValue]:
        row: dict[str, JSONValue] = dict.fromkeys(columns)
        for side_row, positions in zip((left, right), sides, strict=True):
            if side_row is not None:
                for at in positions:
                    row[columns[at]] = side_row.get(output_column(at))
        return row

    return project


def _join_schema(spec: JoinSpec) -> pa.Schema:
    """The stream's payload schema both sides read: one table's, or both tables' fields."""
    fields = {f.name: f for f in spec.left.table.schema}
    for f in spec.right.table.schema:
        if f.name in fields and fields[f.name].type != f.type:
            raise SqlError(f"column {f.name} is {fields[f.name].type} in {spec.left.table.name} and {f.type} in "
                           f"{spec.right.table.name}: both read one stream's payloads, so it must be one type")
        fields.setdefault(f.name, f)
    return pa.schema(list(fields.values()))


def build_job(name: str, plan: Plan) -> Job:
    table = plan.table
    doc = f"SQL over {table.name}"
    if plan.join is not None:
        spec = plan.join
        return Join(name=name, schema=_join_schema(spec), left=side_batch(spec.left, "L"), right=side_batch(spec.right, "R"), on=JOIN_KEY,
                    left_id=RECORD_ID, right_id=RECORD_ID, how=spec.how, doc=f"SQL join of {spec.left.table.name} and "
                    f"{spec.right.table.name}", stream=table.stream, project=flatten(spec))
    if plan.kind == "transform":
        return Transform(name=name, schema=table.schema, key=RECORD_ID, transform=micro_batch(plan), doc=doc, stream=table.stream)
    # Arguments are numbered by their aggregate's position; COUNT(*) has none. A composite key's
    # parts are the same in every row of a group: MIN is any of them.
    parts = tuple(Min(part_column(i), name=part.name) for i, part in enumerate(plan.keys)) if len(plan.keys) != 1 else ()
    aggregates = parts + tuple(_aggregate(i, spec) for i, spec in enumerate(plan.aggregates))
    windowing: dict[str, Any] = {}
    if plan.window is not None:
        # The table's watermark delay is how late a record may be and still refine its window.
        windowing = {"window": plan.window.window_fn, "time_column": time_column(plan), "allowed_lateness_ms": table.watermark_delay_ms}
    try:
        return Aggregation(name=name, schema=table.schema, key=plan.key, aggregates=aggregates, prepare=micro_batch(plan), doc=doc,
                           stream=table.stream, show_key=len(plan.keys) == 1, having=plan.having, **windowing)
    except ValueError as exc:
        raise SqlError(str(exc)) from None


def compile_sql(source: str, stem: str, session: SparkSession) -> SqlJob:
    """The job a .sql file's text becomes; SqlError says why not."""
    name = job_name(source, stem)
    tables: dict[str, Table] = {}
    queries = []
    for statement in statements(source):
        if is_create_table(statement.text):
            table = parse_table(source, statement.start, statement.text)
            if table.name.lower() in {t.lower() for t in tables}:
                line, column = position(source, statement.start)
                raise SqlError(f"line {line}, column {column}: table {table.name} is declared twice")
            tables[table.name] = table
        else:
            queries.append(statement)
    if not tables:
        raise SqlError("no CREATE TABLE: declare the table the query reads")
    if len(queries) != 1:
        where = "" if not queries else " (" + ", ".join("line %d" % position(source, q.start)[0] for q in queries) + ")"
        raise SqlError(f"a SQL job holds one query, this file holds {len(queries)}{where}")
    query = padded(source, queries[0])
    plan = analyse(session, tables, query)
    job = build_job(name, plan)
    _check_row_level(session, plan, job)
    return SqlJob(name, source, query, tables, plan, job)


def _check_row_level(session: SparkSession, plan: Plan, job: Job) -> None:
    """The row-level part analysed as the map hop will run it (the schema and the metadata
    columns, from Arrow), so a query Spark cannot run that way is refused now, not per batch."""
    from onceflow_compute.api import METADATA_COLUMNS

    schema = job.schema  # a join: both tables' fields
    for metadata in METADATA_COLUMNS:
        schema = schema.append(metadata)
    runs = [job.left, job.right] if isinstance(job, Join) else [job.transform if isinstance(job, Transform) else getattr(job, "prepare")]
    try:
        for run in runs:
            run(empty_frame(session, schema)).schema  # noqa: B018 - analysing is the check
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException
        raise SqlError(f"the query's row-level part does not run per micro-batch: {exc}") from None


def load(path: str | Path, session: SparkSession | None = None) -> SqlJob:
    """The file's job (named by its ``-- job:`` line or the file's stem)."""
    path = Path(path)
    return load_text(path.read_text(encoding="utf-8"), path.stem, session)


def load_text(source: str, stem: str, session: SparkSession | None = None) -> SqlJob:
    """The text's job, analysed in ``session``, the active classic session, or a local one
    started for this and stopped after (a worker loads its job before it starts Spark)."""
    if session is not None:
        return compile_sql(source, stem, session)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and hasattr(active, "_jsparkSession"):
        return compile_sql(source, stem, active)
    local = SparkSession.builder.master("local[1]").appName("onceflow-sql-analyse").config("spark.ui.enabled", "false").getOrCreate()
    try:
        return compile_sql(source, stem, local)
    finally:
        local.stop()
