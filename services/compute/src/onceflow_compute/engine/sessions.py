"""How compute reaches Spark: a classic session (``local[*]`` or ``spark://``: the driver runs
in this process) or a Spark Connect session (``sc://host:port``: the driver runs in the Connect
server, this process is a thin gRPC client). The engine talks to either through a Flavour, the
few calls whose API differs: shipping the job's code, cancelling a batch, the log level, and
telling a lost server from a failing job."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

CONNECT_SCHEME = "sc://"

# Runtime SQL settings: a Connect session may set these for itself.
SQL_SETTINGS = {
    "spark.sql.shuffle.partitions": None,  # the engine's shuffle_partitions
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # A micro-batch is a few MB. Under this threshold (48 MB by default) Arrow input becomes a
    # driver-side LocalRelation that the optimizer walks row by row (ConvertToLocalRelation):
    # 35-125 ms per 10k-row batch, measured.
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    # Adaptive execution re-plans after each shuffle stage: pure overhead at this size.
    "spark.sql.adaptive.enabled": "false",
}


def is_connect(master: str) -> bool:
    return master.startswith(CONNECT_SCHEME)


class ConnectServerDown(ConnectionError):
    """Nothing listens at the master URL's address (a Connect server's or standalone masters')."""


def build_session(
    master: str, app_name: str, shuffle_partitions: int, driver_memory: str, java_options: str,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """A new session on ``master``. Static settings (the driver's memory and JVM options, the
    UI) reach only a driver this process starts; a Connect server has its own. ``conf`` (the
    user's) goes last, so it wins."""
    from pyspark.sql import SparkSession

    sql = {**SQL_SETTINGS, "spark.sql.shuffle.partitions": str(shuffle_partitions), **(conf or {})}
    if is_connect(master):
        _probe(master)  # fail at once, not after the client's own retries
        builder = SparkSession.builder.remote(master)
        for key, value in sql.items():
            builder = builder.config(key, value)
        return builder.create()
    if master.startswith("spark://"):
        _probe(master)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.driver.memory", driver_memory)
        # The driver JVM starts with the session (client mode), so this reaches it.
        .config("spark.driver.extraJavaOptions", java_options)
    )
    for key, value in sql.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _probe(master: str, timeout_s: float = 2.0) -> None:
    """Refuse at once a master nobody listens at: Spark itself would retry for a minute (a
    standalone master) or ten (Connect) before saying so. A standalone URL may list several
    masters (high availability): one answering is enough."""
    scheme, _, rest = master.partition("://")
    default_port = 15002 if scheme == "sc" else 7077
    addresses = []
    for host_port in rest.split("/", 1)[0].split(";", 1)[0].split(","):
        parts = urlsplit(f"//{host_port}")
        addresses.append((parts.hostname or "localhost", parts.port or default_port))
    errors = []
    for address in addresses:
        try:
            with socket.create_connection(address, timeout=timeout_s):
                return
        except OSError as exc:
            errors.append(f"{address[0]}:{address[1]} ({exc})")
    what = "Spark Connect server" if scheme == "sc" else "Spark master"
    raise ConnectServerDown(f"no {what} answers at {', '.join(errors)}")


class Flavour(Protocol):
    def ship(self, path: Path) -> None: ...

    def quiet(self) -> None: ...

    def tag(self, tag: str) -> None:
        """Mark the jobs this thread starts from now on, so ``cancel(tag)`` can stop them."""

    def untag(self, tag: str) -> None: ...

    def cancel(self, tag: str) -> None: ...

    def unavailable(self, exc: BaseException) -> bool:
        """True if ``exc`` says Spark itself is out of reach (not that the job failed)."""


class ClassicFlavour:
    def __init__(self, session: Any) -> None:
        self.context = session.sparkContext

    def ship(self, path: Path) -> None:
        self.context.addPyFile(str(path))

    def quiet(self) -> None:
        self.context.setLogLevel("WARN")

    def tag(self, tag: str) -> None:
        self.context.setJobGroup(tag, "onceflow micro-batch", interruptOnCancel=True)

    def untag(self, tag: str) -> None:
        pass  # the next batch sets its own group

    def cancel(self, tag: str) -> None:
        self.context.cancelJobGroup(tag)

    def unavailable(self, exc: BaseException) -> bool:
        return classic_lost(exc)


_CLASSIC_LOST = ("stopped SparkContext", "SparkContext was shut down", "SparkContext has been shutdown")
# Connect's own errors that mean the server (or its session) is gone, not that a job failed.
_CONNECT_LOST = ("UNAVAILABLE", "INVALID_HANDLE.SESSION", "NO_ACTIVE_SESSION", "Connection refused", "Socket closed")


class ConnectFlavour:
    def __init__(self, session: Any) -> None:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        self.session = session
        # The client's default retries wait up to 10 minutes for a lost server; a worker should
        # notice in seconds, report itself unhealthy, and retry the batch on its own backoff.
        session.client.set_retry_policies(
            [DefaultPolicy(max_retries=5, initial_backoff=200, backoff_multiplier=2.0, max_backoff=2000, jitter=0)]
        )

    def ship(self, path: Path) -> None:
        self.session.addArtifacts(str(path), pyfile=True)

    def quiet(self) -> None:
        pass  # the server's log level is the server's

    def tag(self, tag: str) -> None:
        self.session.addTag(tag)

    def untag(self, tag: str) -> None:
        self.session.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.session.interruptTag(tag)

    def unavailable(self, exc: BaseException) -> bool:
        return connect_lost(exc)


def classic_lost(exc: BaseException) -> bool:
    """The driver is this process: a master lost mid-run shows as a stalled batch. But a master
    that does not answer, or a context Spark shut down (an application the cluster removed,
    or one whose master never answered), never comes back by itself."""
    return isinstance(exc, ConnectServerDown) or any(marker in str(exc) for marker in _CLASSIC_LOST)


def connect_lost(exc: BaseException) -> bool:
    """The Connect server is down, or restarted (its sessions are gone). Past its retries the
    client raises the last gRPC error (wrapped as SparkConnectGrpcException), so the status
    shows in the text."""
    if isinstance(exc, ConnectServerDown):
        return True
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _CONNECT_LOST)


def flavour(session: Any) -> Flavour:
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return ConnectFlavour(session)
    return ClassicFlavour(session)


def drop(session: Any) -> None:
    """Forget a session Spark lost: a Connect one without the release call that would wait on
    its server. It stops being the default session, so the next one becomes it."""
    session.release_session_on_close = False
    try:
        session.stop()
    except Exception:  # noqa: BLE001 - best effort: it is gone either way
        pass
