"""The result tables in Redis and the one script that writes them.

A batch of changes from one compute.results partition is applied by one Lua call that, atomically:
(1) checks the partition's fencing token (a new owner first takes a higher one: MillWheel's
"read before write"), (2) skips the batch unless its last offset is above the partition's stored
offset, (3) applies upserts and retractions, (4) stores the new offset. Redis, not Kafka's
committed offsets, is the truth about what has been applied.

Keys (docs/key-layouts.md); one hash tag for all, so one script may touch every table:

- ``onceflow:{<prefix>sink}:table:<job>``  HASH row key -> row value (what users read)
- ``onceflow:{<prefix>sink}:partition:<p>`` HASH token, offset (last applied), rejected
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import redis

# KEYS: partition meta, table key prefix. ARGV: token, last offset, then op, job, key, value
# quadruples (op "+" upsert, "-" retract). Returns {status, newest token, stored offset}.
_APPLY = """
local meta, table_prefix = KEYS[1], KEYS[2]
local newest = tonumber(redis.call('HGET', meta, 'token') or '0')
if tonumber(ARGV[1]) ~= newest then
  redis.call('HINCRBY', meta, 'rejected', 1)
  return {'fenced', newest, 0}
end
local stored = tonumber(redis.call('HGET', meta, 'offset') or '-1')
local last = tonumber(ARGV[2])
if last <= stored then
  return {'stale', newest, stored}
end
for i = 3, #ARGV, 4 do
  local table_key = table_prefix .. ARGV[i + 1]
  if ARGV[i] == '+' then
    redis.call('HSET', table_key, ARGV[i + 2], ARGV[i + 3])
  else
    redis.call('HDEL', table_key, ARGV[i + 2])
  end
end
redis.call('HSET', meta, 'offset', last)
return {'applied', newest, last}
"""


class Outcome(str, Enum):
    APPLIED = "applied"
    STALE = "stale"  # already applied (a replay after a crash): skipped whole
    FENCED = "fenced"  # a newer owner holds the partition: this instance is a zombie


@dataclass(frozen=True)
class Change:
    op: str  # "+" or "-"
    job: str
    key: str
    value: bytes = b""


class ResultTables:
    def __init__(self, client: redis.Redis, topic_prefix: str) -> None:
        self._redis = client
        self._base = f"onceflow:{{{topic_prefix}sink}}"
        self._apply = client.register_script(_APPLY)

    def table_key(self, job: str) -> str:
        return f"{self._base}:table:{job}"

    def meta_key(self, partition: int) -> str:
        return f"{self._base}:partition:{partition}"

    def take_ownership(self, partition: int) -> tuple[int, int]:
        """A new owner's first step: the next fencing token, and the last applied offset
        (-1 when none)."""
        token = int(self._redis.hincrby(self.meta_key(partition), "token", 1))
        offset = self._redis.hget(self.meta_key(partition), "offset")
        return token, -1 if offset is None else int(offset)

    def apply(self, partition: int, token: int, last_offset: int, changes: Iterable[Change]) -> Outcome:
        argv: list[str | bytes | int] = [token, last_offset]
        for change in changes:
            argv += [change.op, change.job, change.key, change.value]
        status, _newest, _stored = self._apply(keys=[self.meta_key(partition), f"{self._base}:table:"], args=argv)
        return Outcome(status.decode() if isinstance(status, bytes) else status)

    def rejected(self, partition: int) -> int:
        return int(self._redis.hget(self.meta_key(partition), "rejected") or 0)

    def get(self, job: str, key: str) -> bytes | None:
        return self._redis.hget(self.table_key(job), key)

    def scan(self, job: str, prefix: str, limit: int) -> list[tuple[str, bytes]]:
        rows = []
        pattern = _glob_escape(prefix) + "*"
        for key, value in self._redis.hscan_iter(self.table_key(job), match=pattern, count=1000):
            rows.append((key.decode(), value))
            if len(rows) >= limit:
                break
        return sorted(rows)

    def table(self, job: str) -> dict[bytes, bytes]:
        return self._redis.hgetall(self.table_key(job))


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
