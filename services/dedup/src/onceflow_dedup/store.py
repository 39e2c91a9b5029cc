"""The exact store of one ingest.records partition: every record_id the gate let through,
filed under its ingest-time bucket, in Redis, with that partition's Bloom filters in front.

It is a ``KeyValueStore`` of the shared loop (key = record_id, value = bucket start in ms,
decimal): ``dedup.changelog`` is the truth, the loop calls ``apply`` only after a transaction
committed, and restore catches Redis up from the checkpoint kept beside the data.

Fencing (read before write): whoever is assigned the partition first takes a higher sequencer
token, and every write carries it. The apply script refuses a write whose token is no longer
the newest, so an instance that was paused across a takeover (a zombie) cannot touch the store
its replacement now owns. Refusals are counted in Redis and raise ``FencedError``.

Redis keys (docs/key-layouts.md), ``{...}`` being a cluster hash tag so one script sees them all:

- ``onceflow:{<prefix>dedup:<p>}:ids``       HASH record_id -> bucket start (ms)
- ``onceflow:{<prefix>dedup:<p>}:bucket:<b>`` SET of the record_ids filed under bucket b (for GC)
- ``onceflow:{<prefix>dedup:<p>}:meta``      HASH token, checkpoint, rejected
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import redis

from onceflow.redis_client import connect
from onceflow.txn.errors import FencedError

from onceflow_dedup.buckets import BloomBuckets, BucketSpec

log = logging.getLogger(__name__)

# Ids per script call: bounds how long one call blocks Redis.
APPLY_CHUNK = 2000

# KEYS: meta, ids, bucket key prefix. ARGV: token, checkpoint ('' = keep), then id, bucket
# pairs ('' bucket = delete). Returns {1, token} when applied, {0, newest token} when refused.
_APPLY = """
local meta, ids, bucket_prefix = KEYS[1], KEYS[2], KEYS[3]
local newest = tonumber(redis.call('HGET', meta, 'token') or '0')
if tonumber(ARGV[1]) ~= newest then
  redis.call('HINCRBY', meta, 'rejected', 1)
  return {0, newest}
end
for i = 3, #ARGV, 2 do
  local id, bucket = ARGV[i], ARGV[i + 1]
  -- The common case, a new id, costs two commands.
  if bucket ~= '' and redis.call('HSETNX', ids, id, bucket) == 1 then
    redis.call('SADD', bucket_prefix .. bucket, id)
  else
    local old = redis.call('HGET', ids, id)
    if old and old ~= bucket then
      local old_key = bucket_prefix .. old
      redis.call('SREM', old_key, id)
      if redis.call('SCARD', old_key) == 0 then redis.call('DEL', old_key) end
    end
    if bucket == '' then
      if old then redis.call('HDEL', ids, id) end
    elseif old ~= bucket then
      redis.call('HSET', ids, id, bucket)
      redis.call('SADD', bucket_prefix .. bucket, id)
    end
  end
end
if ARGV[2] ~= '' then
  local checkpoint = tonumber(redis.call('HGET', meta, 'checkpoint') or '-1')
  if tonumber(ARGV[2]) > checkpoint then redis.call('HSET', meta, 'checkpoint', ARGV[2]) end
end
return {1, newest}
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
    catches it up from the changelog past ``checkpoint``."""

    def __init__(
        self, client: redis.Redis, topic_prefix: str, partition: int, spec: BucketSpec, use_filters: bool = True
    ) -> None:
        self.partition = partition
        self.use_filters = use_filters
        self.keys = StoreKeys.of(topic_prefix, partition)
        self._redis = client
        self._apply = client.register_script(_APPLY)
        self.filters = BloomBuckets(spec)
        self.stream_time_ms = 0
        self.token = int(client.hincrby(self.keys.meta, "token", 1))
        checkpoint = client.hget(self.keys.meta, "checkpoint")
        self._checkpoint: int | None = None if checkpoint is None else int(checkpoint)
        started = time.monotonic()
        rebuilt = self._rebuild_filters()
        log.info(
            "dedup store %d: token %d, checkpoint %s, %d ids into %d filters in %.2fs",
            partition, self.token, self._checkpoint, rebuilt, len(self.filters.buckets), time.monotonic() - started,
        )

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
        for key in self._redis.scan_iter(match=f"{self.keys.bucket_prefix}*", count=1000):
            start = int(key.decode().rsplit(":", 1)[1])
            if start + horizon <= now_bucket:
                stale.append(start)
        return sorted(stale)

    def bucket_ids(self, start_ms: int, limit: int) -> list[bytes]:
        ids = []
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
        return self._redis.hget(self.keys.ids, key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self._redis.hscan_iter(self.keys.ids, count=5000))

    def __len__(self) -> int:
        return int(self._redis.hlen(self.keys.ids))

    def apply(self, changes: Mapping[bytes, bytes | None], checkpoint: int | None) -> None:
        pairs = list(changes.items())
        chunks = [pairs[i : i + APPLY_CHUNK] for i in range(0, len(pairs), APPLY_CHUNK)] or [[]]
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            argv: list[bytes | str | int] = [self.token, checkpoint if last and checkpoint is not None else ""]
            for key, value in chunk:
                argv += [key, b"" if value is None else value]
            applied, newest = self._apply(keys=[self.keys.meta, self.keys.ids, self.keys.bucket_prefix], args=argv)
            if not applied:
                raise FencedError(
                    f"dedup store of partition {self.partition}: write refused, token {self.token} "
                    f"is stale (newest {newest}): another instance owns this partition now"
                )
        for key, value in pairs:
            if value is not None:
                self._remember(key.decode(), int(value))
        if checkpoint is not None and (self._checkpoint is None or checkpoint > self._checkpoint):
            self._checkpoint = checkpoint
        self.filters.expire(self.stream_time_ms)

    def close(self) -> None:
        """Nothing to release: Redis keeps the ids for whoever owns the partition next."""
