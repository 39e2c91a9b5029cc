"""The one way services connect to Redis: ``redis://host:port/db`` for one server, or
``redis+sentinel://host:port[,host:port...]/<master name>/<db>`` for a primary that Sentinel
fails over (docs/redis.md)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from onceflow.config import CommonSettings, secret
from onceflow.redis_urls import SENTINEL_SCHEME, parse_sentinel_url

__all__ = ["SENTINEL_SCHEME", "connect", "delete_prefix", "parse_sentinel_url"]

def connect(url: str) -> redis.Redis:
    """A client that rides out a Redis restart or failover: connection errors are retried with
    backoff (through Sentinel, each retry asks again which server is the primary; a demoted
    primary's READONLY counts as a connection error there); a command unanswered for
    ONCEFLOW_REDIS_SOCKET_TIMEOUT_S fails at once (a stalled Redis). The password and, for rediss://,
    the CA come from ONCEFLOW_REDIS_PASSWORD(_FILE) and ONCEFLOW_REDIS_SSL_CA_FILE."""
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


def delete_prefix(client: redis.Redis, topic_prefix: str) -> None:
    """Drop every onceflow key of one topic prefix (tests' and benchmarks' own pipelines)."""
    for key in client.scan_iter(match=f"onceflow:{{{topic_prefix}*"):
        client.delete(key)
