"""What Redis can do to the state it holds, done on purpose to one pipeline's keys (a topic
prefix), so a campaign never touches another pipeline sharing the Redis:

- a rollback: every key back to an earlier snapshot, in one atomic step. A failover to a replica
  that lagged does exactly this (replication is asynchronous), and so can the AOF's fsync window
  on a machine crash;
- a flush: every key gone at once, as FLUSHALL or an empty restart would leave them.

Both run as one Lua script, so no service ever sees half of it.
"""

from __future__ import annotations

import redis

# KEYS: none (the pattern is ARGV[1]: a script may touch keys it finds itself outside cluster
# mode). ARGV[2..]: key, DUMP payload pairs to put back.
_REPLACE = """
local found = redis.call('KEYS', ARGV[1])
for _, key in ipairs(found) do redis.call('DEL', key) end
for i = 2, #ARGV, 2 do redis.call('RESTORE', ARGV[i], 0, ARGV[i + 1]) end
return #found
"""

Snapshot = dict[bytes, bytes]


def _pattern(topic_prefix: str) -> str:
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in topic_prefix)
    return f"onceflow:{{{escaped}*"


def snapshot(client: redis.Redis, topic_prefix: str) -> Snapshot:
    """Every key of the pipeline, serialised (DUMP), in one MULTI: a consistent moment."""
    keys = list(client.scan_iter(match=_pattern(topic_prefix), count=1000))
    with client.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.dump(key)
        values = pipe.execute()
    return {key: value for key, value in zip(keys, values, strict=True) if value is not None}


def roll_back(client: redis.Redis, topic_prefix: str, saved: Snapshot) -> int:
    """Put the pipeline's keys back to ``saved``, atomically; the number of keys replaced."""
    argv: list[bytes | str] = [_pattern(topic_prefix)]
    for key, value in saved.items():
        argv += [key, value]
    return int(client.eval(_REPLACE, 0, *argv))


def flush(client: redis.Redis, topic_prefix: str) -> int:
    """Delete the pipeline's keys, atomically; how many there were."""
    return roll_back(client, topic_prefix, {})
