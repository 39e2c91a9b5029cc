"""Nexmark q5, hot items: the auctions with the most bids in each sliding window of event time,
10 s long, every 2 s (the specification's 60 min every 1 min, scaled to test-sized streams).

One row per window (key ``all``): a combiner counts bids per auction, and the row names the
auctions with the highest count (all of them on a tie, as the specification's query does)."""

from collections import Counter
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Combine, Hopping


class HotAuctions:
    def init(self) -> dict[str, int]:
        return {}

    def add(self, acc: dict[str, int], auction: Any) -> dict[str, int]:
        if auction is not None:
            acc[str(auction)] = acc.get(str(auction), 0) + 1
        return acc

    def merge(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return dict(Counter(a) + Counter(b))

    def result(self, acc: dict[str, int]) -> dict[str, Any]:
        most = max(acc.values(), default=0)
        return {"auctions": sorted(int(a) for a, n in acc.items() if n == most), "bids": most}


def bids(events: DataFrame) -> DataFrame:
    return events.where(F.col("kind") == "bid").select(F.lit("all").alias("scope"), "auction", "date_time")


job = Aggregation(
    name="nexmark_q5",
    schema=pa.schema(
        [
            pa.field("kind", pa.string(), nullable=False),
            pa.field("auction", pa.int64()),
            pa.field("date_time", pa.int64(), nullable=False),
        ]
    ),
    key="scope",
    aggregates=(Combine("auction", name="hottest", combiner=HotAuctions()),),
    prepare=bids,
    window=Hopping(10_000, 2_000),
    allowed_lateness_ms=5_000,
    time_column="date_time",
    doc="Nexmark q5: the auctions with the most bids in each 10 s window sliding every 2 s.",
)
