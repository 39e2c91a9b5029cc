"""sensors_v1 redeployed under the same name with its aggregates reordered and one added
(issue 38): state it cannot read, so compute refuses it."""

from onceflow_compute.api import Aggregation, Avg, Count, Max, Min, Sum
from tests.harness.jobs.sensors_v1 import SCHEMA

job = Aggregation(
    name="sensors",
    schema=SCHEMA,
    key="sensor",
    aggregates=(Sum("value", name="total"), Count("n"), Avg("value", name="avg"), Max("value", name="hi"), Min("value", name="lo")),
)
