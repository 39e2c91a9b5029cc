"""Nexmark q5, hot items (its counting stage): bids per auction over sliding windows of event
time, 10 s long, every 2 s. The hottest auction of a window is the row with the most bids
among that window's rows (``onceflow query scan nexmark_q5``)."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Count, Hopping


def bids(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "bid").select("auction", "date_time")


job = Aggregation(
    name="nexmark_q5",
    schema=pa.schema(
        [
            pa.field("kind", pa.string(), nullable=False),
            pa.field("auction", pa.int64()),
            pa.field("date_time", pa.int64(), nullable=False),
        ]
    ),
    key="auction",
    aggregates=(Count("bids"),),
    prepare=bids,
    window=Hopping(10_000, 2_000),
    allowed_lateness_ms=5_000,
    time_column="date_time",
    doc="Nexmark q5 (counting stage): bids per auction in 10 s windows sliding every 2 s.",
)
