"""Nexmark q3, local item suggestion: who sells in category 10 in Oregon, Idaho or California.
An incremental join of auctions with their sellers: each auction joins its seller whichever
arrives first, and both are kept (the global window), so a late seller still finds them."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Join, JoinKind
from onceflow_compute.jobs._nexmark import SCHEMA, auctions, persons

CATEGORY = 10
STATES = ("OR", "ID", "CA")


def category_auctions(events: DataFrame) -> DataFrame:
    return auctions(events).where(F.col("category") == CATEGORY).select(
        F.col("id").alias("auction"), F.col("seller").alias("person"), "date_time"
    )


def local_sellers(events: DataFrame) -> DataFrame:
    return persons(events).where(F.col("state").isin(*STATES)).select(
        F.col("id").alias("person"), "name", "city", "state", "date_time"
    )


job = Join(
    name="nexmark_q3",
    schema=SCHEMA,
    left=category_auctions,
    right=local_sellers,
    on="person",
    left_id="auction",
    right_id="person",
    how=JoinKind.INNER,
    time_column="date_time",
    doc="Nexmark q3: auctions in category 10 joined with their sellers in OR, ID or CA.",
)
