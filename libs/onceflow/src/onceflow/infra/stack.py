"""The whole local stack at once: what `onceflow infra up | down | status` and test fixtures call."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.config import CommonSettings
from onceflow.infra.kafka import KafkaBroker
from onceflow.infra.paths import display_path
from onceflow.infra.redis import RedisServer
from onceflow.infra.redis import topology as redis_topology
from onceflow.infra.settings import InfraSettings, port_of
from onceflow.infra.topics import ensure_topics


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    healthy: bool
    address: str
    pid: int | None
    detail: str


def install() -> dict[str, bool]:
    """Fetch the broker's jars and install redis-server if needed; True where work was done."""
    return {"kafka": KafkaBroker.from_env().install(), "redis": RedisServer.from_env().ensure_installed()}


def up(timeout: float | None = None, create_topics: bool = True) -> list[ComponentStatus]:
    """Start whatever is not running, wait until it answers, create the declared topics (with
    ONCEFLOW_TOPIC_PREFIX). Idempotent: on a healthy stack it only checks, in well under a second."""
    timeout = timeout if timeout is not None else InfraSettings().start_timeout_s
    broker, servers = KafkaBroker.from_env(), redis_topology()
    for server in servers:
        server.start(timeout)
    broker.start(timeout)
    broker.warm_up(timeout)
    if create_topics:
        ensure_topics(broker.bootstrap, CommonSettings().topic_prefix)
    return status(broker)


def down() -> list[str]:
    """Stop everything (cleanly, SIGKILL after a timeout); returns the names of those that ran."""
    broker = KafkaBroker.from_env()
    stopped = ["kafka"] if broker.stop() else []
    # Every Redis role, whatever the topology says now: one started as sentinel stays stoppable.
    for server in reversed(redis_topology(InfraSettings(redis_topology="sentinel"))):
        if server.stop():
            stopped.append(_redis_name(server))
    return stopped


def status(broker: KafkaBroker | None = None) -> list[ComponentStatus]:
    broker = broker or KafkaBroker.from_env()
    common = CommonSettings()
    return [_kafka_status(broker, common), *(_redis_status(server, common) for server in redis_topology())]


def _redis_name(server: RedisServer) -> str:
    return "redis" if server.role == "primary" else f"redis-{server.role}"


def _kafka_status(broker: KafkaBroker, common: CommonSettings) -> ComponentStatus:
    pid = broker.pid()
    healthy = pid is not None and broker.is_healthy()
    if healthy:
        detail = f"Kafka {broker.version} (KRaft), {display_path(broker.data_dir)}"
    elif pid is not None:
        detail = f"running but not answering; see {display_path(broker.log_path)}"
    elif not broker.is_installed():
        detail = "not installed (onceflow infra install)"
    else:
        detail = "stopped"
    if port_of(common.kafka_bootstrap.split(",")[0].strip(), -1) != broker.port:
        detail += f"; clients use ONCEFLOW_KAFKA_BOOTSTRAP={common.kafka_bootstrap}"
    return ComponentStatus("kafka", healthy, broker.bootstrap, pid, detail)


def _redis_status(redis: RedisServer, common: CommonSettings) -> ComponentStatus:
    pid = redis.pid()
    healthy = pid is not None and redis.is_healthy()
    if healthy:
        detail = f"{redis.live_role()}, {display_path(redis.data_dir)}"
    elif pid is not None:
        detail = f"running but not answering PING; see {display_path(redis.log_path)}"
    elif redis.binary() is None:
        detail = "redis-server not installed (onceflow infra install)"
    else:
        detail = "stopped"
    if redis.role == "primary" and port_of(common.redis_url, -1) != redis.port and not common.redis_url.startswith("redis+sentinel"):
        detail += f"; clients use ONCEFLOW_REDIS_URL={common.redis_url}"
    return ComponentStatus(_redis_name(redis), healthy, redis.address, pid, detail)
