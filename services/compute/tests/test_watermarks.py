"""Watermark arithmetic: per partition max event time minus the bound, the minimum over active
partitions, idle ones excluded, and never going back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_compute.dataflow.watermarks import WatermarkTracker

pytestmark = pytest.mark.dataflow


def test_partition_watermark_is_newest_event_minus_bound() -> None:
    tracker = WatermarkTracker(bound_ms=100, idle_timeout_ms=10_000)
    tracker.observe(0, 1_000, now_ms=0)
    tracker.observe(0, 900, now_ms=1)  # out of order: does not move it back
    assert tracker.partition_watermark(0) == 900
    assert tracker.watermark(now_ms=2) == 900


def test_the_slowest_active_partition_holds_the_worker_back() -> None:
    tracker = WatermarkTracker(bound_ms=0, idle_timeout_ms=1_000)
    tracker.assign([0, 1], now_ms=0)
    tracker.observe(0, 5_000, now_ms=10)
    assert tracker.watermark(now_ms=20) is None  # partition 1 has said nothing yet, and is not idle
    tracker.observe(1, 2_000, now_ms=30)
    assert tracker.watermark(now_ms=40) == 2_000


def test_an_idle_partition_is_left_out_until_it_speaks_again() -> None:
    tracker = WatermarkTracker(bound_ms=0, idle_timeout_ms=1_000)
    tracker.observe(0, 1_000, now_ms=0)
    tracker.observe(1, 100, now_ms=0)
    assert tracker.watermark(now_ms=500) == 100
    tracker.observe(0, 3_000, now_ms=1_500)
    assert tracker.is_idle(1, now_ms=1_500)
    assert tracker.watermark(now_ms=1_500) == 3_000
    tracker.observe(1, 200, now_ms=1_600)  # back, and behind: the worker's watermark holds
    assert tracker.watermark(now_ms=1_600) == 3_000
    assert tracker.partitions() == {0: 3_000, 1: 200}


def test_revoked_partitions_stop_counting() -> None:
    tracker = WatermarkTracker(bound_ms=10, idle_timeout_ms=60_000)
    tracker.observe(0, 1_000, now_ms=0)
    tracker.observe(1, 50, now_ms=0)
    assert tracker.watermark(now_ms=1) == 40
    tracker.revoke([1])
    assert tracker.watermark(now_ms=2) == 990


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 500)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_the_watermark_is_the_running_max_of_the_min_over_active_partitions(events: list[tuple[int, int, int]]) -> None:
    bound, idle = 50, 1_000
    tracker = WatermarkTracker(bound_ms=bound, idle_timeout_ms=idle)
    newest: dict[int, int] = {}
    last_seen: dict[int, int] = {}
    now, expected = 0, None
    for partition, event_time, step in events:
        now += step
        tracker.observe(partition, event_time, now)
        newest[partition] = max(newest.get(partition, event_time), event_time)
        last_seen[partition] = now
        active = [p for p in newest if now - last_seen[p] < idle]
        if active:
            current = min(newest[p] for p in active) - bound
            expected = current if expected is None else max(expected, current)
        assert tracker.watermark(now) == expected
