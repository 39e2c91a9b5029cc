"""What runs a job over one micro-batch: Spark (the product, spark.py) or pandas (the in-process
baseline the benchmark measures Spark's per-batch overhead against, pandas_engine.py); and
run.py, the job over one table on either, bisected when it raises.

An engine returns Arrow: for an aggregation one row per group key (column ``__key``, then the
aggregates' partial columns in order), for a transform the transform's rows.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from onceflow_compute.api import Aggregation, Join, Transform

KEY = "__key"
# A windowed job's partials are per key and event-time bucket (windows.time_grain).
BUCKET = "__bucket"
# A join's rows: which side (JoinRow.Side), the join column (KEY), event time, the row as JSON.
SIDE = "__side"
TIME = "__time"
ROW = "__row"


class EngineStalled(RuntimeError):
    """A micro-batch the engine did not finish within its timeout, and cancelled: the cluster
    cannot run it (no executor accepted it, or the master and executors are gone). No record
    is to blame."""


class Engine(Protocol):
    name: str

    def partials(self, job: Aggregation, table: pa.Table) -> pa.Table: ...

    def transform(self, job: Transform, table: pa.Table) -> pa.Table: ...

    def join_rows(self, job: Join, table: pa.Table) -> pa.Table: ...

    def close(self) -> None: ...


def partial_columns(job: Aggregation) -> list[str]:
    return [f"a{i}_{j}" for i, aggregate in enumerate(job.aggregates) for j in range(aggregate.width)]


class EngineUnavailable(EngineStalled):
    """Spark is out of reach (a master that does not answer, a Spark Connect server that is down
    or restarted, a context Spark shut down): the batch did not run. The engine opens a new
    session on the next call."""
