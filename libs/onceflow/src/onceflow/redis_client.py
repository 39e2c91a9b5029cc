"""The one way services connect to Redis: ``redis://host:port/db`` for one server, or
``redis+sentinel://host:port[,host:port...]/<master name>/<db>`` for a primary that Sentinel
fails over (docs/redis.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"


def connect(url: str) -> redis.Redis:
    """A client that rides out a Redis restart or failover: connection errors are retried with
    backoff (through Sentinel, each retry asks again which server is the primary; a demoted
    primary's READONLY counts as a connection error there); a command unanswered for
    ONCEFLOW_REDIS_SOCKET_TIMEOUT_S fails at once (a stalled Redis). The password and, for rediss://,
    the CA come from ONCEFLOW_REDIS_PASSWORD(_FILE) and ONCEFLOW_REDIS_SSL_CA_FILE."""
    from onceflow.config import CommonSettings, secret

    common = CommonSettings()
    options: dict[str, Any] = {
        # A refused or reset connection is retried here; a timeout is not: each retry of a stalled
        # Redis would wait the socket timeout again (21 tries: minutes of a hung loop that says
        # SERVING). It fails at once, as StoreUnavailable, and the owner retries with backoff,
        # NOT_SERVING meanwhile (issue 39).
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20, supported_errors=(redis.ConnectionError,)),
        "socket_timeout": common.redis_socket_timeout_s,
        "socket_connect_timeout": min(2.0, common.redis_socket_timeout_s),
        "health_check_interval": 30,
    }
    if password := secret(common.redis_password, common.redis_password_file, "ONCEFLOW_REDIS_PASSWORD"):
        options["password"] = password
    if url.startswith("rediss://") and common.redis_ssl_ca_file:
        options["ssl_ca_certs"] = common.redis_ssl_ca_file
    if not url.startswith(f"{SENTINEL_SCHEME}://"):
        return redis.Redis.from_url(url, **options)
    sentinels, master, db = parse_sentinel_url(url)
    sentinel = Sentinel(sentinels, sentinel_kwargs={"socket_timeout": 1.0, "socket_connect_timeout": 1.0})
    primary: redis.Redis = sentinel.master_for(master, db=db, **options)
    return primary


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int]:
    """(Sentinel addresses, master name, db) of a ``redis+sentinel://`` URL; ValueError saying
    what is wrong otherwise."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL: {url!r}")
    sentinels = []
    for address in filter(None, parts.netloc.split(",")):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"Sentinel address {address!r} in {url!r} is not host:port")
        sentinels.append((host, int(port)))
    if not sentinels:
        raise ValueError(f"no Sentinel address in {url!r}")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"want {SENTINEL_SCHEME}://host:port[,host:port]/<master name>[/<db>], got {url!r}")
    return sentinels, path[0], int(path[1]) if len(path) == 2 else 0


def delete_prefix(client: redis.Redis, topic_prefix: str) -> None:
    """Drop every onceflow key of one topic prefix (tests' and benchmarks' own pipelines)."""
    for key in client.scan_iter(match=f"onceflow:{{{topic_prefix}*"):
        client.delete(key)
