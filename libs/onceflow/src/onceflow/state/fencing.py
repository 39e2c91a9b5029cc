"""Fencing and continuity for every store kept in Redis: the Lua fragments its checked scripts
are composed of, the claim of a new owner's token, and what Redis' answer means.

A store in Redis (the gate's exact ids, the sink's result tables) has one owner at a time: the
instance assigned its partition. A meta hash says who that is and which Kafka position the store
reflects, and every checked script speaks one protocol:

- KEYS[1] is the meta hash: ``token`` (the fencing sequencer), ``rejected`` (calls refused from
  stale owners) and the store's ``Position`` (the gate's ``checkpoint`` and ``count``, the
  sink's ``offset``);
- ARGV[1] is the caller's token; ARGV[2], in a script that checks continuity, the position its
  owner last wrote (``expect``: '' none yet, ``UNCHECKED`` skips the check);
- the answer is ``{status, newest token, ...}``; ``Reply.parse`` reads it.

A script is its store's own Lua after ``token_check`` (and ``Position.continuity`` where it
writes or decides): those return early, having written nothing but the refusal count, and leave
Lua locals the store's part goes on with: ``meta``, ``mine`` and ``newest``, then ``stored``
(and ``count``, ``held`` for a counted position). Why each check is there: docs/redis.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import redis

from onceflow.state.redis_store import UNCHECKED, decode
from onceflow.txn.errors import FencedError


class Outcome(str, Enum):
    """What a checked script did, the first field of its answer."""

    APPLIED = "applied"  # written
    CHECKED = "checked"  # a check, or a checked read, only: Redis holds what this owner wrote
    FENCED = "fenced"  # a newer owner holds the store: this instance is a zombie; nothing written
    DIVERGED = "diverged"  # Redis lost or rolled back writes: nothing written, rebuild the store
    RETAKEN = "retaken"  # a rebuild may start: a newer token, no position


def token_check(*refusal: str) -> str:
    """Lua, first in every checked script: a caller whose token is not the newest is a zombie
    (a newer owner took the store while it was paused). Its call is counted in ``rejected`` and
    answered ``{'fenced', newest, <refusal>}`` (``refusal``: Lua expressions the store adds)."""
    tail = "".join(f", {expression}" for expression in refusal)
    return f"""
local meta = KEYS[1]
local mine = tonumber(ARGV[1])
local newest = tonumber(redis.call('HGET', meta, 'token') or '0')
if newest > mine then
  redis.call('HINCRBY', meta, 'rejected', 1)
  return {{'fenced', newest{tail}}}
end
"""


@dataclass(frozen=True)
class Held:
    """What Redis holds for a store, as a diverged answer reports it."""

    token: int
    position: str  # '' none
    count: int = 0  # the meta's count of entries (a counted position only)
    size: int = 0  # the entries the hash holds (a counted position only)

    def is_exactly(self, token: int, position: str) -> bool:
        """Whether Redis holds this very token and position, whole: the answer to a write that
        landed before its reply was lost (the client retried it), not a divergence."""
        return self.token == token and self.position == position and self.count == self.size


@dataclass(frozen=True)
class Position:
    """The meta field that says which Kafka position a store reflects; ``count``, if it names
    one, a meta field that must equal the number of entries of the hash KEYS[2], so an entry
    lost alone shows too, whatever the position says."""

    field: str
    count: str = ""

    @property
    def stored(self) -> str:
        """Lua: the position Redis holds ('' none)."""
        return f"redis.call('HGET', meta, '{self.field}') or ''"

    def continuity(self) -> str:
        """Lua, after ``token_check`` in every script that writes or decides: unless Redis holds
        exactly what this owner last wrote (its token, the position ARGV[2], and the count), it
        writes nothing and answers ``{'diverged', newest, stored[, count, held]}``."""
        reads = f"local stored = {self.stored}\n"
        differs = "newest < mine or stored ~= ARGV[2]"
        answer = "'diverged', newest, stored"
        if self.count:
            reads += (
                f"local count = tonumber(redis.call('HGET', meta, '{self.count}') or '0')\n"
                "local held = redis.call('HLEN', KEYS[2])\n"
            )
            differs += " or held ~= count"
            answer += ", count, held"
        return f"""{reads}if ARGV[2] ~= '{UNCHECKED}' and ({differs}) then
  return {{{answer}}}
end
"""

    def retake(self) -> str:
        """Lua, after ``token_check``, a rebuild's claim: this owner's token + 1, still below any
        newer owner's (which fences it at its next write), and no position (a zero count), so the
        replay from the start of the changelog is checked too. Leaves the new token in ``token``."""
        zero = f"redis.call('HSET', meta, '{self.count}', 0)\n" if self.count else ""
        return f"""local token = string.format('%d', mine + 1)
redis.call('HSET', meta, 'token', token)
{zero}redis.call('HDEL', meta, '{self.field}')
"""

    def held(self, reply: Reply) -> Held:
        """What a diverged answer of ``continuity`` reports Redis holds."""
        stored = decode(reply.rest[0])
        if not self.count:
            return Held(reply.newest_token, stored)
        count, size = reply.rest[1:3]
        return Held(reply.newest_token, stored, int(count), int(size))


@dataclass(frozen=True)
class Reply:
    """A checked script's answer: the outcome, the newest token (on RETAKEN, the one just
    claimed), and the rest raw, as the store's script has it (a position, a read's values)."""

    outcome: Outcome
    newest_token: int
    rest: tuple[Any, ...] = ()

    @classmethod
    def parse(cls, answer: list[Any]) -> Reply:
        status, newest, *rest = answer
        return cls(Outcome(decode(status)), int(newest), tuple(rest))

    def refuse_if_fenced(self, owner: str, token: int) -> None:
        """FencedError if a newer owner holds the store: this instance must stop, writing nothing."""
        if self.outcome is Outcome.FENCED:
            raise FencedError(
                f"{owner}: write refused, token {token} is stale (newest {self.newest_token}): "
                "another instance owns this partition now"
            )


# A new owner's claim: above every token Redis holds, and above the clock in ms, so it stays
# above every earlier owner's even after Redis lost the tokens themselves (a flush, a rollback).
# An earlier owner that finds Redis behind then rebuilds with its own token + 1
# (``Position.retake``), still below the newest owner's, which fences it at its next write.
# Owners change a session timeout apart, far more than the skew of the clocks involved.
_TAKE_TOKEN = """
local token = math.max(tonumber(redis.call('HGET', KEYS[1], 'token') or '0') + 1, tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'token', string.format('%d', token))
return string.format('%d', token)
"""


def take_token(client: redis.Redis, meta_key: str) -> int:
    """Claim the store whose meta hash is ``meta_key`` for a new owner: its fencing token."""
    return int(client.eval(_TAKE_TOKEN, 1, meta_key, int(time.time() * 1000)))
