"""The Nexmark event stream as the Nexmark jobs read it (one JSON object per event, ``kind``
saying which: ``onceflow_tools.workloads.nexmark``), and each kind's rows."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# Every field any query reads; an event carries its kind's and the others are null.
SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("city", pa.string()),
        pa.field("state", pa.string()),
        pa.field("seller", pa.int64()),
        pa.field("category", pa.int64()),
        pa.field("expires", pa.int64()),
        pa.field("auction", pa.int64()),
        pa.field("bidder", pa.int64()),
        pa.field("price", pa.int64()),
        pa.field("channel", pa.string()),
        pa.field("date_time", pa.int64(), nullable=False),
    ]
)


def bids(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "bid")


def auctions(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "auction")


def persons(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "person")
