"""Streaming joins with retractions. The seed's FULL OUTER JOIN example reproduces its rows,
undo rows included; in any arrival order the folded changes equal the batch join."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_compute.dataflow.joins import JoinChange, JoinKind, StreamJoin

pytestmark = pytest.mark.dataflow

# The seed (000_d1873164d4999a46.txt): Left and Right tables of Num, Id, Time (arrival time).
LEFT = [(1, "L1", "12:02"), (2, "L2", "12:06"), (3, "L3", "12:03")]
RIGHT = [(2, "R2", "12:01"), (3, "R3", "12:04"), (4, "R4", "12:05")]


def test_the_seeds_streaming_full_outer_join_gives_its_rows_undo_included() -> None:
    join = StreamJoin(JoinKind.FULL)
    arrivals = sorted([("L", *r) for r in LEFT] + [("R", *r) for r in RIGHT], key=lambda a: a[3])
    rows = []
    for side, num, row_id, time in arrivals:
        changes = (join.add_left if side == "L" else join.add_right)(str(num), row_id)
        rows += [(c.left, c.right, time, "undo" if c.op == "-" else "") for c in changes]
    assert rows == [
        (None, "R2", "12:01", ""),
        ("L1", None, "12:02", ""),
        ("L3", None, "12:03", ""),
        ("L3", None, "12:04", "undo"),
        ("L3", "R3", "12:04", ""),
        (None, "R4", "12:05", ""),
        (None, "R2", "12:06", "undo"),
        ("L2", "R2", "12:06", ""),
    ]
    # Its final table is the batch join's.
    assert fold_changes(rows) == Counter({("L1", None): 1, ("L2", "R2"): 1, ("L3", "R3"): 1, (None, "R4"): 1})


def fold_changes(rows: list[tuple]) -> Counter:
    table: Counter = Counter()
    for left, right, _time, undo in rows:
        table[(left, right)] += -1 if undo else 1
        assert table[(left, right)] >= 0, f"retracted a row that is not there: {(left, right)}"
    return +table


def batch_join(kind: JoinKind, left: list[tuple[str, str]], right: list[tuple[str, str]]) -> Counter:
    table: Counter = Counter()
    for lk, lrow in left:
        partners = [rrow for rk, rrow in right if rk == lk]
        for rrow in partners:
            table[(lrow, rrow)] += 1
        if not partners and kind.keeps_unmatched_left:
            table[(lrow, None)] += 1
    for rk, rrow in right:
        if kind.keeps_unmatched_right and not any(lk == rk for lk, _ in left):
            table[(None, rrow)] += 1
    return table


sides = st.lists(st.tuples(st.sampled_from("LR"), st.sampled_from("abc")), max_size=25)


@given(sides, st.sampled_from(list(JoinKind)))
@settings(max_examples=300)
def test_folded_changes_equal_the_batch_join_after_every_arrival(arrivals: list[tuple[str, str]], kind: JoinKind) -> None:
    join = StreamJoin(kind)
    table: Counter = Counter()
    left: list[tuple[str, str]] = []
    right: list[tuple[str, str]] = []
    for i, (side, key) in enumerate(arrivals):
        row = f"{side}{i}"
        changes = join.add_left(key, row) if side == "L" else join.add_right(key, row)
        (left if side == "L" else right).append((key, row))
        for change in changes:
            table[(change.left, change.right)] += 1 if change.op == "+" else -1
            assert table[(change.left, change.right)] >= 0
        assert +table == batch_join(kind, left, right)


def test_inner_join_never_retracts() -> None:
    join = StreamJoin(JoinKind.INNER)
    assert join.add_left("k", "l1") == []
    assert join.add_right("k", "r1") == [JoinChange("+", "l1", "r1")]
    assert join.add_right("k", "r2") == [JoinChange("+", "l1", "r2")]


def test_retention_bounds_state_and_expired_rows_find_no_new_partners() -> None:
    join = StreamJoin(JoinKind.LEFT, retention_ms=100)
    join.add_left("k", "old", event_time_ms=0)
    join.add_left("k", "new", event_time_ms=150)
    assert join.expire(watermark=200) == 1 and join.rows_in_state() == 1
    assert join.add_right("k", "r", event_time_ms=200) == [JoinChange("-", "new", None), JoinChange("+", "new", "r")]


def test_snapshot_and_restore() -> None:
    join = StreamJoin(JoinKind.FULL)
    join.add_left("k", {"id": 1}, 5)
    again = StreamJoin(JoinKind.FULL)
    again.restore("k", join.snapshot("k"))
    assert again.add_right("k", "r") == [JoinChange("-", {"id": 1}, None), JoinChange("+", {"id": 1}, "r")]
    assert StreamJoin(JoinKind.FULL).snapshot("k") is None
