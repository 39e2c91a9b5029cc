"""Batch mode (``onceflow batch``): a job over a bounded file as one Spark job, giving the table
the streaming pipeline converges to (docs/jobs.md#batch-mode). Reading: read.py; running: run.py.
"""

from __future__ import annotations

from onceflow_compute.batch.read import BatchInput, read_input, read_jsonl, read_parquet, resolve_format
from onceflow_compute.batch.run import BatchResult, run_batch, run_table
from onceflow_compute.engine.run import JobFailed
from onceflow_compute.engine.spark import SessionEngine, as_engine, spark_engine

__all__ = [
    "BatchInput", "BatchResult", "JobFailed", "SessionEngine", "as_engine", "read_input", "read_jsonl", "read_parquet",
    "resolve_format", "run_batch", "run_table", "spark_engine",
]
