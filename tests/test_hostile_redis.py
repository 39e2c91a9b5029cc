"""A broken Redis under a running sink (issue 39, items 7 and 8): full (OOM under noeviction),
read-only (a replica) or stalled (SIGSTOP) makes it NOT_SERVING with the reason, never an exit
or a silent hang, and once Redis takes writes again its table is compute.results applied exactly
once. Each test runs on the worker's own Redis (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable

import pytest

from onceflow.admin import fleet
from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.state.store import StoreUnavailable
from onceflow_tools.infra.redis import RedisServer
from tests.conftest import Pipeline, eventually
from tests.test_sink import changes, expected_table, produce, redis_table, sink, wait_applied

from onceflow_dedup.buckets import BucketSpec
from onceflow_dedup.store import DedupStore

pytestmark = [pytest.mark.hostile, pytest.mark.redis, pytest.mark.integration]

FAST_RETRY = {"ONCEFLOW_LOOP_RETRY_BACKOFF_S": "0.2", "ONCEFLOW_LOOP_MAX_RETRY_BACKOFF_S": "1"}


def _not_serving_with(endpoint: fleet.Endpoint, words: tuple[str, ...]) -> Callable[[], bool]:
    def check() -> bool:
        status = fleet.query(endpoint, None, 5.0)
        return status.health == "NOT_SERVING" and any(word in status.error for word in words)

    return check


def test_a_full_or_read_only_redis_is_waited_for_and_the_table_stays_exact(pipeline: Pipeline) -> None:
    proc, address = sink(pipeline, "a", **FAST_RETRY)
    proc.start()
    proc.wait_healthy(address)
    endpoint = fleet.Endpoint("sink", address)
    client = connect(pipeline.common.redis_url)
    produce(pipeline, changes(1_000, 300, seed=11))
    wait_applied(pipeline, 60)
    seed = 12
    # OOM: redis-py 8 raises OutOfMemoryError with the code stripped; READONLY (ReadOnlyError): a
    # Redis made a replica of a primary that is not there keeps its data and refuses writes.
    for refuse, allow, words in (
        (lambda: client.config_set("maxmemory", 1), lambda: client.config_set("maxmemory", 0), ("OOM",)),
        (lambda: client.execute_command("REPLICAOF", "127.0.0.1", "1"), lambda: client.execute_command("REPLICAOF", "NO", "ONE"),
         ("READONLY",)),
    ):
        refuse()
        try:
            produce(pipeline, changes(500, 300, seed=seed))
            seed += 1
            eventually(_not_serving_with(endpoint, words), 20, f"the sink to report Redis refusing writes ({words[0]})")
            assert proc.alive(), proc.log_tail()
        finally:
            allow()
        wait_applied(pipeline, 30)
        assert redis_table(pipeline) == expected_table(pipeline)
        eventually(lambda: fleet.query(endpoint, None, 5.0).health == "SERVING", 20, "the sink to serve again")
    assert proc.terminate() == 0, proc.log_tail()


def test_a_stalled_redis_turns_the_sink_not_serving_within_its_socket_timeout(pipeline: Pipeline) -> None:
    proc, address = sink(pipeline, "a", ONCEFLOW_REDIS_SOCKET_TIMEOUT_S="1.5", **FAST_RETRY)
    proc.start()
    proc.wait_healthy(address)
    endpoint = fleet.Endpoint("sink", address)
    produce(pipeline, changes(1_000, 300, seed=21))
    wait_applied(pipeline, 60)
    pid = RedisServer.from_env().pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        produce(pipeline, changes(500, 300, seed=22))
        stopped_at = time.monotonic()
        # The bound: one socket timeout, a poll, a status round; before, health said SERVING for good.
        eventually(_not_serving_with(endpoint, ("Timeout", "timed out")), 15, "the sink to report a stalled Redis")
        assert time.monotonic() - stopped_at < 15
        assert proc.alive(), proc.log_tail()
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_applied(pipeline, 30)
    assert redis_table(pipeline) == expected_table(pipeline)
    eventually(lambda: fleet.query(endpoint, None, 5.0).health == "SERVING", 20, "the sink to serve again")
    assert proc.terminate() == 0, proc.log_tail()


def test_the_gate_store_refuses_nothing_silently_and_fails_no_batch_on_a_redis_that_takes_no_writes(infra: None) -> None:
    """The gate's store through its real Lua scripts (redis-py raises OutOfMemoryError and
    ReadOnlyError for those replies, with the code stripped): each refusal is StoreUnavailable,
    which the shared loop retries (NOT_SERVING meanwhile), and the write lands once, afterwards."""
    client = connect(CommonSettings().redis_url)
    prefix = f"h{uuid.uuid4().hex[:8]}."
    store = DedupStore(client, prefix, 0, BucketSpec(bucket_ms=1000, horizon_ms=10_000, expected_per_bucket=1000))
    store.apply({b"a": b"1000"}, checkpoint=1)
    try:
        for refuse, allow, code in (
            (lambda: client.config_set("maxmemory", 1), lambda: client.config_set("maxmemory", 0), "OOM"),
            (lambda: client.config_set("min-replicas-to-write", 1), lambda: client.config_set("min-replicas-to-write", 0),
             "NOREPLICAS"),
            (lambda: client.execute_command("REPLICAOF", "127.0.0.1", "1"),
             lambda: client.execute_command("REPLICAOF", "NO", "ONE"), "READONLY"),
        ):
            refuse()
            try:
                with pytest.raises(StoreUnavailable, match=code):
                    store.apply({b"b": b"1000"}, checkpoint=2)
            finally:
                allow()
        store.apply({b"b": b"1000"}, checkpoint=2)
        assert store.get(b"b") == b"1000" and store.checkpoint == 2 and len(store) == 2
    finally:
        delete_prefix(client, prefix)
