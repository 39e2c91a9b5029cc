"""The result tables in Redis and the scripts that write them.

A batch of changes from one compute.results partition is applied by one Lua call that,
atomically: (1) checks the partition's fencing token (a new owner first takes a higher one:
MillWheel's "read before write"), (2) checks continuity: Redis must hold exactly the offset this
owner last applied, (3) applies upserts and retractions, (4) stores the new offset.

Redis holds derived state only: compute.results (compacted by job + row key) is the truth. A
Redis that lost or rolled back writes (a failover to a lagging replica, the fsync window, a
flush) holds an older offset or none; the script then writes nothing and answers ``diverged``,
and the worker rebuilds the partition's rows by replaying compute.results from its start
(``retake`` then apply). Every row key is always in the same partition, so one partition's
replay rewrites exactly its own rows.

Keys (docs/key-layouts.md); one hash tag for all, so one script may touch every table:

- ``onceflow:{<prefix>sink}:table:<job>``  HASH row key -> row value (what users read)
- ``onceflow:{<prefix>sink}:partition:<p>`` HASH token, offset (last applied), rejected
- ``onceflow:{<prefix>sink}:tablemeta:<job>`` HASH fingerprint (the job's state fingerprint of
  the last change applied: docs/decisions/0023)
- ``onceflow:{<prefix>sink}:alias:<job>`` HASH table (the live version's table name, e.g.
  ``orders@2``), offset (the ``jobs.registry`` offset that said so): what the job's plain name
  reads (``aliases.py`` writes it, ``resolve`` reads it)

A version of a job (``orders@2``, onceflow.versions) is a job of its own name here: its own
table. Query reads a plain name through its alias, if it has one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import redis

from onceflow.state.fencing import Outcome, Position, Reply, take_token, token_check
from onceflow.state.redis_store import RedisWatch, as_bytes, decode, expect, unavailable_on_error, wait_for_replicas
from onceflow.state.result_store import Answer, Change, ScanPage
from onceflow.topology import SEPARATOR
from onceflow.v1.sink_pb2 import ScanPosition

from onceflow_sink.pages import check_pinned, position_of

# Scan's work per call (issue 39): each HSCAN step asks for this many fields at least (Redis
# takes COUNT as a hint), and a call stops stepping once it has asked for this many in all.
SCAN_STEP_COUNT = 1_000
SCAN_EXAMINED_PER_CALL = 20_000

# What a partition's meta says its rows reflect: the last compute.results offset applied.
OFFSET = Position("offset")

# KEYS: partition meta, table key prefix, table meta key prefix. ARGV: token, the offset expected
# in Redis ('' none; '*' skips the check: the sabotaged build only), the new last offset ('' =
# only check), the number n of job, fingerprint pairs that follow (each table's meta), then op,
# job, key, value quadruples (op "+" upsert, "-" retract). Fencing, then continuity, first
# (onceflow.state.fencing). Returns {status, newest token, stored offset ('' none)}.
_APPLY = token_check(OFFSET.stored) + OFFSET.continuity() + """
local table_prefix, table_meta_prefix = KEYS[2], KEYS[3]
if ARGV[3] == '' then
  return {'checked', newest, stored}
end
local metas = tonumber(ARGV[4])
for i = 5, 4 + 2 * metas, 2 do
  redis.call('HSET', table_meta_prefix .. ARGV[i], 'fingerprint', ARGV[i + 1])
end
for i = 5 + 2 * metas, #ARGV, 4 do
  local table_key = table_prefix .. ARGV[i + 1]
  if ARGV[i] == '+' then
    redis.call('HSET', table_key, ARGV[i + 2], ARGV[i + 3])
  else
    redis.call('HDEL', table_key, ARGV[i + 2])
  end
end
redis.call('HSET', meta, 'offset', ARGV[3])
return {'applied', newest, ARGV[3]}
"""

# A rebuild's first step: a token newer than any this owner saw (unless a newer owner holds
# the partition) and no offset, so the replay from the start of compute.results is checked too.
_RETAKE = token_check("''") + OFFSET.retake() + """
return {'retaken', token, ''}
"""


# KEYS: the alias. ARGV: the live version's table ('' : none, the job left the registry), the
# jobs.registry offset of the record that said so. Written only if that offset is not older than
# the one stored: a sink stopped (SIGSTOP, a long GC) and resumed with an old view of the
# registry never moves an alias back. Returns {1 written / 0 refused, the offset Redis holds}.
_ALIAS = """
local stored = redis.call('HGET', KEYS[1], 'offset')
if stored and tonumber(stored) > tonumber(ARGV[2]) then
  return {0, stored}
