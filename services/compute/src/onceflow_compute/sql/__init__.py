"""SQL jobs (docs/sql.md): a .sql file of CREATE TABLE declarations and one query, analysed by
Spark's own parser and analyser, becomes an ordinary Aggregation or Transform."""

from __future__ import annotations

from onceflow_compute.sql.ddl import Column, Table
from onceflow_compute.sql.job import DistinctValues, SqlJob, compile_sql, load, load_text
from onceflow_compute.sql.plan import AggregateSpec, Plan
from onceflow_compute.sql.text import SqlError

PREFIX = "sql:"  # ONCEFLOW_COMPUTE_JOB=sql:path/to/file.sql

__all__ = ["PREFIX", "AggregateSpec", "Column", "DistinctValues", "Plan", "SqlError", "SqlJob", "Table", "compile_sql", "load", "load_text"]
