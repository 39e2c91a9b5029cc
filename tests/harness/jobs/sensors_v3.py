"""sensors_v1 with its aggregates reordered and a new doc string: carried over by name."""

from onceflow_compute.api import Aggregation, Count, Max, Min, Sum
from tests.harness.jobs.sensors_v1 import SCHEMA

job = Aggregation(
    name="sensors",
    schema=SCHEMA,
    key="sensor",
    aggregates=(Sum("value", name="total"), Max("value", name="hi"), Count("n"), Min("value", name="lo")),
    doc="Readings per sensor, the total first.",
)
