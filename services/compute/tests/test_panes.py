"""Triggers and accumulation: whatever order records arrive in, and however they are split into
batches, what the firings add up to is the batch answer; on-time, early and late panes come when
they should; records past the allowed lateness are refused and counted."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_compute.dataflow.panes import Accumulation, Firing, Timing, Trigger, WindowedAggregation
from onceflow_compute.dataflow.windows import GLOBAL, GlobalWindows, Hopping, Sessions, Tumbling, Window, WindowFn

pytestmark = pytest.mark.dataflow

WINDOW_FNS = [Tumbling(100), Hopping(100, 25), Sessions(40), GlobalWindows()]


def summing(windows: WindowFn, accumulation: Accumulation, **kwargs) -> WindowedAggregation:
    return WindowedAggregation(
        windows, lambda a, b: a + b, lambda key, window, acc: {"key": key, "sum": acc}, accumulation=accumulation, **kwargs
    )


def batch_answer(windows: WindowFn, events: list[tuple[str, int, int]]) -> dict[tuple[str, Window], int]:
    """Computed without the engine: assign, then (sessions) join records closer than the gap."""
    table: dict[tuple[str, Window], int] = defaultdict(int)
    if isinstance(windows, Sessions):
        by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for key, t, v in events:
            by_key[key].append((t, v))
        for key, items in by_key.items():
            items.sort()
            start = end = None
            total = 0
            for t, v in items:
                if end is not None and t < end:
                    end, total = max(end, t + windows.gap_ms), total + v
                    continue
                if start is not None:
                    table[(key, Window(start, end))] = total
                start, end, total = t, t + windows.gap_ms, v
            table[(key, Window(start, end))] = total
        return dict(table)
    for key, t, v in events:
        for window in windows.assign(t):
            table[(key, window)] += v
    return dict(table)


def final_window(expected: dict[tuple[str, Window], int], key: str, window: Window) -> Window:
    (final,) = [w for k, w in expected if k == key and w.start <= window.start and window.end <= w.end]
    return final


def feed(
    engine: WindowedAggregation, arrivals: list[tuple[str, int, int]], batch: int, bound: int, newest: int | None = None, now: int = 0
) -> tuple[list[Firing], int | None, int]:
    """Feed batches; the watermark after each is the newest event time seen minus ``bound``."""
    firings = []
    for i in range(0, len(arrivals), batch):
        for key, t, v in arrivals[i : i + batch]:
            engine.add(key, t, v)
            newest = t if newest is None else max(newest, t)
        now += 10
        engine.advance_watermark(None if newest is None else newest - bound)
        firings += engine.fire(now)
    return firings, newest, now


def flush(engine: WindowedAggregation, now: int) -> list[Firing]:
    """End of a bounded input: the watermark passes everything."""
    engine.advance_watermark(2**61)
    return engine.fire(now + 10)


def run(engine: WindowedAggregation, arrivals: list[tuple[str, int, int]], batch: int, bound: int) -> list[Firing]:
    firings, _newest, now = feed(engine, arrivals, batch, bound)
    return firings + flush(engine, now)


def folded(firings: list[Firing], accumulation: Accumulation) -> dict[tuple[str, Window], int]:
    """The table the firings leave behind, read the way each mode means it."""
    table: dict[tuple[str, Window], int] = {}
    for f in firings:
        if accumulation is Accumulation.DISCARDING:
            table[(f.key, f.window)] = table.get((f.key, f.window), 0) + f.partial
            continue
        for window, row in f.retractions:
            assert table.pop((f.key, window)) == row["sum"], "a retraction must withdraw the row it names"
        if accumulation is Accumulation.RETRACTING:
            assert (f.key, f.window) not in table, "upserted twice without a retraction"
        table[(f.key, f.window)] = f.row["sum"]
    return table


events_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 1_000), st.integers(1, 9)), min_size=1, max_size=40
)


@given(
    events_strategy,
    st.randoms(use_true_random=False),
    st.integers(1, 10),
    st.sampled_from(WINDOW_FNS),
    st.sampled_from(list(Accumulation)),
    st.sampled_from([None, 0, 15]),
)
@settings(max_examples=400, deadline=None)
def test_the_final_table_never_depends_on_the_arrival_order(events, rng, batch, windows, accumulation, early) -> None:
    arrivals = list(events)
    rng.shuffle(arrivals)
    # Allowed lateness covers the whole input: nothing is dropped, late data refines late panes.
    engine = summing(windows, accumulation, trigger=Trigger(early_every_ms=early), allowed_lateness_ms=10_000)
    if windows == GlobalWindows() and early is None:
        engine.trigger = Trigger(early_every_ms=0)  # the global window only ever fires early
    firings = run(engine, arrivals, batch, bound=50)
    expected = batch_answer(windows, events)
    if accumulation is Accumulation.DISCARDING and windows.merging:
        # Discarded panes are deltas: each counts toward the final session that contains its window.
        firings = [replace(f, window=final_window(expected, f.key, f.window)) for f in firings]
    table = folded(firings, accumulation)
    if accumulation is Accumulation.ACCUMULATING and windows.merging:
        # Without retractions, rows of sessions that merged later stay behind: the final
        # sessions' rows are right, the stale ones are what the retracting mode exists for.
        table = {k: v for k, v in table.items() if k in expected}
    assert table == expected
    assert engine.too_late == 0


def test_on_time_pane_fires_once_when_the_watermark_passes_the_end() -> None:
    engine = summing(Tumbling(100), Accumulation.RETRACTING)
    engine.add("k", 10, 1)
    engine.add("k", 60, 2)
    engine.advance_watermark(99)
    assert engine.fire(0) == []
    engine.advance_watermark(100)
    (firing,) = engine.fire(1)
    assert (firing.window, firing.timing, firing.index, firing.row, firing.retractions) == (
        Window(0, 100), Timing.ON_TIME, 0, {"key": "k", "sum": 3}, ()
    )
    assert engine.fire(2) == []


def test_early_firings_every_n_ms_of_processing_time_then_on_time_then_late() -> None:
    engine = summing(Tumbling(100), Accumulation.RETRACTING, trigger=Trigger(early_every_ms=50), allowed_lateness_ms=100)
    engine.add("k", 10, 1)
    assert [f.timing for f in engine.fire(now_ms=0)] == [Timing.EARLY]
    engine.add("k", 20, 1)
    assert engine.fire(now_ms=30) == []  # not 50 ms since the last early pane
    (early,) = engine.fire(now_ms=60)
    assert (early.timing, early.row["sum"], early.retractions) == (Timing.EARLY, 2, ((Window(0, 100), {"key": "k", "sum": 1}),))
    engine.add("k", 30, 1)
    engine.advance_watermark(120)
    (on_time,) = engine.fire(now_ms=70)
    assert (on_time.timing, on_time.row["sum"], on_time.index) == (Timing.ON_TIME, 3, 2)
    assert engine.add("k", 40, 5)  # late, but within allowed lateness
    (late,) = engine.fire(now_ms=80)
    assert (late.timing, late.row["sum"], late.retractions) == (Timing.LATE, 8, ((Window(0, 100), {"key": "k", "sum": 3}),))


def test_a_late_record_that_leaves_the_row_as_it_was_fires_nothing() -> None:
    """Retracting a row to upsert the same row again says nothing (and would read as a duplicate)."""
    engine = WindowedAggregation(
        Tumbling(100), max, lambda key, window, acc: {"key": key, "max": acc}, allowed_lateness_ms=100
    )
    engine.add("k", 10, 7)
    engine.advance_watermark(100)
    assert [f.row["max"] for f in engine.fire(0)] == [7]
    assert engine.add("k", 20, 3)  # late, and below the maximum
    assert engine.fire(1) == [] and "k" in engine.changed_keys
    assert engine.add("k", 30, 9)
    (late,) = engine.fire(2)
    assert (late.row["max"], late.retractions) == (9, ((Window(0, 100), {"key": "k", "max": 7}),))


def test_records_past_allowed_lateness_are_refused_and_their_windows_dropped() -> None:
    engine = summing(Tumbling(100), Accumulation.ACCUMULATING, allowed_lateness_ms=50)
    engine.add("k", 10, 1)
    engine.advance_watermark(149)
    engine.fire(0)
    assert engine.add("k", 20, 1)  # window [0,100) expires at 150
    engine.advance_watermark(150)
    assert [f.timing for f in engine.fire(1)] == [Timing.LATE] and engine.keys() == []
    assert not engine.add("k", 99, 1)
    assert engine.add("k", 100, 1)  # the next window is still open
    assert engine.too_late == 1


def test_discarding_panes_carry_only_what_is_new() -> None:
    engine = summing(Tumbling(100), Accumulation.DISCARDING, trigger=Trigger(early_every_ms=0), allowed_lateness_ms=1_000)
    engine.add("k", 10, 1)
    engine.fire(0)
    engine.add("k", 11, 2)
    engine.advance_watermark(100)
    engine.add("k", 12, 4)
    engine.fire(1)
    engine.add("k", 13, 8)
    panes = engine.fire(2)
    assert [(f.timing, f.partial) for f in panes] == [(Timing.LATE, 8)]


def test_merging_sessions_retract_the_rows_of_the_sessions_they_join() -> None:
    engine = summing(Sessions(10), Accumulation.RETRACTING, trigger=Trigger(early_every_ms=0))
    engine.add("u", 0, 1)
    engine.add("u", 20, 2)
    first = engine.fire(0)
    assert sorted((f.window, f.row["sum"]) for f in first) == [(Window(0, 10), 1), (Window(20, 30), 2)]
    engine.add("u", 9, 4)  # bridges [0,10) and ... [9,19) does not reach 20: only the first grows
    engine.add("u", 15, 8)  # [15,25) overlaps [9,19) and [20,30): everything is one session now
    (merged,) = engine.fire(1)
    assert merged.window == Window(0, 30) and merged.row["sum"] == 15
    assert sorted(merged.retractions) == [(Window(0, 10), {"key": "u", "sum": 1}), (Window(20, 30), {"key": "u", "sum": 2})]


@given(events_strategy, st.integers(0, 40), st.sampled_from(WINDOW_FNS), st.sampled_from(list(Accumulation)))
@settings(max_examples=150, deadline=None)
def test_a_restored_snapshot_carries_on_as_if_nothing_happened(events, cut, windows, accumulation) -> None:
    def engine() -> WindowedAggregation:
        return summing(windows, accumulation, trigger=Trigger(early_every_ms=0), allowed_lateness_ms=10_000)

    expected = run(engine(), events, 3, bound=50)
    # A crash after some batches: a new engine restores every key's snapshot and the watermark.
    first, cut = engine(), min(cut, len(events)) // 3 * 3
    before, newest, now = feed(first, events[:cut], 3, bound=50)
    second = engine()
    for key in first.keys():
        second.restore(key, json.loads(json.dumps(first.snapshot(key))))  # as the changelog carries it
    second.advance_watermark(first.watermark)
    after, _newest, now = feed(second, events[cut:], 3, bound=50, newest=newest, now=now)
    assert folded(before + after + flush(second, now), accumulation) == folded(expected, accumulation)
