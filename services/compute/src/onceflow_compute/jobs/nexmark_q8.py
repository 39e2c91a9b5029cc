"""Nexmark q8, monitor new users: people who opened an auction in the same 10 s tumbling window
of event time as they registered (the specification's 12 hours, scaled to test-sized streams).
A windowed join: a window's rows are dropped once the watermark passes its end plus the allowed
lateness, and records later than that go to compute.late."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Join, JoinKind, Tumbling
from onceflow_compute.jobs._nexmark import SCHEMA, auctions, persons


def new_people(events: DataFrame) -> DataFrame:
    return persons(events).select(F.col("id").alias("person"), "name", "date_time")


def new_auctions(events: DataFrame) -> DataFrame:
    return auctions(events).select(F.col("id").alias("auction"), F.col("seller").alias("person"), "date_time")


job = Join(
    name="nexmark_q8",
    schema=SCHEMA,
    left=new_people,
    right=new_auctions,
    on="person",
    left_id="person",
    right_id="auction",
    how=JoinKind.INNER,
    window=Tumbling(10_000),
    allowed_lateness_ms=5_000,
    time_column="date_time",
    doc="Nexmark q8: people who registered and opened an auction in the same 10 s window.",
)
