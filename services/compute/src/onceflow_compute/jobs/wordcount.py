"""Word count: lines of text in, a running count per word out. The group key (a word) is not
the input's key, so the partials go through the compute.partials.<job> shuffle to the word's owner."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Aggregation, Count


def words(lines: DataFrame) -> DataFrame:
    split = F.split(F.lower(F.col("text")), r"[^a-z0-9']+")
    return lines.select(F.explode(split).alias("word")).where(F.col("word") != "")


job = Aggregation(
    name="wordcount",
    schema=pa.schema([pa.field("text", pa.string(), nullable=False)]),
    key="word",
    aggregates=(Count("count"),),
    prepare=words,
    doc="Occurrences of each word (lowercased; split on anything but letters, digits and ').",
)
