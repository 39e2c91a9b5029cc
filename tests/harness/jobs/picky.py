"""Per-user sums with a user-defined combiner that raises on the amount 13: the Spark job fails
on any batch holding one, so the worker has to find those records and dead-letter them alone."""

import pyarrow as pa

from onceflow_compute.api import Aggregation, Combine, Count


class SumButNotThirteen:
    def init(self) -> int:
        return 0

    def add(self, acc: int, value: int) -> int:
        if value == 13:
            raise ValueError("13 is an unlucky amount")
        return acc + value

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> int:
        return acc


job = Aggregation(
    name="picky",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)]),
    key="user",
    aggregates=(Combine("amount", name="total", combiner=SumButNotThirteen()), Count("count")),
)
