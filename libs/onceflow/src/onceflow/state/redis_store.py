"""What every store kept in Redis shares: Redis errors as store errors, the replica wait, and
the watch on Redis' identity.

Redis holds derived state only; Kafka holds the truth. Each Redis store writes through a Lua
script that states the position (changelog checkpoint or result offset) its owner expects Redis
to hold, and refuses with ``diverged`` when Redis holds anything else: the owner then rebuilds
from Kafka (docs/redis.md, docs/architecture.md). Those checks, and the fencing of stale owners,
are ``onceflow.state.fencing``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from onceflow import faults
from onceflow.state.store import StoreUnavailable

log = logging.getLogger(__name__)

# ARGV value that tells a store script not to check continuity: only the sabotaged build
# (faults.SABOTAGES "redis_unchecked") sends it, to prove verify catches a store that trusts Redis.
UNCHECKED = "*"


def expect(position: int | None) -> str:
    """The position as the scripts compare it ('' = none yet), or UNCHECKED when sabotaged."""
    if faults.sabotaged("redis_unchecked"):
        return UNCHECKED
    return "" if position is None else str(position)


# Redis cannot take (or serve) writes now; nothing was decided, a retry later will do. redis-py
# turns the error codes it knows into these classes and strips the code from the message, so a
# prefix match on the message misses them (issue 39): a full Redis (OOM, with maxmemory-policy
# noeviction) crash-looped the services. LOADING (BusyLoadingError) and AUTH errors are
# ConnectionErrors already.
UNAVAILABLE_ERRORS: tuple[type[redis.RedisError], ...] = (
    redis.ConnectionError,  # down, refused, reset, the client's retries spent; LOADING; NOAUTH/WRONGPASS
    redis.TimeoutError,  # stalled: no reply within ONCEFLOW_REDIS_SOCKET_TIMEOUT_S
    redis.exceptions.OutOfMemoryError,  # OOM: maxmemory reached under noeviction
    redis.exceptions.ReadOnlyError,  # READONLY: a replica, or a demoted primary
    redis.exceptions.MasterDownError,  # MASTERDOWN: a replica that lost its primary
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)
# The codes redis-py has no class for: it leaves them at the start of the message.
UNAVAILABLE_CODES = ("MISCONF", "NOREPLICAS", "BUSY", "LOADING", "READONLY", "OOM", "MASTERDOWN")


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis cannot take writes now (retry later), not that the request or
    a script is wrong (a bug)."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    # A script's redis.call error can come back as a plain ResponseError with the code inside.
    return isinstance(exc, redis.ResponseError) and str(exc).lstrip().startswith(UNAVAILABLE_CODES)


@contextmanager
def unavailable_on_error(what: str) -> Iterator[None]:
    """Redis down or stalled (after the client's own retries), full (OOM), MISCONF (disk full),
    READONLY (a replica), NOREPLICAS, MASTERDOWN, LOADING, BUSY: nothing was decided, retry later
    (the owner turns NOT_SERVING meanwhile, docs/redis.md). Script errors and the like stay bugs."""
    try:
        yield
    except redis.RedisError as exc:
        if not is_unavailable(exc):
            raise
        code = getattr(exc, "status_code", None) or type(exc).__name__
        raise StoreUnavailable(f"{what}: Redis unavailable ({code}): {exc}") from exc


def decode(value: bytes | str | int | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: bytes | str) -> bytes:
    """A reply as bytes. onceflow's clients never decode replies, but redis-py types every reply
    as either."""
    return value if isinstance(value, bytes) else value.encode()


class RedisWatch:
    """Redis' run_id and replication id, read at most once per ``interval_s``. A change means a
    restart or a failover. It is logged, so an operator can tie a repair to its cause; whether
    anything was lost is for the continuity checks to say (a restart that lost nothing a store
    wrote needs no repair)."""

    def __init__(self, client: redis.Redis, interval_s: float = 1.0) -> None:
        self._redis = client
        self._interval_s = interval_s
        self._next = 0.0
        self.identity = ""
        self.changes = 0

    def changed(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._interval_s
        info = self._redis.info("server") | self._redis.info("replication")
        identity = f"run_id {info.get('run_id', '?')}, replid {info.get('master_replid', '?')}"
        if identity == self.identity:
            return False
        if self.identity:
            self.changes += 1
            log.warning("Redis restarted or failed over (%s -> %s): auditing every store", self.identity, identity)
        self.identity = identity
        return True


def wait_for_replicas(client: redis.Redis, replicas: int, timeout_ms: int) -> None:
    """WAIT until ``replicas`` replicas have the writes so far (0: don't). A shortfall is logged,
    not fatal: a write a failover loses is caught by the continuity check and rebuilt."""
    if replicas <= 0:
        return
    acknowledged = int(client.execute_command("WAIT", replicas, timeout_ms))
    if acknowledged < replicas:
        log.warning("WAIT: %d of %d replicas acknowledged within %d ms", acknowledged, replicas, timeout_ms)
