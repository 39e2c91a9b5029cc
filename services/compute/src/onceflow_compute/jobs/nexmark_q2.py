"""Nexmark q2, selection: the bids on a few auctions (those whose id is a multiple of the
specification's 123)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Transform
from onceflow_compute.jobs._nexmark import SCHEMA, bids

AUCTION_MODULUS = 123


def selected(events: DataFrame) -> DataFrame:
    return bids(events).where(F.col("auction") % AUCTION_MODULUS == 0).select("_record_id", "auction", "price")


job = Transform(
    name="nexmark_q2",
    schema=SCHEMA,
    key="_record_id",
    transform=selected,
    doc="Nexmark q2: the bids on auctions whose id is a multiple of 123.",
)
