"""Nexmark bids per auction, over all time: how many bids, the highest and the total volume.

The input is the whole Nexmark stream (persons, auctions and bids as JSON objects with a
``kind``); ``prepare`` keeps the bids. Prices are in cents."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Count, Max, Sum


def bids(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "bid").select("auction", "price")


job = Aggregation(
    name="auctionbids",
    schema=pa.schema(
        [
            pa.field("kind", pa.string(), nullable=False),
            # Only bids carry these; persons and auctions leave them null.
            pa.field("auction", pa.int64()),
            pa.field("price", pa.int64()),
        ]
    ),
    key="auction",
    aggregates=(Count("bids"), Max("price", name="highest"), Sum("price", name="volume")),
    prepare=bids,
    doc="Per Nexmark auction: bids, the highest bid and the bid volume (cents).",
)
