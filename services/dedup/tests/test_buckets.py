"""Bloom buckets: never a false "new", bounded false "maybe", buckets expire at the horizon."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow_dedup.buckets import BloomBuckets, BucketSpec

pytestmark = pytest.mark.dedup

SPEC = BucketSpec(bucket_ms=1000, horizon_ms=5000, expected_per_bucket=1000, false_positive_rate=0.01)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(min_value=0, max_value=4999)), max_size=200))
def test_anything_added_within_the_horizon_is_a_maybe(records):
    buckets = BloomBuckets(SPEC)
    for record_id, ingest_time in records:
        buckets.add(record_id, ingest_time)
    assert buckets.expire(stream_time_ms=4999) == []
    assert all(buckets.might_contain(record_id) for record_id, _ in records)


def test_measured_false_positive_rate_is_near_the_configured_one():
    buckets = BloomBuckets(SPEC)
    for i in range(1000):
        buckets.add(f"seen-{i}", 0)
    false_maybes = sum(buckets.might_contain(f"never-{i}") for i in range(20_000))
    assert false_maybes / 20_000 < 3 * SPEC.false_positive_rate


def test_gate_false_positive_rate_over_a_million_random_ids_is_within_one_and_a_half_times_the_target():
    """Every live bucket full to its expected size: the union of their filters is what a lookup
    asks, so the configured rate must hold for the union, not per filter."""
    buckets = BloomBuckets(SPEC)
    for bucket in range(SPEC.live_buckets):
        for i in range(SPEC.expected_per_bucket):
            buckets.add(f"seen-{bucket}-{i}", bucket * SPEC.bucket_ms)
    assert len(buckets.buckets) == SPEC.live_buckets
    rng = random.Random(7)
    probes = 1_000_000
    false_maybes = sum(buckets.might_contain(f"probe-{rng.getrandbits(64):x}") for _ in range(probes))
    measured = false_maybes / probes
    assert measured <= 1.5 * SPEC.false_positive_rate, f"measured {measured:.5f}, configured {SPEC.false_positive_rate}"


def test_buckets_past_the_horizon_are_dropped_and_forgotten():
    buckets = BloomBuckets(SPEC)
    buckets.add("old", 500)
    buckets.add("new", 4500)
    assert buckets.buckets == [0, 4000]
    assert buckets.expire(stream_time_ms=4999) == []
    assert buckets.expire(stream_time_ms=5000) == [0]
    assert buckets.buckets == [4000]
    assert buckets.beyond_horizon(500, stream_time_ms=5000)
    assert not buckets.beyond_horizon(4500, stream_time_ms=5000)
    assert buckets.might_contain("new")
    assert buckets.memory_bytes > 0


def test_spec_rejects_nonsense():
    with pytest.raises(ValueError):
        BucketSpec(bucket_ms=0)
    with pytest.raises(ValueError):
        BucketSpec(bucket_ms=10, horizon_ms=5)
    with pytest.raises(ValueError):
        BucketSpec(false_positive_rate=1.5)
