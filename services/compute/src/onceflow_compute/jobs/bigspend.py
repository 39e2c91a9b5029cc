"""A stateless transform: every payment of 100 or more, keyed by its record id."""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow_compute.api import Transform


def large(payments: DataFrame) -> DataFrame:
    return payments.where(F.col("amount") >= 100).select("_record_id", "user", "amount")


job = Transform(
    name="bigspend",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)]),
    key="_record_id",
    transform=large,
    doc="Payments of 100 or more, one row per payment.",
)
