"""The fencing and continuity fragments (onceflow.state.fencing) against the real Redis, composed
into the smallest store there is: a hash of entries counted in its meta. The gate's and the
sink's scripts are these fragments plus their own writes (tests/test_redis_stores.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.state.fencing import Held, Outcome, Position, Reply, take_token, token_check
from onceflow.state.redis_store import UNCHECKED

pytestmark = [pytest.mark.redis, pytest.mark.integration]

POSITION = Position("position", count="count")

# KEYS[1] meta, KEYS[2] entries; ARGV[1] token, ARGV[2] the position expected, ARGV[3] an entry,
# ARGV[4] the new position.
_ADD = token_check() + POSITION.continuity() + """
redis.call('HSET', KEYS[2], ARGV[3], 1)
redis.call('HINCRBY', meta, 'count', 1)
redis.call('HSET', meta, 'position', ARGV[4])
return {'applied', newest}
"""
_RETAKE = token_check() + POSITION.retake() + "return {'retaken', token}\n"


class Store:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        base = f"onceflow:{{{prefix}fencing}}"
        self.meta, self.entries = f"{base}:meta", f"{base}:entries"
        self._add = client.register_script(_ADD)
        self._retake = client.register_script(_RETAKE)

    def add(self, token: int, expected: str, entry: str, position: str) -> Reply:
        return Reply.parse(self._add(keys=[self.meta, self.entries], args=[token, expected, entry, position]))

    def retake(self, token: int) -> Reply:
        return Reply.parse(self._retake(keys=[self.meta], args=[token]))

    def rejected(self) -> int:
        return int(self.client.hget(self.meta, "rejected") or 0)


@pytest.fixture
def store(infra: None) -> Iterator[Store]:
    prefix = f"f{uuid.uuid4().hex[:8]}."
    client = connect(CommonSettings().redis_url)
    yield Store(client, prefix)
    delete_prefix(client, prefix)


def test_a_new_owner_claims_a_token_above_every_earlier_one_and_above_the_clock(store: Store) -> None:
    before_ms = int(time.time() * 1000)
    first = take_token(store.client, store.meta)
    assert first >= before_ms
    store.client.hset(store.meta, "token", first + 10**9)  # a token from a clock far ahead
    assert take_token(store.client, store.meta) == first + 10**9 + 1
    store.client.delete(store.meta)  # Redis lost the tokens: the clock still keeps the order
    assert take_token(store.client, store.meta) > first


def test_a_stale_owner_is_refused_counted_and_writes_nothing(store: Store) -> None:
    zombie = take_token(store.client, store.meta)
    assert store.add(zombie, "", "a", "1") == Reply(Outcome.APPLIED, zombie)
    owner = take_token(store.client, store.meta)
    assert store.add(zombie, "1", "b", "2") == Reply(Outcome.FENCED, owner)
    assert store.retake(zombie) == Reply(Outcome.FENCED, owner), "a zombie may not rebuild over the new owner"
    assert store.rejected() == 2 and store.client.hkeys(store.entries) == [b"a"]
    assert store.add(owner, "1", "b", "2").outcome is Outcome.APPLIED


def test_a_redis_that_holds_anything_else_is_refused_and_says_what_it_holds(store: Store) -> None:
    token = take_token(store.client, store.meta)
    store.add(token, "", "a", "1")
    store.add(token, "1", "b", "2")
    older = store.add(token, "1", "c", "3")  # a caller that believes an older position
    assert older.outcome is Outcome.DIVERGED and POSITION.held(older) == Held(token, "2", count=2, size=2)
    store.client.hdel(store.entries, "a")  # an entry lost alone: the position says nothing
    lost = store.add(token, "2", "c", "3")
    assert POSITION.held(lost) == Held(token, "2", count=2, size=1) and not POSITION.held(lost).is_exactly(token, "2")
    assert store.client.hkeys(store.entries) == [b"b"], "a diverged call must write nothing"
    assert store.add(token, UNCHECKED, "c", "3").outcome is Outcome.APPLIED  # the sabotaged build sees nothing


def test_a_rebuild_takes_the_next_token_and_forgets_the_position(store: Store) -> None:
    token = take_token(store.client, store.meta)
    store.add(token, "", "a", "1")
    store.client.hset(store.meta, "token", token - 1)  # Redis rolled back to an earlier owner's token
    assert store.add(token, "1", "b", "2").outcome is Outcome.DIVERGED
    retaken = store.retake(token)
    assert retaken == Reply(Outcome.RETAKEN, token + 1)
    assert store.client.hmget(store.meta, ["token", "position", "count"]) == [str(token + 1).encode(), None, b"0"]
    store.client.delete(store.entries)  # (the gate empties its keys in the same script)
    assert store.add(token + 1, "", "a", "1").outcome is Outcome.APPLIED
