"""A job naming a stream nobody created (tests/test_streams.py): refused at start, naming it."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Count

job = Aggregation(
    name="lost",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False)]),
    key="user",
    aggregates=(Count("n"),),
    stream="nosuch",
)
