"""The one way services connect to Redis."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry


def connect(url: str) -> redis.Redis:
    """A client that rides out a Redis restart: connection errors are retried with backoff."""
    return redis.Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=20),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        health_check_interval=30,
    )


def delete_prefix(client: redis.Redis, topic_prefix: str) -> None:
    """Drop every onceflow key of one topic prefix (tests' and benchmarks' own pipelines)."""
    for key in client.scan_iter(match=f"onceflow:{{{topic_prefix}*"):
        client.delete(key)
