"""Every Redis reply that means "no writes now" is StoreUnavailable (retry, NOT_SERVING
meanwhile), decided by redis-py's exception class, since redis-py strips the codes it knows from
the message (issue 39, item 7); a stalled Redis fails within the socket timeout (item 8)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from pydantic import ValidationError
from redis._parsers.base import BaseParser

from onceflow.config import CommonSettings
from onceflow.redis_client import connect
from onceflow.state.redis_store import unavailable_on_error
from onceflow.state.store import StoreUnavailable

pytestmark = pytest.mark.hostile

REFUSALS = [
    "OOM command not allowed when used memory > 'maxmemory'.",
    "READONLY You can't write against a read only replica.",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
    "NOREPLICAS Not enough good replicas to write.",
    "LOADING Redis is loading the dataset in memory",
    "BUSY Redis is busy running a script.",
    "TRYAGAIN Multiple keys request during rehashing of slot",
]


@pytest.mark.parametrize("reply", REFUSALS, ids=[r.split()[0] for r in REFUSALS])
def test_a_refusal_as_redis_py_raises_it_is_store_unavailable(reply: str) -> None:
    error = BaseParser.parse_error(reply)  # what redis-py raises for this reply: OOM -> OutOfMemoryError("command not ...")
    with pytest.raises(StoreUnavailable, match=reply.split()[0]):
        with unavailable_on_error("store"):
            raise error


@pytest.mark.parametrize("reply", ["ERR Error running script: attempt to compare nil with number", "WRONGTYPE Operation against a key",
                                   "NOSCRIPT No matching script"])
def test_a_bug_stays_a_bug(reply: str) -> None:
    with pytest.raises(redis.ResponseError):
        with unavailable_on_error("store"):
            raise BaseParser.parse_error(reply)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts and never answers: a stopped Redis, as a client sees it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(2)
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_stalled_redis_is_store_unavailable_within_the_socket_timeout(silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEFLOW_REDIS_SOCKET_TIMEOUT_S", "1.2")
    client = connect(f"redis://127.0.0.1:{silent_server}/0")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="Timeout"):
        with unavailable_on_error("store"):
            client.hget("k", "f")
    assert time.monotonic() - started < 5  # one timeout, not one per client retry


def test_the_socket_timeout_outlasts_the_replica_wait() -> None:
    with pytest.raises(ValidationError, match="ONCEFLOW_REDIS_SOCKET_TIMEOUT_S"):
        CommonSettings(redis_socket_timeout_s=1.0, redis_wait_timeout_ms=1000)
