"""Finding the records a step fails on, by halving: the one bisection of compute.

Three steps use it: the Arrow parse of a micro-batch's payloads (frames.py), the casts of a
Parquet input's columns (batch/read.py) and the job's engine run (engine/run.py). Each is
tried on all rows first, so a clean batch costs one try; only a failing range is split, down
to single rows, and a row counts as failed only once it failed alone (ADR 0006).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class BisectionBudgetSpent(RuntimeError):
    """The budget of tries ran out before every failing row was isolated."""

    def __init__(self, budget: int, last_reason: str) -> None:
        super().__init__(f"not isolated within {budget} tries; last error: {last_reason}")
        self.budget = budget
        self.last_reason = last_reason


@dataclass
class Bisection(Generic[T]):
    # What each try that succeeded gave, in row order (the whole input's alone when nothing failed).
    outputs: list[T] = field(default_factory=list)
    # Row -> reason, for every row that failed alone.
    failed: dict[int, str] = field(default_factory=dict)


def bisect(
    rows: int,
    attempt: Callable[[int, int], T],
    reason: Callable[[Exception], str],
    budget: int | None = None,
) -> Bisection[T]:
    """Run ``attempt(start, stop)`` over the rows ``[0, rows)``; where it raises, run it on each
    half, down to single rows.

    ``reason(exc)`` names what a failing try says about its rows. It may raise instead, when
    no row can be to blame (a broken job, an unreachable engine): that ends the bisection.
    ``budget`` bounds the tries (None: unbounded); past it, :class:`BisectionBudgetSpent`.
    """
    found: Bisection[T] = Bisection()
    left = [budget]
    last_reason = [""]

    def run(start: int, stop: int) -> None:
        if start >= stop:
            return
        if left[0] is not None:
            if left[0] <= 0:
                raise BisectionBudgetSpent(budget or 0, last_reason[0])
            left[0] -= 1
        try:
            found.outputs.append(attempt(start, stop))
            return
        except Exception as exc:  # noqa: BLE001 - ``reason`` decides what a failure means
            last_reason[0] = reason(exc)
        if stop - start == 1:
            found.failed[start] = last_reason[0]
            return
        middle = (start + stop) // 2
        run(start, middle)
        run(middle, stop)

    run(0, rows)
    return found
