"""Per-user totals: the sum, count and extremes of ``amount`` per ``user``."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Count, Max, Min, Sum

job = Aggregation(
    name="usersum",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)]),
    key="user",
    aggregates=(Sum("amount", name="total"), Count("count"), Min("amount", name="smallest"), Max("amount", name="largest")),
    doc="Total, count, smallest and largest amount per user.",
)
