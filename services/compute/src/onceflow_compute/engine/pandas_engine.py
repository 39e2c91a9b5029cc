"""The pandas engine: the same aggregation in plain pandas, in the worker's process."""

from __future__ import annotations

import pyarrow as pa

from onceflow_compute.api import Aggregation, Join, Transform
from onceflow_compute.engine import KEY, partial_columns


class PandasEngine:
    """The same aggregation in plain pandas, in the worker's process: no JVM, no per-batch
    job. Jobs with a Spark ``prepare`` or a transform cannot run here."""

    name = "pandas"

    def partials(self, job: Aggregation, table: pa.Table) -> pa.Table:
        if job.prepare is not None or job.windowed:
            raise ValueError(f"job {job.name}: the pandas engine runs only unwindowed aggregations without prepare")
        frame = table.to_pandas()
        frame = frame[frame[job.key].notna()]
        groups = frame.groupby(frame[job.key].astype(str), sort=False)
        series = [s for aggregate in job.aggregates for s in aggregate.pandas(groups)]
        arrays = {KEY: pa.array(series[0].index.astype(str))} if series else {}
        for name, s in zip(partial_columns(job), series, strict=True):
            arrays[name] = pa.array(s.to_numpy(), from_pandas=True)
        return pa.table(arrays)

    def transform(self, job: Transform, table: pa.Table) -> pa.Table:
        raise ValueError(f"job {job.name}: transforms need the Spark engine")

    def join_rows(self, job: Join, table: pa.Table) -> pa.Table:
        raise ValueError(f"job {job.name}: joins need the Spark engine")

    def close(self) -> None:
        pass
