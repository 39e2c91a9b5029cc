"""The exact store of one ingest.records partition: every record_id the gate let through,
filed under its ingest-time bucket, in Redis, with that partition's Bloom filters in front.

It is a ``KeyValueStore`` of the shared loop (key = record_id, value = bucket start in ms,
decimal): ``dedup.changelog`` is the truth, the loop calls ``apply`` only after a transaction
committed, and restore catches Redis up from the checkpoint kept beside the data.

Fencing (read before write): whoever is assigned the partition first takes a higher sequencer
token, and every write carries it. The apply script refuses a write whose token is no longer
the newest, so an instance that was paused across a takeover (a zombie) cannot touch the store
its replacement now owns. Refusals are counted in Redis and raise ``FencedError``. The sink's
tables are fenced and checked the same way: both compose their scripts from
``onceflow.state.fencing``.

Continuity: Redis may lose or roll back writes (a failover to a lagging replica, the fsync
window, a flush). So every write and every read the gate decides on states what this owner last
wrote: its token, the changelog checkpoint and the number of ids. If Redis holds anything else
the script writes nothing and answers ``diverged``; the store raises ``StoreDiverged`` and the
loop rebuilds the partition from ``dedup.changelog`` (``reset`` then restore from the start)
before it decides anything else. A Bloom "maybe" is never settled by a Redis that went back in
time: the read that settles it is the same checked script.

Redis keys (docs/key-layouts.md), ``{...}`` being a cluster hash tag so one script sees them all:

- ``onceflow:{<prefix>dedup:<p>}:ids``       HASH record_id -> bucket start (ms)
- ``onceflow:{<prefix>dedup:<p>}:bucket:<b>`` SET of the record_ids filed under bucket b (for GC)
- ``onceflow:{<prefix>dedup:<p>}:meta``      HASH token, checkpoint, count (ids held), rejected
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import redis

from onceflow.state.fencing import Outcome, Position, Reply, take_token, token_check
from onceflow.state.redis_store import UNCHECKED, RedisWatch, decode, expect, unavailable_on_error, wait_for_replicas
from onceflow.state.store import StoreDiverged

from onceflow_dedup.buckets import BloomBuckets, BucketSpec

log = logging.getLogger(__name__)

# Ids per script call: bounds how long one call blocks Redis.
APPLY_CHUNK = 2000

# Fencing, then continuity, first in every script (onceflow.state.fencing). KEYS[1] meta,
# KEYS[2] ids; ARGV[1] this owner's token, ARGV[2] the checkpoint it expects. The meta's
# checkpoint and count (checked against the ids held) are what Redis must hold.
CHECKPOINT = Position("checkpoint", count="count")
_CHECKED = token_check() + CHECKPOINT.continuity() + "local ids = KEYS[2]\n"

# ARGV[3]: the new checkpoint ('' keeps it); then id, bucket pairs ('' bucket = delete).
_APPLY = _CHECKED + """
local bucket_prefix = KEYS[3]
local names = {}
for i = 4, #ARGV, 2 do names[#names + 1] = ARGV[i] end
-- Every id's bucket now, in one HMGET per SLICE ids (Lua's unpack has a bound). Read once,
-- up front: so no id may come twice in one call (apply's changes are a mapping).
local SLICE = 1000
local olds = {}
for s = 1, #names, SLICE do
  local part = redis.call('HMGET', ids, unpack(names, s, math.min(s + SLICE - 1, #names)))
  for j = 1, #part do olds[#olds + 1] = part[j] end
end
-- The common case, a new id, is filed in bulk after the loop: one HSET, one SADD per bucket.
local fresh, by_bucket, added = {}, {}, 0
for k = 1, #names do
  local id, bucket, old = names[k], ARGV[3 + 2 * k], olds[k]
  if bucket ~= '' and not old then
    fresh[#fresh + 1] = id
    fresh[#fresh + 1] = bucket
    local members = by_bucket[bucket]
    if not members then members = {}; by_bucket[bucket] = members end
    members[#members + 1] = id
    added = added + 1
  else
    if old and old ~= bucket then
      local old_key = bucket_prefix .. old
      redis.call('SREM', old_key, id)
      if redis.call('SCARD', old_key) == 0 then redis.call('DEL', old_key) end
    end
    if bucket == '' then
      if old then
        redis.call('HDEL', ids, id)
        added = added - 1
      end
    elseif old ~= bucket then
      redis.call('HSET', ids, id, bucket)
      redis.call('SADD', bucket_prefix .. bucket, id)
    end
  end
end
for s = 1, #fresh, 2 * SLICE do
  redis.call('HSET', ids, unpack(fresh, s, math.min(s + 2 * SLICE - 1, #fresh)))
end
for bucket, members in pairs(by_bucket) do
  for s = 1, #members, SLICE do
    redis.call('SADD', bucket_prefix .. bucket, unpack(members, s, math.min(s + SLICE - 1, #members)))
  end
end
if added ~= 0 then redis.call('HINCRBY', meta, 'count', added) end
if ARGV[3] ~= '' then redis.call('HSET', meta, 'checkpoint', ARGV[3]) end
return {'applied', newest}
"""

# ARGV[3..]: record_ids. Returns {'checked', newest, value or false, ...}: what the gate decides on.
_READ = _CHECKED + """
local found = {'checked', newest}
for i = 3, #ARGV do
  found[#found + 1] = redis.call('HGET', ids, ARGV[i])
end
return found
"""

# KEYS[3..]: the partition's bucket sets. Empties the partition and takes a token newer than
# any this owner saw, unless a newer owner holds it. Returns {'retaken', token} or {'fenced', newest}.
_RESET = token_check() + """
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
""" + CHECKPOINT.retake() + """
return {'retaken', token}
"""


@dataclass(frozen=True)
class StoreKeys:
    meta: str
    ids: str
    bucket_prefix: str

    @classmethod
    def of(cls, topic_prefix: str, partition: int) -> StoreKeys:
        base = f"onceflow:{{{topic_prefix}dedup:{partition}}}"
        return cls(f"{base}:meta", f"{base}:ids", f"{base}:bucket:")

    def bucket(self, start_ms: int) -> str:
        return f"{self.bucket_prefix}{start_ms}"


def encode_bucket(start_ms: int) -> bytes:
    return str(start_ms).encode()


def lookup(client: redis.Redis, topic_prefix: str, partitions: range | list[int], record_id: str) -> tuple[int, int] | None:
    """(partition, bucket start) of a record_id in any partition's store, read-only."""
    with client.pipeline(transaction=False) as pipe:
        for partition in partitions:
            pipe.hget(StoreKeys.of(topic_prefix, partition).ids, record_id)
        found = pipe.execute()
    for partition, bucket in zip(partitions, found, strict=True):
        if bucket is not None:
            return partition, int(bucket)
    return None


def rejected_writes(client: redis.Redis, topic_prefix: str, partition: int) -> int:
    return int(client.hget(StoreKeys.of(topic_prefix, partition).meta, "rejected") or 0)


class DedupStore:
    """One partition's exact ids (Redis) and Bloom filters (memory). Built on assignment: takes
    the fencing token, then rebuilds the filters from the ids Redis holds; the loop then
    catches it up from the changelog past ``checkpoint``. Whatever Redis holds at that moment
    is a consistent prefix of the changelog (each script applies atomically, and replication
    and the AOF keep script effects whole); from then on every call checks continuity."""

    def __init__(
        self,
        client: redis.Redis,
        topic_prefix: str,
        partition: int,
        spec: BucketSpec,
        use_filters: bool = True,
        watch: RedisWatch | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.partition = partition
        self.use_filters = use_filters
        self.keys = StoreKeys.of(topic_prefix, partition)
        self._redis = client
        self._watch = watch or RedisWatch(client)
        self._wait = (wait_replicas, wait_timeout_ms)
        self._apply = client.register_script(_APPLY)
        self._read = client.register_script(_READ)
        self._reset = client.register_script(_RESET)
        self.filters = BloomBuckets(spec)
        self.stream_time_ms = 0
        with unavailable_on_error(self._name):
            self.token = take_token(client, self.keys.meta)
            checkpoint = decode(client.hget(self.keys.meta, "checkpoint"))
            # Not a plain offset: an apply died between chunks; the first check rebuilds it.
            self._checkpoint: int | None = int(checkpoint) if checkpoint.isdigit() else None
            started = time.monotonic()
            rebuilt = self._rebuild_filters()
        log.info(
            "dedup store %d: token %d, checkpoint %s, %d ids into %d filters in %.2fs",
            partition, self.token, self._checkpoint, rebuilt, len(self.filters.buckets), time.monotonic() - started,
        )

    @property
    def _name(self) -> str:
        return f"dedup store of partition {self.partition}"

    def _rebuild_filters(self) -> int:
        count = 0
        for record_id, bucket in self._redis.hscan_iter(self.keys.ids, count=5000):
            self._remember(record_id.decode(), int(bucket))
            count += 1
        self.filters.expire(self.stream_time_ms)
        return count

    def _remember(self, record_id: str, bucket: int) -> None:
        if self.use_filters:
            self.filters.add(record_id, bucket)
        if bucket > self.stream_time_ms:
            self.stream_time_ms = bucket

    def _call(
        self, script: redis.commands.core.Script, args: list[bytes | str | int], keys: list[str] | None = None,
        landed: str = "",
    ) -> Reply:
        """Run a checked script; its answer, or FencedError / StoreDiverged. ``landed``: the
        checkpoint this very call sets, found already set when the client retried a call whose
        reply was lost (the write landed once; that is not a divergence)."""
        with unavailable_on_error(self._name):
            reply = Reply.parse(script(keys=keys or [self.keys.meta, self.keys.ids], args=args))
        reply.refuse_if_fenced(self._name, self.token)
        if reply.outcome is Outcome.DIVERGED:
            held = CHECKPOINT.held(reply)
            if landed and held.is_exactly(self.token, landed):
                return Reply(Outcome.APPLIED, held.token)
            raise StoreDiverged(
                self.partition,
                f"Redis holds token {held.token}, checkpoint {held.position or 'none'}, {held.size} ids "
                f"(its count says {held.count}); this owner wrote token {self.token}, checkpoint {self._checkpoint}",
            )
        return reply

    # -- the gate's reads ----------------------------------------------------------------------

    def might_contain(self, record_id: str) -> bool:
        return not self.use_filters or self.filters.might_contain(record_id)

    def advance(self, ingest_time_ms: int) -> None:
        """Stream time only moves forward; GC and the horizon check follow it."""
        if ingest_time_ms > self.stream_time_ms:
            self.stream_time_ms = ingest_time_ms

    def beyond_horizon(self, ingest_time_ms: int) -> bool:
        return self.filters.beyond_horizon(ingest_time_ms, self.stream_time_ms)

    def expired_buckets(self) -> list[int]:
        """Buckets of the exact store that have left the horizon (GC candidates)."""
        stale = []
        horizon = self.filters.spec.horizon_ms
        now_bucket = self.filters.bucket_of(self.stream_time_ms)
        for key in self._bucket_keys():
            start = int(key.decode().rsplit(":", 1)[1])
            if start + horizon <= now_bucket:
                stale.append(start)
        return sorted(stale)

    def _bucket_keys(self) -> list[bytes]:
        with unavailable_on_error(self._name):
            return list(self._redis.scan_iter(match=f"{self.keys.bucket_prefix}*", count=1000))

    def bucket_ids(self, start_ms: int, limit: int) -> list[bytes]:
        ids = []
        with unavailable_on_error(self._name):
            for record_id in self._redis.sscan_iter(self.keys.bucket(start_ms), count=1000):
                ids.append(record_id)
                if len(ids) >= limit:
                    break
        return ids

    # -- KeyValueStore -------------------------------------------------------------------------

    @property
    def checkpoint(self) -> int | None:
        return self._checkpoint

    def get(self, key: bytes) -> bytes | None:
        """The exact answer for one id, from a Redis checked to hold everything this owner
        wrote (StoreDiverged otherwise): what settles a Bloom filter's "maybe"."""
        found: bytes | None = self._call(self._read, [self.token, expect(self._checkpoint), key]).rest[0]
        return found or None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self._redis.hscan_iter(self.keys.ids, count=5000))

    def __len__(self) -> int:
        return int(self._redis.hlen(self.keys.ids))

    def audit(self) -> None:
        with unavailable_on_error(self._name):
            self._watch.changed()
        self._call(self._read, [self.token, expect(self._checkpoint)])

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        if checkpoint is not None and self._checkpoint is not None and checkpoint < self._checkpoint:
            checkpoint = None  # the checkpoint never moves back (the changes are already in)
        pairs = list(changes.items())  # unique ids: the script reads every id's bucket once, up front
        chunks = [pairs[i : i + APPLY_CHUNK] for i in range(0, len(pairs), APPLY_CHUNK)] or [[]]
        keys = [self.keys.meta, self.keys.ids, self.keys.bucket_prefix]
        expected = expect(self._checkpoint)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            # Between chunks the checkpoint names the chunk, so a Redis rolled back to the middle
            # of a transaction's apply is caught too (and a new owner that finds one rebuilds).
            if checkpoint is None:
                new = ""
            else:
                new = str(checkpoint) if last else f"{checkpoint}~{index}"
            argv: list[bytes | str | int] = [self.token, expected, new]
            for key, value in chunk:
                argv += [key, b"" if value is None else value]
            self._call(self._apply, argv, keys, landed=new)
            if new and expected != UNCHECKED:
                expected = new
        for key, value in pairs:
            if value is not None:
                self._remember(key.decode(), int(value))
        if checkpoint is not None:
            self._checkpoint = checkpoint
        with unavailable_on_error(self._name):
            wait_for_replicas(self._redis, *self._wait)
        self.filters.expire(self.stream_time_ms)

    def reset(self) -> None:
        """Empty this partition in Redis and in memory, with a newer token: a rebuild from the
        start of the changelog follows. A newer owner's store is never touched (FencedError)."""
        bucket_keys = [key.decode() for key in self._bucket_keys()]
        self.token = self._call(self._reset, [self.token], [self.keys.meta, self.keys.ids, *bucket_keys]).newest_token
        self._checkpoint = None
        self.filters = BloomBuckets(self.filters.spec)

    def close(self) -> None:
        """Nothing to release: Redis keeps the ids for whoever owns the partition next."""
