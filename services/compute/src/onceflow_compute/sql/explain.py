"""`onceflow sql explain`: the job a .sql file becomes, in words."""

from __future__ import annotations

from onceflow_compute.api import Aggregation, Combine, Transform
from onceflow_compute.sql.job import RECORD_ID, SqlJob, row_filter, row_level, side_batch
from onceflow_compute.sql.joins import JoinSpec
from onceflow_compute.sql.plan import COMPOSITE_KEY


def explain(sql_job: SqlJob) -> str:
    plan, job = sql_job.plan, sql_job.job
    table = plan.table
    lines = [f"job {sql_job.name}: {job.kind} (an onceflow_compute.api.{type(job).__name__})"]
    if plan.join is not None:
        return "\n".join(lines + _join(sql_job, plan.join) + [f"warning: {warning}" for warning in plan.warnings])
    columns = ", ".join(f"{c.name} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in table.columns)
    lines.append(f"reads table {table.name} ({columns}) from stream {table.stream}")
    for computed in table.computed:
        lines.append(f"  computed column {computed.name} AS {computed.sql}")
    if table.watermark_column:
        used = "a window's allowed lateness" if plan.window is not None else "unused: the query has no window"
        lines.append(f"  event time: {table.watermark_column}, watermark {table.watermark_delay_ms} ms behind ({used})")
    lines.append("map hop (Spark, each micro-batch, row by row):")
    condition = row_filter(plan)
    lines.append(f"  WHERE  {condition}" if condition else "  WHERE  (none: every row)")
    for column in row_level(plan):
        lines.append(f"  SELECT {column}")
    if isinstance(job, Transform):
        lines += [
            f"key: {RECORD_ID} (each input row's own record id: one result row per input row that passes)",
            "no merge hop, no state",
            "result table: append-only (each row an upsert of a new key; no retractions)",
        ]
    elif isinstance(job, Aggregation):
        if plan.key != COMPOSITE_KEY:
            lines.append(f"key: {plan.key} = {plan.key_sql} (results keyed by its string form; rows whose key is NULL are dropped)")
        elif plan.keys:
            parts = ", ".join(f"{k.name} = {k.sql}" for k in plan.keys)
            lines.append(f"key: {parts} (results keyed by the JSON array of their string forms; each a column of the row)")
        else:
            lines.append("key: none (one row per window, keyed [])")
        if plan.window is not None:
            window = plan.window
            lines.append(f"window: {window.window_fn.describe()} over {window.column}; rows keyed key@start-end, with window_start "
                         f"and window_end in epoch ms")
            lines.append(f"  fires when the watermark passes a window's end; late records within {table.watermark_delay_ms} ms "
                         "(the WATERMARK's delay) refine it, later ones go to compute.late")
        lines.append("aggregates (each a combiner: a partial per key per micro-batch, merged in the merge hop):")
        for spec, aggregate in zip(plan.aggregates, job.aggregates[len(job.aggregates) - len(plan.aggregates):], strict=True):
            combiner = type(aggregate.combiner).__name__ if isinstance(aggregate, Combine) else type(aggregate).__name__
            lines.append(f"  {spec.name} = {spec.sql}  ->  {combiner}  ({_state(spec.function)})")
        if plan.having_sql is not None:
            lines.append(f"HAVING {plan.having_sql}: evaluated in the merge hop on each row it would emit; a row that stops "
                         "passing is retracted, one that starts passing is upserted")
        per = "per key and window" if plan.window is not None else "per key"
        lines.append(f"merge hop state, {per}: [{', '.join(_state(s.function) for s in plan.aggregates)}] in the changelog")
        if sql_job.updating:
            lines.append("result table: updating (an upsert per changed row; its old row is retracted first)")
        else:
            lines.append("result table: append-only (each window's row fires once, when the watermark passes its end; no retractions)")
    lines += [f"warning: {warning}" for warning in plan.warnings]
    return "\n".join(lines)


def _state(function: str) -> str:
    return {
        "COUNT": "a count",
        "SUM": "a sum",
        "MIN": "a minimum",
        "MAX": "a maximum",
        "AVG": "[sum, count]",
        "COUNT_DISTINCT": "the set of values seen",
    }[function]


def _join(sql_job: SqlJob, spec: JoinSpec) -> list[str]:
    stream = spec.left.table.stream
    keys = " AND ".join(f"{a} = {b}" for a, b in zip(spec.left.keys, spec.right.keys, strict=True))
    lines = [
        f"reads stream {stream}: both sides are its records",
        f"{spec.how.value.upper()} join on {keys} (the global window: each side's rows are kept per key, and a row "
        "joins every partner that arrives before or after it)",
    ]
    for label, side, name in (("left", spec.left, "L"), ("right", spec.right, "R")):
        conditions = [c for c in (side.inner_filter, *side.filters) if c]
        where = " AND ".join(conditions) if conditions else "every record"
        lines.append(f"{label} side {side.alias}: table {side.table.name} WHERE {where}")
        for column in getattr(side_batch(side, name), "columns", []):
            lines.append(f"  SELECT {column}")
        for position, sql in side.outputs:
            lines.append(f"  result column {spec.columns[position]} = {sql}")
    lines += [
        "merge hop state: every row of both sides, per join key, in the changelog (it grows with the streams: "
        "a windowed join bounds it, not yet in SQL)",
        "a row whose key is NULL joins nothing; an outer side keeps it, padded with NULLs",
    ]
    if sql_job.updating:
        lines.append("result table: updating (an outer side's row is upserted padded with NULLs, and retracted when its first "
                     "partner arrives)")
    else:
        lines.append("result table: append-only (a joined row per pair of partners; no retractions)")
    return lines
