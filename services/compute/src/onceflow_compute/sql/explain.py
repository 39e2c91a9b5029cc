"""`onceflow sql explain`: the job a .sql file becomes, in words."""

from __future__ import annotations

from onceflow_compute.api import Aggregation, Combine, Transform
from onceflow_compute.sql.job import RECORD_ID, SqlJob, row_level


def explain(sql_job: SqlJob) -> str:
    plan, job = sql_job.plan, sql_job.job
    table = plan.table
    lines = [f"job {sql_job.name}: {job.kind} (an onceflow_compute.api.{type(job).__name__})"]
    columns = ", ".join(f"{c.name} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in table.columns)
    lines.append(f"reads table {table.name} ({columns}) from stream {table.stream}")
    if table.watermark_column:
        lines.append(
            f"  event time: {table.watermark_column}, watermark {table.watermark_delay_ms} ms behind "
            "(declared; used once windows are supported)"
        )
    lines.append("map hop (Spark, each micro-batch, row by row):")
    lines.append(f"  WHERE  {plan.filter}" if plan.filter else "  WHERE  (none: every row)")
    for column in row_level(plan):
        lines.append(f"  SELECT {column}")
    if isinstance(job, Transform):
        lines += [
            f"key: {RECORD_ID} (each input row's own record id: one result row per input row that passes)",
            "no merge hop, no state",
            "result table: append-only (each row an upsert of a new key; no retractions)",
        ]
    elif isinstance(job, Aggregation):
        lines.append(f"key: {plan.key} = {plan.key_sql} (results keyed by its string form; rows whose key is NULL are dropped)")
        lines.append("aggregates (each a combiner: a partial per key per micro-batch, merged in the merge hop):")
        for spec, aggregate in zip(plan.aggregates, job.aggregates, strict=True):
            combiner = type(aggregate.combiner).__name__ if isinstance(aggregate, Combine) else type(aggregate).__name__
            lines.append(f"  {spec.name} = {spec.sql}  ->  {combiner}  ({_state(spec.function)})")
        lines += [
            f"merge hop state, per key: [{', '.join(_state(s.function) for s in plan.aggregates)}] in the changelog",
            "result table: updating (an upsert per changed key; the key's old row is retracted first)",
        ]
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
