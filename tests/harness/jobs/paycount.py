"""Payments per payer, on stream ``payments`` (tests/test_streams.py): its schema is not
usersum's, so a record of the other stream reaching either job would be a dead letter."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Count, Sum

job = Aggregation(
    name="paycount",
    schema=pa.schema([pa.field("payer", pa.string(), nullable=False), pa.field("cents", pa.int64(), nullable=False)]),
    key="payer",
    aggregates=(Count("payments"), Sum("cents", "cents")),
    doc="Payments and cents per payer, from stream payments.",
    stream="payments",
)