end
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[1], 'table')
else
  redis.call('HSET', KEYS[1], 'table', ARGV[1])
end
redis.call('HSET', KEYS[1], 'offset', ARGV[2])
return {1, ARGV[2]}
"""


class ResultTables:
    """The result tables in Redis: the sink contract's first store (onceflow.state.result_store)."""

    name = "Redis"

    def __init__(self, client: redis.Redis, topic_prefix: str, wait_replicas: int = 0, wait_timeout_ms: int = 1000) -> None:
        self._redis = client
        self._wait = (wait_replicas, wait_timeout_ms)
        self._base = f"onceflow:{{{topic_prefix}sink}}"
        self._apply = client.register_script(_APPLY)
        self._retake = client.register_script(_RETAKE)
        self._alias = client.register_script(_ALIAS)
        self.watch = RedisWatch(client)  # restarts and failovers, for the logs and Status

    def table_key(self, job: str) -> str:
        return f"{self._base}:table:{job}"

    def table_meta_key(self, job: str) -> str:
        return f"{self._base}:tablemeta:{job}"

    def alias_key(self, job: str) -> str:
        return f"{self._base}:alias:{job}"

    def meta_key(self, partition: int) -> str:
        return f"{self._base}:partition:{partition}"

    def applied_offset(self, partition: int) -> int:
        """The last offset of compute.results applied to ``partition``'s rows (-1: none); read
        only, no token taken."""
        with unavailable_on_error(f"sink partition {partition}"):
            offset = self._redis.hget(self.meta_key(partition), "offset")
        return -1 if offset is None else int(offset)

    def take_ownership(self, partition: int) -> tuple[int, int]:
        """A new owner's first step: the next fencing token, and the last applied offset
        (-1 when none). Whatever Redis holds then is a consistent prefix of compute.results
        (each script applies whole), so resuming after it is exact."""
        with unavailable_on_error(f"sink partition {partition}"):
            token = take_token(self._redis, self.meta_key(partition))
            offset = self._redis.hget(self.meta_key(partition), "offset")
        return token, -1 if offset is None else int(offset)

    def apply(self, partition: int, token: int, applied: int, last_offset: int | None, changes: Iterable[Change]) -> Answer:
        """Apply changes up to ``last_offset`` if Redis holds exactly ``applied`` (-1: nothing);
        ``last_offset`` None only checks that."""
        quads: list[str | bytes | int] = []
        fingerprints: dict[str, str] = {}
        for change in changes:
            quads += [change.op, change.job, change.key, change.value]
            if change.fingerprint:
                fingerprints[change.job] = change.fingerprint
        argv: list[str | bytes | int] = [
            token, expect(None if applied < 0 else applied), "" if last_offset is None else last_offset, len(fingerprints),
        ]
        for job, fingerprint in fingerprints.items():
            argv += [job, fingerprint]
        keys = [self.meta_key(partition), f"{self._base}:table:", f"{self._base}:tablemeta:"]
        answer = self._run(self._apply, partition, keys, argv + quads)
        if answer.outcome is Outcome.APPLIED:
            with unavailable_on_error(f"sink partition {partition}"):
                wait_for_replicas(self._redis, *self._wait)
        return answer

    def retake(self, partition: int, token: int) -> Answer:
        return self._run(self._retake, partition, [self.meta_key(partition)], [token])

    def _run(
        self, script: redis.commands.core.Script, partition: int, keys: list[str], argv: list[str | bytes | int]
    ) -> Answer:
        with unavailable_on_error(f"sink partition {partition}"):
            reply = Reply.parse(script(keys=keys, args=argv))
        stored = decode(reply.rest[0])  # every answer of these scripts says the offset Redis holds
        return Answer(reply.outcome, reply.newest_token, int(stored) if stored else -1)

    def refusal(self, change: Change) -> str:
        return ""  # a Redis hash holds any field and value

    @property
    def restarts_seen(self) -> int:
        return self.watch.changes

    def close(self) -> None:
        self._redis.close()

    def watch_identity(self) -> None:
        with unavailable_on_error("sink"):
            self.watch.changed()

    def table_fingerprint(self, job: str) -> str:
        """The state fingerprint of the job whose changes the table last took ("" if none said)."""
        value = self._redis.hget(self.table_meta_key(job), "fingerprint")
        return "" if value is None else decode(value)

    def rejected(self, partition: int) -> int:
        return int(self._redis.hget(self.meta_key(partition), "rejected") or 0)

    # -- aliases: a job's plain name and its live version --------------------------------------

    def set_alias(self, job: str, table: str, offset: int) -> bool:
        """Point ``job``'s plain name at ``table`` ('' : at its unversioned table), as the
        registry record at ``offset`` says; False if Redis holds a newer record's word."""
        written, _stored = self._alias(keys=[self.alias_key(job)], args=[table, offset])
        return bool(int(written))

    def alias(self, job: str) -> tuple[str, int] | None:
        """(table, registry offset) of ``job``'s alias; None if it has none."""
        fields = self._redis.hmget(self.alias_key(job), ["table", "offset"])
        table, offset = (decode(value) for value in fields)
        return (table, int(offset)) if offset else None

    def resolve(self, job: str) -> str:
        """The table a name reads: a version (``orders@2``) as it is; a plain name its alias'
        table, or, with no alias (a job never versioned, or none promoted yet), its own."""
        if SEPARATOR in job:
            return job
        table = self._redis.hget(self.alias_key(job), "table")
        return decode(table) or job

    def drop_table(self, table: str) -> None:
        """Delete a retired version's rows and meta (its changes are skipped from then on)."""
        self._redis.delete(self.table_key(table), self.table_meta_key(table))

    # -- reads -------------------------------------------------------------------------------

    def get(self, table: str, key: str) -> bytes | None:
        value = self._redis.hget(self.table_key(table), key)
        return None if value is None else as_bytes(value)

    def scan(
        self, job: str, prefix: str, limit: int, token: bytes = b"", *, deadline: float | None = None,
    ) -> tuple[list[tuple[str, bytes]], bytes]:
        """``scan_page``'s rows and token (the table it reads is in the token)."""
        page = self.scan_page(job, prefix, limit, token, deadline=deadline)
        return page.rows, page.token

    def scan_page(
        self, job: str, prefix: str, limit: int, token: bytes = b"", *, deadline: float | None = None,
    ) -> ScanPage:
        """At most ``limit`` rows under ``prefix`` from where ``token`` left off, and the token
        to go on from (empty: done). Rows of an HSCAN step beyond the page go into the token as
        keys, so nothing is skipped and no step is repeated; their values are read when due.

        The first page resolves ``job`` (``resolve``) and the token pins that table: a scan that
        spans a promotion reads one version throughout, never rows of two.

        One call does bounded work, whatever the table and the prefix (issue 39): about
        ``SCAN_EXAMINED_PER_CALL`` fields examined, and no new step once ``deadline``
        (``time.monotonic()``) has passed. A prefix matching nothing in a big table therefore
        answers an empty page with a token, not a scan of the whole table; the client goes on
        from the token. At least one step is taken, so every call makes progress.
        Raises ``ValueError`` for a token this method did not make, or made for another job."""
        position = position_of(token)
        if position.table:
            check_pinned(job, position.table)
        table = position.table or self.resolve(job)  # tokens made before the pin resolve again
        table_key = self.table_key(table)
        pending = list(position.pending_keys)
        cursor, done = position.hscan_cursor, position.hscan_done
        rows: list[tuple[str, bytes]] = []
        if pending:
            due, pending = pending[:limit], pending[limit:]
            values = self._redis.hmget(table_key, due)
            rows.extend((key, as_bytes(value)) for key, value in zip(due, values) if value is not None)
        pattern = _glob_escape(prefix) + "*"
        count = max(limit, SCAN_STEP_COUNT)
        steps = 0
        while not pending and not done and len(rows) < limit:
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if steps and (steps * count >= SCAN_EXAMINED_PER_CALL or out_of_time):
                break
            steps += 1
            cursor, found = self._redis.hscan(table_key, cursor=cursor, match=pattern, count=count)
            done = cursor == 0
            if not isinstance(found, dict):  # redis-py types HSCAN's NOVALUES answer (a list) too
                raise TypeError(f"HSCAN answered a {type(found).__name__}, not field-value pairs")
            step = sorted((decode(key), as_bytes(value)) for key, value in found.items())
            room = limit - len(rows)
            rows.extend(step[:room])
            pending = [key for key, _ in step[room:]]
        if done and not pending:
            return ScanPage(sorted(rows), b"", table)
        after = ScanPosition(hscan_cursor=cursor, hscan_done=done, pending_keys=pending, table=table)
        return ScanPage(sorted(rows), after.SerializeToString(), table)

    def table(self, job: str) -> dict[bytes, bytes]:
        return {as_bytes(key): as_bytes(value) for key, value in self._redis.hgetall(self.table_key(job)).items()}


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
