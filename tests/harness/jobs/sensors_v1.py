"""Per-sensor count, sum, min and max: the job of issue 38's scenario, before it changes
(tests/test_lifecycle.py; v2 reorders and adds an aggregate, v3 only reorders)."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Count, Max, Min, Sum

SCHEMA = pa.schema([pa.field("sensor", pa.string(), nullable=False), pa.field("value", pa.int64(), nullable=False)])

job = Aggregation(
    name="sensors",
    schema=SCHEMA,
    key="sensor",
    aggregates=(Count("n"), Sum("value", name="total"), Min("value", name="lo"), Max("value", name="hi")),
    doc="Readings per sensor.",
)
