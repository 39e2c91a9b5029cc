"""The Nexmark generator: the specification's proportions and id rules, determinism per event,
and out-of-orderness bounded by max_delay_ms with a ground truth for late events."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_tools.workloads import nexmark
from onceflow_tools.workloads.nexmark import NexmarkConfig

pytestmark = pytest.mark.dataflow


def test_kinds_follow_the_1_3_46_proportions() -> None:
    counts = Counter(e.kind for e in nexmark.events(NexmarkConfig(events=5000)))
    assert counts == {"person": 100, "auction": 300, "bid": 4600}


def test_bids_and_auctions_only_reference_what_already_exists() -> None:
    persons: set[int] = set()
    auctions: set[int] = set()
    for e in nexmark.events(NexmarkConfig(events=20_000, seed=3)):
        if e.kind == "person":
            persons.add(e.fields["id"])
        elif e.kind == "auction":
            assert e.fields["seller"] in persons
            assert nexmark.FIRST_CATEGORY_ID <= e.fields["category"] < nexmark.FIRST_CATEGORY_ID + nexmark.NUM_CATEGORIES
            assert e.fields["reserve"] > e.fields["initial_bid"] > 0
            auctions.add(e.fields["id"])
        else:
            assert e.fields["auction"] in auctions
            assert e.fields["bidder"] in persons
            assert 100 <= e.fields["price"] <= 100_000_000
    # Ids are dense: every person and auction number is used once.
    assert persons == set(range(1000, 1000 + len(persons)))
    assert auctions == set(range(1000, 1000 + len(auctions)))


def test_the_hot_auction_takes_about_half_the_bids() -> None:
    bids = [e for e in nexmark.events(NexmarkConfig(events=50_000)) if e.kind == "bid"]
    hot = sum(
        b.fields["auction"] == nexmark.last_auction_id(b.number) // 2 * 2 + nexmark.FIRST_AUCTION_ID for b in bids
    )
    assert 0.5 < hot / len(bids) < 0.55


@given(st.integers(0, 100_000), st.integers(1, 10_000), st.integers(0, 5_000))
@settings(max_examples=50, deadline=None)
def test_an_event_depends_only_on_the_seed_and_its_number(number: int, rate: int, delay: int) -> None:
    config = NexmarkConfig(events=number + 1, rate=rate, max_delay_ms=delay, seed=9)
    a, b = nexmark.event(config, number), nexmark.event(config, number)
    assert a == b
    assert a.time_ms == config.base_time_ms + number * 1000 // rate
    assert a.time_ms <= a.arrival_ms <= a.time_ms + delay


@given(st.integers(0, 3_000), st.integers(0, 3_000))
@settings(max_examples=30, deadline=None)
def test_out_of_order_is_bounded_and_late_events_are_exactly_those_past_the_bound(delay: int, bound: int) -> None:
    config = NexmarkConfig(events=2_000, rate=1_000, max_delay_ms=delay, seed=5)
    arrivals = nexmark.arrival_order(config)
    assert sorted(e.number for e in arrivals) == list(range(2_000))
    newest = max_lateness = 0
    for e in arrivals:
        max_lateness = max(max_lateness, newest - e.time_ms)
        newest = max(newest, e.time_ms)
    assert max_lateness <= delay
    late = nexmark.late_events(arrivals, bound)
    if bound >= delay:
        assert late == []
    # Recompute independently: late = behind (newest earlier arrival) - bound.
    expected, newest_seen = [], None
    for e in arrivals:
        if newest_seen is not None and newest_seen - e.time_ms > bound:
            expected.append(e.number)
        newest_seen = e.time_ms if newest_seen is None else max(newest_seen, e.time_ms)
    assert [e.number for e in late] == expected


def test_payload_is_the_event_as_json_with_its_kind() -> None:
    e = nexmark.event(NexmarkConfig(), 10)
    assert e.kind == "bid" and e.key == str(e.fields["auction"])
    assert b'"kind":"bid"' in e.payload() and b'"price":' in e.payload()


def test_late_by_design_events_arrive_exactly_late_delay_after_their_time() -> None:
    config = NexmarkConfig(events=10_000, max_delay_ms=100, late_ratio=0.02, late_delay_ms=30_000, seed=4)
    delays = [e.delay_ms for e in nexmark.events(config)]
    late = [d for d in delays if d == 30_000]
    assert 150 < len(late) < 250 and all(d <= 100 for d in delays if d != 30_000)
