"""Nexmark q7, highest bid: the highest bid price in each tumbling window of event time.

Windows are 10 s (the specification's 10 minutes, scaled to test-sized streams); a window's row
fires when the watermark passes its end, and late bids within the allowed lateness refine it
with a retraction. Event time is the bid's own ``date_time``."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Count, Max, Tumbling


def bids(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "bid").select(F.lit("all").alias("scope"), "price", "date_time")


job = Aggregation(
    name="nexmark_q7",
    schema=pa.schema(
        [
            pa.field("kind", pa.string(), nullable=False),
            pa.field("price", pa.int64()),
            pa.field("date_time", pa.int64(), nullable=False),
        ]
    ),
    key="scope",
    aggregates=(Max("price", name="highest"), Count("bids")),
    prepare=bids,
    window=Tumbling(10_000),
    allowed_lateness_ms=5_000,
    time_column="date_time",
    doc="Nexmark q7: the highest bid in each 10 s tumbling window (and how many bids it beat).",
)
