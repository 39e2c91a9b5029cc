"""Window assignment: every event time lands in the windows that contain it, and only those;
sessions merge exactly when records are closer than the gap."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_compute.dataflow.windows import GLOBAL, GlobalWindows, Hopping, Sessions, Tumbling, Window, merge_overlapping

pytestmark = pytest.mark.dataflow

times = st.integers(-10_000_000, 10_000_000)


@given(times, st.integers(1, 100_000), st.integers(0, 99_999))
def test_tumbling_assigns_the_one_window_containing_the_time(t: int, size: int, offset: int) -> None:
    (window,) = Tumbling(size, offset % size).assign(t)
    assert window.start <= t < window.end and window.end - window.start == size
    assert (window.start - offset % size) % size == 0


@given(times, st.integers(1, 1_000), st.integers(1, 10))
def test_hopping_assigns_every_window_containing_the_time(t: int, slide: int, ratio: int) -> None:
    size = slide * ratio
    windows = Hopping(size, slide).assign(t)
    assert len(windows) == ratio
    assert all(w.start <= t < w.end and w.end - w.start == size and w.start % slide == 0 for w in windows)
    assert windows == sorted(windows) and len(set(windows)) == ratio


def test_hopping_that_does_not_divide_evenly() -> None:
    assert Hopping(10, 4).assign(9) == [Window(0, 10), Window(4, 14), Window(8, 18)]
    assert Hopping(10, 4).assign(3) == [Window(-4, 6), Window(0, 10)]


def test_global_and_sessions() -> None:
    assert GlobalWindows().assign(123) == [GLOBAL]
    assert Sessions(30).assign(100) == [Window(100, 130)]
    with pytest.raises(ValueError):
        Hopping(5, 10)


@given(st.lists(times, min_size=1, max_size=40), st.integers(1, 1_000), st.booleans())
@settings(max_examples=200)
def test_sessions_split_where_records_are_a_gap_apart(ts: list[int], gap: int, touching: bool) -> None:
    sessions = Sessions(gap, merge_touching=touching)
    merged = merge_overlapping((w for t in ts for w in sessions.assign(t)), sessions.joins)
    # Independently: sort, and start a new session where the next record is >= gap after the last
    # one (merging touching sessions, as Spark's session_window: > gap).
    expected, current = [], None
    for t in sorted(set(ts)):
        if current is not None and (t <= current[1] if touching else t < current[1]):
            current = (current[0], max(current[1], t + gap))
        else:
            if current is not None:
                expected.append(Window(*current))
            current = (t, t + gap)
    expected.append(Window(*current))
    assert [span for span, _parts in merged] == expected
