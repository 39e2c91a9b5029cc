"""The gate's fenced exact store against the real Redis: a new owner fences the old one out, and
the checkpoint never moves back. The gate's decisions (duplicates, ack edges, dead letters, GC,
the horizon, forget, clocks, replays past the horizon) are tested through
`onceflow.testing.StageDriver` in services/dedup/tests/test_stage_driver.py, with the same
store on a redis-server of their own and no broker (issue 40)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.txn.errors import FencedError

from onceflow_dedup import store as exact
from onceflow_dedup.buckets import BucketSpec

pytestmark = [pytest.mark.dedup, pytest.mark.integration]

SPEC = BucketSpec(bucket_ms=1000, horizon_ms=5000, expected_per_bucket=1000, false_positive_rate=0.01)


@pytest.fixture
def client(infra: None) -> Iterator[redis.Redis]:
    conn = connect(CommonSettings().redis_url)
    yield conn
    conn.close()


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    prefix = f"g{uuid.uuid4().hex[:8]}."
    yield prefix
    delete_prefix(client, prefix)


def test_a_new_owner_fences_the_old_one_out_of_the_store(client: redis.Redis, prefix: str) -> None:
    old = exact.DedupStore(client, prefix, 0, SPEC)
    old.apply({b"a": b"1000"}, checkpoint=1)
    new = exact.DedupStore(client, prefix, 0, SPEC)  # the replacement takes the partition
    assert new.token > old.token and new.checkpoint == 1
    assert new.might_contain("a")  # filters rebuilt from the exact store
    with pytest.raises(FencedError, match="stale"):
        old.apply({b"zombie": b"1000", b"a": None}, checkpoint=2)
    assert exact.rejected_writes(client, prefix, 0) == 1
    assert client.hget(new.keys.ids, b"zombie") is None and client.hget(new.keys.ids, b"a") == b"1000"
    new.apply({b"b": b"2000"}, checkpoint=2)
    assert new.checkpoint == 2 and client.hget(new.keys.meta, "checkpoint") == b"2"


def test_the_checkpoint_never_moves_back_and_large_applies_are_chunked(client: redis.Redis, prefix: str) -> None:
    store = exact.DedupStore(client, prefix, 0, SPEC)
    many = {f"id-{i}".encode(): b"1000" for i in range(exact.APPLY_CHUNK * 2 + 5)}
    store.apply(many, checkpoint=10)
    store.apply({}, checkpoint=5)
    assert client.hget(store.keys.meta, "checkpoint") == b"10"
    assert client.hlen(store.keys.ids) == len(many) and client.scard(store.keys.bucket(1000)) == len(many)
