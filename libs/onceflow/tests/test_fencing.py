"""What a checked Redis script's answer means (onceflow.state.fencing), with no Redis: the one set
of outcomes both stores read, the refusal of a stale owner, what a diverged answer says Redis
holds, and when such an answer is only a retried write that had landed. The composed Lua runs
against the real Redis in tests/test_redis_fencing.py and through both stores in
tests/test_redis_stores.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow.state.fencing import Held, Outcome, Position, Reply, token_check
from onceflow.state.redis_store import UNCHECKED
from onceflow.txn.errors import FencedError

pytestmark = pytest.mark.redis

CHECKPOINT = Position("checkpoint", count="count")  # the gate's: a count checked against the ids held
OFFSET = Position("offset")  # the sink's

tokens = st.integers(min_value=0, max_value=2**53)
positions = st.sampled_from(["", "0", "41", "41~2"])


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_status_parses_as_redis_sends_it(outcome: Outcome) -> None:
    # redis-py hands back bytes for strings and ints for Lua numbers.
    reply = Reply.parse([outcome.value.encode(), 1764000000123, b"41", None])
    assert reply == Reply(outcome, 1764000000123, (b"41", None))
    assert Reply.parse([outcome.value, b"7"]) == Reply(outcome, 7)


def test_a_status_no_script_answers_is_a_bug_not_an_outcome() -> None:
    with pytest.raises(ValueError):
        Reply.parse([b"read", 7])


def test_only_a_fenced_answer_refuses_the_owner() -> None:
    with pytest.raises(FencedError, match=r"^dedup store of partition 3: write refused, token 5 is stale \(newest 9\)"):
        Reply(Outcome.FENCED, 9).refuse_if_fenced("dedup store of partition 3", 5)
    for outcome in set(Outcome) - {Outcome.FENCED}:
        Reply(outcome, 9).refuse_if_fenced("dedup store of partition 3", 5)


def test_a_diverged_answer_says_what_redis_holds() -> None:
    assert CHECKPOINT.held(Reply(Outcome.DIVERGED, 9, (b"", 3, 2))) == Held(9, "", count=3, size=2)
    assert OFFSET.held(Reply(Outcome.DIVERGED, 9, (b"19",))) == Held(9, "19")


@given(token=tokens, position=positions, count=st.integers(0, 3), size=st.integers(0, 3),
       wrote=tokens, landed=positions)
def test_a_divergence_is_a_landed_write_only_when_redis_holds_exactly_it(token, position, count, size, wrote, landed) -> None:
    """A retried call whose first try landed finds its own token and position, whole; anything
    else (an older position, another token, a lost id) is a Redis that went back in time."""
    held = CHECKPOINT.held(Reply(Outcome.DIVERGED, token, (position.encode(), count, size)))
    assert held.is_exactly(wrote, landed) == (token == wrote and position == landed and count == size)


def test_the_fragments_state_the_protocol() -> None:
    """KEYS[1] the meta, ARGV[1] the token, ARGV[2] the position expected, the sabotage's marker
    the one UNCHECKED names; a refusal is counted and carries what the store adds."""
    fence = token_check("''")
    assert "local meta = KEYS[1]" in fence and "tonumber(ARGV[1])" in fence
    assert "redis.call('HINCRBY', meta, 'rejected', 1)" in fence and "return {'fenced', newest, ''}" in fence
    assert "return {'fenced', newest}\n" in token_check()
    assert f"ARGV[2] ~= '{UNCHECKED}'" in OFFSET.continuity()
    assert "HLEN" not in OFFSET.continuity() and "return {'diverged', newest, stored}" in OFFSET.continuity()
    assert "redis.call('HLEN', KEYS[2])" in CHECKPOINT.continuity()
    assert "return {'diverged', newest, stored, count, held}" in CHECKPOINT.continuity()
    assert "redis.call('HSET', meta, 'count', 0)" in CHECKPOINT.retake()
    assert "redis.call('HDEL', meta, 'offset')" in OFFSET.retake() and "count" not in OFFSET.retake()
