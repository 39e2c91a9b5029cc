"""Payments per user: a second aggregation over usersum's input, so two jobs can run side by
side on one dedup.records (tests/test_compute.py)."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Count

job = Aggregation(
    name="usercount",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)]),
    key="user",
    aggregates=(Count("payments"),),
    doc="Payments per user.",
)
