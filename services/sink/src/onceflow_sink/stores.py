"""The result store a sink is configured with (``ONCEFLOW_SINK_STORE``), for the service and for
the tools that read what it applied (verify's checker, the job lifecycle)."""

from __future__ import annotations

from onceflow.config import CommonSettings
from onceflow.redis_client import connect
from onceflow.state.result_store import ResultStore

STORES = ("redis", "postgres")


def open_store(common: CommonSettings, store: str = "redis", *, check: bool = False) -> ResultStore:
    """The store named ``store``; ``check``: reach it now, so a wrong address fails at startup
    with the address in the error rather than at the first batch."""
    if store == "postgres":
        from onceflow_sink.postgres import PostgresTables  # psycopg only where it is used

        return PostgresTables.connect(common.postgres_url, common.topic_prefix, check=check)
    if store != "redis":
        raise ValueError(f"sink store {store!r}: want one of {', '.join(STORES)}")
    from onceflow_sink.tables import ResultTables

    client = connect(common.redis_url)
    if check:
        client.ping()
    return ResultTables(client, common.topic_prefix, common.redis_wait_replicas, common.redis_wait_timeout_ms)
