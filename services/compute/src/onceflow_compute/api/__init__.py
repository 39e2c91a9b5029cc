"""The job API: what a user writes (docs/jobs.md).

A job is a Python module with a module-level ``job``: one of

- an :class:`Aggregation`: an optional stateless ``prepare`` (DataFrame -> DataFrame), then a
  group key and aggregates whose partial state per key lives in the changelog-backed store;
- a :class:`Transform`: a stateless DataFrame -> DataFrame whose rows are the results;
- a :class:`Join`: two stateless sides (DataFrame -> DataFrame) joined on a column, both sides'
  rows kept per join key in the changelog-backed store, retracting what a later row changes.

Every aggregate is a combiner in four parts (init/add as Spark columns over one micro-batch,
merge and result over partials in the worker), so any split of the stream into batches gives
the same table: merge is associative and commutative, and the result depends on the merged
partial alone.
"""

from __future__ import annotations

from onceflow_compute.api.aggregates import Aggregate, Avg, Combine, Combiner, Count, Max, Min, Sum
from onceflow_compute.api.kinds import Aggregation, Job, Join, Transform
from onceflow_compute.api.rows import METADATA_COLUMNS, WINDOW_END, WINDOW_START, JSONValue, encode_json
from onceflow_compute.dataflow.joins import JoinKind
from onceflow_compute.dataflow.panes import Accumulation, Trigger
from onceflow_compute.dataflow.windows import GlobalWindows, Hopping, Sessions, Tumbling

__all__ = [
    # What a job module imports (docs/jobs.md).
    "Accumulation", "Aggregation", "Avg", "Combine", "Combiner", "Count", "GlobalWindows", "Hopping", "Join", "JoinKind",
    "Max", "Min", "Sessions", "Sum", "Transform", "Trigger", "Tumbling",
    # What the worker's hops share with job code: the job types and how rows are carried.
    "METADATA_COLUMNS", "WINDOW_END", "WINDOW_START", "Aggregate", "JSONValue", "Job", "encode_json",
]
