"""Nexmark q0, pass-through: every event as it came, one row per record. It measures what the
pipeline itself costs."""

from pyspark.sql import DataFrame

from onceflow_compute.api import Transform
from onceflow_compute.jobs._nexmark import SCHEMA


def everything(events: DataFrame) -> DataFrame:
    return events.select("_record_id", *SCHEMA.names)


job = Transform(
    name="nexmark_q0",
    schema=SCHEMA,
    key="_record_id",
    transform=everything,
    doc="Nexmark q0: every event passed through, keyed by record id.",
)
