"""Nexmark q1, currency conversion: every bid with its price in euros (the specification's
rate: 89 euro cents to the dollar, integer arithmetic)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Transform
from onceflow_compute.jobs._nexmark import SCHEMA, bids

DOLLAR_TO_EURO_PERCENT = 89


def in_euros(events: DataFrame) -> DataFrame:
    euros = F.expr(f"price * {DOLLAR_TO_EURO_PERCENT} div 100").alias("price")
    return bids(events).select("_record_id", "auction", "bidder", euros, "date_time")


job = Transform(
    name="nexmark_q1",
    schema=SCHEMA,
    key="_record_id",
    transform=in_euros,
    doc="Nexmark q1: every bid, its price converted to euros.",
)
