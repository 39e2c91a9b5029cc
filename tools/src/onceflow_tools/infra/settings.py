"""Ports of the local stack (``ONCEFLOW_KAFKA_PORT``, ``ONCEFLOW_KAFKA_CONTROLLER_PORT``,
``ONCEFLOW_REDIS_PORT``, ``ONCEFLOW_POSTGRES_PORT``).

Clients read ``ONCEFLOW_KAFKA_BOOTSTRAP`` / ``ONCEFLOW_REDIS_URL`` / ``ONCEFLOW_POSTGRES_URL``
(CommonSettings). When a port
is not set explicitly it is taken from those, so setting only the client address moves the
server too and the two cannot drift apart.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow.config import CommonSettings

DEFAULT_KAFKA_PORT = 19092
DEFAULT_KAFKA_CONTROLLER_PORT = 19093
DEFAULT_REDIS_PORT = 16379
DEFAULT_POSTGRES_PORT = 15432
SENTINEL_OFFSET = 10_000
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


class InfraSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONCEFLOW_", extra="ignore")

    kafka_port: int | None = None
    kafka_controller_port: int = DEFAULT_KAFKA_CONTROLLER_PORT
    # Secure mode's second client listener: mutual TLS (SSL with a client certificate the CA
    # signed). 0: the SASL_SSL listener's port + 2.
    kafka_mtls_port: int = 0
    # 1: one broker (the default: demo and most tests). 3: a KRaft cluster of three combined
    # broker+controller nodes (`onceflow infra up --brokers 3`), topics with 3 replicas, 2 in sync.
    kafka_brokers: int = 1

    @field_validator("kafka_brokers")
    @classmethod
    def _one_or_three(cls, value: int) -> int:
        if value not in (1, 3):
            raise ValueError("ONCEFLOW_KAFKA_BROKERS takes 1 (one broker) or 3 (a cluster)")
        return value
    redis_port: int | None = None
    # single: one redis-server. sentinel: a primary, a replica on the next port and a Sentinel
    # (ONCEFLOW_REDIS_SENTINEL_PORT, default the primary's + 10000) that fails over between them;
    # services then take ONCEFLOW_REDIS_URL=redis+sentinel://127.0.0.1:<sentinel port>/onceflow/0.
    redis_topology: Literal["single", "sentinel"] = "single"
    redis_sentinel_port: int | None = None
    # The AOF's fsync policy: always, everysec (up to ~1 s of writes lost on a machine crash) or no.
    redis_appendfsync: Literal["always", "everysec", "no"] = "everysec"
    # The local PostgreSQL (`onceflow infra up --postgres`); None: the port of ONCEFLOW_POSTGRES_URL.
    postgres_port: int | None = None
    # none: compute runs Spark in its own process (local[*]). standalone: `infra up` also starts
    # a Spark master and workers from the pyspark wheel (`onceflow infra up --spark standalone`);
    # compute then takes ONCEFLOW_COMPUTE_SPARK_MASTER=spark://127.0.0.1:<master port>.
    # connect: a Spark Connect server (its driver on spark_connect_master); compute then takes
    # ONCEFLOW_COMPUTE_SPARK_MASTER=sc://127.0.0.1:<spark_connect_port>.
    spark_cluster: Literal["none", "standalone", "connect"] = "none"
    # The master's RPC port; workers take the next ports, web UIs the same plus 100.
    spark_master_port: int = 17077
    spark_workers: int = Field(default=2, ge=1, le=8)
    spark_worker_cores: int = Field(default=1, ge=1)
    spark_worker_memory: str = "1g"
    spark_connect_port: int = 17002
    spark_connect_master: str = "local[2]"
    spark_connect_memory: str = "1g"
    # The broker with a SASL_SSL listener and Redis with TLS and a password, certificates and
    # passwords generated for this home (`onceflow infra up --secure`; onceflow_tools.infra.secure).
    secure: bool = False
    # Seconds `up` waits for each component to answer; Spark's JVMs (a master and its workers, a
    # Connect server) take longer on a busy 2-core machine.
    start_timeout_s: float = 90.0
    spark_start_timeout_s: float = 240.0


def port_of(address: str, default: int) -> int:
    """The port of ``host:port`` (or a URL) if the host is loopback, else ``default``."""
    parts = urlsplit(address if "//" in address else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        return default
    if port is None or (parts.hostname or "") not in _LOOPBACK:
        return default
    return port


def kafka_mtls_port(settings: InfraSettings | None = None) -> int:
    """The secure broker's mutual-TLS listener: ONCEFLOW_KAFKA_MTLS_PORT, else its SASL_SSL port + 2."""
    s = settings or InfraSettings()
    return s.kafka_mtls_port or kafka_port(s) + 2


def kafka_port(settings: InfraSettings | None = None) -> int:
    s = settings or InfraSettings()
    if s.kafka_port is not None:
        return s.kafka_port
    first = CommonSettings().kafka_bootstrap.split(",")[0].strip()
    return port_of(first, DEFAULT_KAFKA_PORT)


def redis_port(settings: InfraSettings | None = None) -> int:
    s = settings or InfraSettings()
    if s.redis_port is not None:
        return s.redis_port
    url = CommonSettings().redis_url
    if _is_sentinel_url(url):  # the URL names the Sentinel; the primary sits 10000 below it
        return port_of(url, DEFAULT_REDIS_PORT + SENTINEL_OFFSET) - SENTINEL_OFFSET
    return port_of(url, DEFAULT_REDIS_PORT)


def postgres_port(settings: InfraSettings | None = None) -> int:
    s = settings or InfraSettings()
    if s.postgres_port is not None:
        return s.postgres_port
    return port_of(CommonSettings().postgres_url, DEFAULT_POSTGRES_PORT)


def sentinel_port(settings: InfraSettings | None = None) -> int:
    s = settings or InfraSettings()
    if s.redis_sentinel_port is not None:
        return s.redis_sentinel_port
    url = CommonSettings().redis_url
    if _is_sentinel_url(url):
        return port_of(url, DEFAULT_REDIS_PORT + SENTINEL_OFFSET)
    return redis_port(s) + SENTINEL_OFFSET


def _is_sentinel_url(url: str) -> bool:
    return url.startswith("redis+sentinel://")
