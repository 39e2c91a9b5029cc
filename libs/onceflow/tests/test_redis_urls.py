"""ONCEFLOW_REDIS_URL: one server or a Sentinel set, and a clear error for anything else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from onceflow.config import CommonSettings
from onceflow.redis_urls import parse_sentinel_url


def test_a_sentinel_url_names_every_sentinel_the_master_and_the_db() -> None:
    assert parse_sentinel_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/onceflow/3") == (
        [("10.0.0.1", 26379), ("10.0.0.2", 26379)], "onceflow", 3,
    )
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/pipeline") == ([("127.0.0.1", 26379)], "pipeline", 0)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://127.0.0.1/onceflow/0", "not host:port"),
        ("redis+sentinel:///onceflow/0", "no Sentinel address"),
        ("redis+sentinel://127.0.0.1:26379", "master name"),
        ("redis+sentinel://127.0.0.1:26379/onceflow/db0", "master name"),
        ("http://127.0.0.1:6379/0", "want redis://"),
        ("127.0.0.1:6379", "want redis://"),
    ],
)
def test_a_bad_redis_url_fails_at_startup_saying_why(url: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        CommonSettings(redis_url=url)
