"""The shared batching policy, against a fake source that records every take."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from onceflow.txn.batching import Batcher, BatchPolicy


class _Source:
    """``ready`` items are there now; ``later`` more arrive during any wait with a timeout."""

    def __init__(self, ready: list[int], later: list[int]) -> None:
        self.ready, self.later = list(ready), list(later)
        self.calls: list[tuple[int, float]] = []

    def take(self, limit: int, timeout_s: float) -> list[int]:
        self.calls.append((limit, timeout_s))
        if timeout_s > 0:
            self.ready += self.later
            self.later = []
        taken: list[int] = []
        while self.ready and sum(taken) < limit:
            taken.append(self.ready.pop(0))
        return taken


def _batcher(source: _Source, **policy: float) -> Batcher[int]:
    return Batcher(BatchPolicy(**policy), source.take, size=lambda item: item)  # type: ignore[arg-type]


def test_records_already_there_go_at_once_and_a_full_batch_never_lingers() -> None:
    source = _Source([1] * 500, [])
    assert len(_batcher(source, max_items=100, linger_s=0.005).gather()) == 100
    assert source.calls == [(100, 0)]


def test_an_idle_hop_waits_for_one_then_takes_what_came_with_it_even_without_linger() -> None:
    source = _Source([], [1, 1, 1])
    assert _batcher(source, max_items=100, first_wait_s=0.1).gather() == [1, 1, 1]
    assert source.calls == [(100, 0), (1, 0.1), (99, 0)]


def test_what_was_there_is_the_batch_when_there_is_no_linger() -> None:
    source = _Source([1, 1], [1])
    assert _batcher(source, max_items=100).gather() == [1, 1]
    assert source.calls == [(100, 0)]


def test_a_linger_waits_for_more_after_a_first_record() -> None:
    source = _Source([1], [1, 1])
    assert _batcher(source, max_items=100, linger_s=0.005).gather() == [1, 1, 1]
    assert source.calls == [(100, 0), (99, 0.005)]


def test_a_busy_hop_with_a_cycle_runs_at_most_one_batch_per_cycle() -> None:
    now = [0.0]
    source = _Source([1] * 3, [])
    batcher = Batcher(BatchPolicy(max_items=100, min_cycle_s=0.5), source.take, size=lambda item: item, clock=lambda: now[0])
    assert batcher.gather() == [1, 1, 1]  # no batch before it: nothing to space from
    source.ready, source.later, now[0] = [1], [1, 1], 0.2
    assert batcher.gather() == [1, 1, 1]
    assert source.calls[1:] == [(100, 0), (99, 0.3)]  # lingered until 0.5 s after the first began


def test_a_cycle_never_holds_a_record_an_idle_hop_waited_for() -> None:
    now = [0.0]
    source = _Source([1], [])
    batcher = Batcher(BatchPolicy(max_items=100, min_cycle_s=0.5), source.take, size=lambda item: item, clock=lambda: now[0])
    batcher.gather()
    source.later, now[0] = [1], 0.1
    assert batcher.gather() == [1]
    assert source.calls[1:] == [(100, 0), (1, 0.1), (99, 0)]


def test_an_empty_poll_starts_no_cycle() -> None:
    now = [0.0]
    source = _Source([1], [])
    batcher = Batcher(BatchPolicy(max_items=100, min_cycle_s=0.5), source.take, size=lambda item: item, clock=lambda: now[0])
    batcher.gather()
    now[0] = 1.0
    assert batcher.gather() == []  # idle: nothing came during the first wait
    source.ready, now[0] = [1], 1.2  # a record arrives during the next batch's gap
    assert batcher.gather() == [1]
    assert source.calls[-1] == (100, 0)  # taken at once, not held until 1.5


@given(
    ready=st.lists(st.integers(1, 50), max_size=30),
    later=st.lists(st.integers(1, 50), max_size=30),
    bound=st.integers(1, 200),
    linger=st.sampled_from([0.0, 0.005]),
)
def test_a_batch_holds_at_most_the_bound_but_never_splits_an_item(
    ready: list[int], later: list[int], bound: int, linger: float
) -> None:
    source = _Source(ready, later)
    batch = _batcher(source, max_items=bound, linger_s=linger).gather()
    # In order, nothing lost or invented, and only the last item may cross the bound.
    assert batch == (ready + later)[: len(batch)]
    if batch:
        assert sum(batch[:-1]) < bound
    # Nothing waited for while records were there, nor after a full batch.
    if ready:
        assert source.calls[0] == (bound, 0)
        assert all(timeout in (0, linger) for _, timeout in source.calls)
        assert len(source.calls) == (2 if linger and sum(ready) < bound else 1)


@given(polls=st.lists(st.integers(0, 3000), max_size=40), low=st.integers(1, 500))
def test_an_adaptive_bound_stays_between_its_limits(polls: list[int], low: int) -> None:
    batcher = _batcher(_Source([], []), max_items=2000, min_items=low)
    for taken in polls:
        before = batcher.bound
        batcher.adapt(min(taken, before))
        assert low <= batcher.bound <= max(low, 2000)
        if taken >= before:
            assert batcher.bound == min(2000, before * 2)
    batcher.halve()
    assert batcher.bound >= low


def test_a_fixed_bound_stays_at_the_maximum() -> None:
    batcher = _batcher(_Source([], []), max_items=1000)
    for taken in (0, 1000, 3):
        batcher.adapt(taken)
        assert batcher.bound == 1000
    batcher.halve()
    assert batcher.bound == 1000
