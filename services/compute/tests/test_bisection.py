"""The one bisection (bisection.py) that the parse, the Parquet casts and the engine run share:
a clean input costs one try, a row fails only once it failed alone, the budget bounds the
tries, and a failure no row is to blame for ends it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from onceflow_compute.bisection import BisectionBudgetSpent, bisect

pytestmark = pytest.mark.compute


def failing_on(bad: set[int], tries: list[tuple[int, int]]) -> Callable[[int, int], list[int]]:
    """An attempt that fails on any range holding a bad row, recording each try."""

    def attempt(start: int, stop: int) -> list[int]:
        tries.append((start, stop))
        if bad & set(range(start, stop)):
            raise ValueError(f"bad in {start}-{stop}")
        return list(range(start, stop))

    return attempt


def test_a_clean_input_costs_one_try() -> None:
    tries: list[tuple[int, int]] = []
    found = bisect(10, failing_on(set(), tries), str)
    assert tries == [(0, 10)]
    assert found.outputs == [list(range(10))] and found.failed == {}


def test_failing_rows_are_isolated_and_the_rest_kept_in_order() -> None:
    tries: list[tuple[int, int]] = []
    found = bisect(8, failing_on({2, 5}, tries), str)
    assert found.failed == {2: "bad in 2-3", 5: "bad in 5-6"}
    assert [row for output in found.outputs for row in output] == [0, 1, 3, 4, 6, 7]
    assert tries[0] == (0, 8)


def test_no_rows_no_try() -> None:
    tries: list[tuple[int, int]] = []
    assert bisect(0, failing_on({0}, tries), str).failed == {} and tries == []


def test_the_budget_bounds_the_tries() -> None:
    tries: list[tuple[int, int]] = []
    with pytest.raises(BisectionBudgetSpent) as spent:
        bisect(64, failing_on(set(range(64)), tries), str, budget=5)
    assert len(tries) == 5
    assert spent.value.last_reason.startswith("bad in")


def test_a_reason_that_raises_ends_the_bisection() -> None:
    tries: list[tuple[int, int]] = []

    def nobody_to_blame(exc: Exception) -> str:
        raise RuntimeError("the job is broken") from exc

    with pytest.raises(RuntimeError, match="the job is broken"):
        bisect(8, failing_on({3}, tries), nobody_to_blame)
    assert tries == [(0, 8)]
