"""Pure logic of the job API: any split of a stream into micro-batches, merged in any grouping,
gives the row one batch over everything gives. The pandas engine computes the partials, so
no JVM is needed here; the Spark engine's partials are compared in the integration tests."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_compute.api import Aggregation, Avg, Combine, Count, Max, Min, Sum, encode_json
from onceflow_compute.engine.pandas_engine import PandasEngine
from onceflow_compute.merge.partials import partials_by_key

pytestmark = pytest.mark.compute


class Distinct:
    """A user-defined combiner: the sorted distinct values."""

    def init(self) -> list[int]:
        return []

    def add(self, acc: list[int], value: int) -> list[int]:
        return sorted(set(acc) | {value})

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return sorted(set(a) | set(b))

    def result(self, acc: list[int]) -> int:
        return len(acc)


JOB = Aggregation(
    name="all",
    schema=pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("amount", pa.int64(), nullable=False)]),
    key="user",
    aggregates=(
        Count("count"), Sum("amount", name="total"), Min("amount", name="low"), Max("amount", name="high"),
        Avg("amount", name="mean"), Combine("amount", name="distinct", combiner=Distinct()),
    ),
)

rows = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(-1000, 1000)), max_size=60)


def table_of(items: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"user": [u for u, _ in items], "amount": pa.array([a for _, a in items], pa.int64())})


def fold(batches: list[list[tuple[str, int]]]) -> dict[str, dict]:
    """What the merge hop does: merge each batch's partials into the state per key."""
    engine = PandasEngine()
    state: dict[str, list] = {}
    for batch in batches:
        if not batch:
            continue
        for key, _bucket, partials in partials_by_key(JOB, engine.partials(JOB, table_of(batch))):
            partials = json.loads(encode_json(partials))  # what the changelog round trip gives
            state[key] = JOB.merge(state[key], partials) if key in state else partials
    return {key: JOB.row(key, partials) for key, partials in state.items()}


def expected(items: list[tuple[str, int]]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for user in {u for u, _ in items}:
        amounts = [a for u, a in items if u == user]
        out[user] = {
            "user": user, "count": len(amounts), "total": sum(amounts), "low": min(amounts), "high": max(amounts),
            "mean": sum(amounts) / len(amounts), "distinct": len(set(amounts)),
        }
    return out


@settings(max_examples=150, deadline=None)
@given(items=rows, cuts=st.lists(st.integers(0, 60), max_size=8))
def test_any_split_into_batches_gives_the_table_of_one_batch(items: list[tuple[str, int]], cuts: list[int]) -> None:
    bounds = sorted({0, len(items), *(c for c in cuts if c < len(items))})
    batches = [items[a:b] for a, b in zip(bounds, bounds[1:])]
    assert fold(batches) == expected(items)


@given(a=st.integers(), b=st.integers(), c=st.integers())
def test_merge_is_associative_and_commutative(a: int, b: int, c: int) -> None:
    for aggregate in JOB.aggregates:
        pa_, pb, pc = ([x, 1] if isinstance(aggregate, Avg) else [x] if isinstance(aggregate, Combine) else x for x in (a, b, c))
        assert aggregate.merge(aggregate.merge(pa_, pb), pc) == aggregate.merge(pa_, aggregate.merge(pb, pc))
        assert aggregate.merge(pa_, pb) == aggregate.merge(pb, pa_)


def test_nulls_are_skipped_as_in_sql() -> None:
    total = Sum("amount")
    assert total.merge(None, 3) == 3 and total.merge(3, None) == 3 and total.merge(None, None) is None
    assert Avg("amount").result([None, 0]) is None


def test_a_job_needs_distinct_aggregate_names() -> None:
    with pytest.raises(ValueError, match="distinct names"):
        Aggregation(name="bad", schema=JOB.schema, key="user", aggregates=(Count("n"), Sum("amount", name="n")))
    with pytest.raises(ValueError, match="distinct names"):
        Aggregation(name="bad", schema=JOB.schema, key="user", aggregates=(Count("user"),))
