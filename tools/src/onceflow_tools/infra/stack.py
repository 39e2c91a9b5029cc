"""The whole local stack at once: what `onceflow infra up | down | status` and test fixtures call."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from onceflow.config import CommonSettings
from onceflow.kafka.clients import plain_config
from onceflow_tools.infra import secure, spark
from onceflow_tools.infra.kafka import KafkaBroker, active_controller
from onceflow_tools.infra.kafka import cluster as kafka_cluster
from onceflow_tools.infra.paths import display_path
from onceflow_tools.infra.postgres import PostgresServer
from onceflow_tools.infra.redis import RedisServer
from onceflow_tools.infra.redis import topology as redis_topology
from onceflow_tools.infra.settings import InfraSettings, port_of
from onceflow_tools.infra.topics import provision


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    healthy: bool
    address: str
    pid: int | None
    detail: str


def install(postgres: bool = False) -> dict[str, bool]:
    """Fetch the broker's jars and install redis-server (and with ``postgres`` Debian's
    PostgreSQL) if needed; True where work was done."""
    done = {"kafka": KafkaBroker.from_env().install(), "redis": RedisServer.from_env().ensure_installed()}
    if postgres:
        done["postgres"] = PostgresServer.from_env().ensure_installed()
    return done


def up(timeout: float | None = None, create_topics: bool = True, postgres: bool = False) -> list[ComponentStatus]:
    """Start whatever is not running, wait until it answers, create the declared topics (with
    ONCEFLOW_TOPIC_PREFIX), and with ``postgres`` the local PostgreSQL too (left out by default:
    only a sink that keeps its tables there needs it). Idempotent: on a healthy stack it only
    checks, in well under a second."""
    timeout = timeout if timeout is not None else InfraSettings().start_timeout_s
    if secure.enabled():
        secure.apply_client_env()
    brokers, servers = kafka_cluster(), redis_topology()
    for server in servers:
        server.start(timeout)
    if postgres:
        PostgresServer.from_env().start(timeout)
    # Every node first, then the waits: a cluster's controller needs a majority of its voters.
    spawned = [(broker, broker.spawn()) for broker in brokers]
    for broker, pid in spawned:
        if pid is not None:
            broker.wait_ready(pid, timeout)
    bootstrap = ",".join(broker.bootstrap for broker in brokers)
    brokers[0].warm_up(timeout, bootstrap)
    if create_topics:
        common = CommonSettings()
        provision(bootstrap, common.topic_prefix, history_retention_ms=common.history_retention_ms)
    settings = InfraSettings()
    spark_timeout = max(timeout, settings.spark_start_timeout_s)
    if settings.spark_cluster == "standalone":
        spark.up(spark_timeout)
    elif settings.spark_cluster == "connect":
        spark.connect_server().up(spark_timeout)
    return status(brokers, postgres)


def down() -> list[str]:
    """Stop everything (cleanly, SIGKILL after a timeout); returns the names of those that ran."""
    # A cluster's nodes all at once: stopped one by one, the last ones lose their controller
    # quorum and hang in controlled shutdown until killed.
    brokers = kafka_cluster(InfraSettings(secure=False))
    with ThreadPoolExecutor(max_workers=len(brokers)) as pool:
        stopped = [broker.name for broker, ran in zip(brokers, pool.map(lambda b: b.stop(), brokers)) if ran]
    # Every Redis role, whatever the topology says now: one started as sentinel stays stoppable.
    for server in reversed(redis_topology(InfraSettings(redis_topology="sentinel", secure=False))):
        if server.stop():
            stopped.append(_redis_name(server))
    # The secure mode's broker and Redis (their own homes), whatever the mode says now.
    if KafkaBroker.from_env(secure=True).stop():
        stopped.append("kafka (secure)")
    if RedisServer.from_env(secure=True).stop():
        stopped.append("redis (secure)")
    cluster = PostgresServer.from_env()
    if cluster.home.exists() and cluster.stop():
        stopped.append(cluster.name)
    connect = spark.connect_server()
    return stopped + spark.down() + ([connect.name] if connect.stop() else [])


def status(brokers: list[KafkaBroker] | None = None, postgres: bool = False) -> list[ComponentStatus]:
    """Each component's row. PostgreSQL is optional: its row shows when it runs, or when
    ``postgres`` asks for it (a cluster started here once and stopped since fails nothing)."""
    if secure.enabled():
        secure.apply_client_env()
    brokers = brokers or kafka_cluster()
    common = CommonSettings()
    kafka = [_kafka_status(broker, common) for broker in brokers]
    if len(brokers) > 1:
        kafka = _with_cluster_health(kafka, brokers)
    rows = [*kafka, *(_redis_status(server, common) for server in redis_topology())]
    cluster = PostgresServer.from_env()
    if postgres or (cluster.home.exists() and cluster.pid() is not None):
        rows.append(_postgres_status(cluster, common))
    if InfraSettings().spark_cluster == "standalone" or spark.running():
        rows += _spark_status()
    if InfraSettings().spark_cluster == "connect" or spark.connect_running():
        rows.append(_connect_status(spark.connect_server()))
    return rows


def _connect_status(server: spark.ConnectServer) -> ComponentStatus:
    pid = server.pid()
    healthy = pid is not None and server.answers()
    if healthy:
        detail = f"Spark Connect, driver on {server.master}"
    elif pid is not None:
        detail = f"running but not answering; see {display_path(server.log_path)}"
    else:
        detail = "stopped"
    return ComponentStatus(server.name, healthy, server.url, pid, detail)


def _spark_status() -> list[ComponentStatus]:
    daemons = spark.cluster()
    master = daemons[0]
    rows = []
    for daemon in daemons:
        healthy = spark.healthy(daemon, master)
        if healthy:
            detail = "ALIVE, " + (f"{len(spark.alive_workers(master))} worker(s) registered" if daemon.is_master
                                  else f"{daemon.worker_cores} core(s), {daemon.worker_memory}")
        elif daemon.pid() is not None:
            detail = f"running but not {'answering' if daemon.is_master else 'registered'}; see {display_path(daemon.log_path)}"
        else:
            detail = "stopped"
        rows.append(ComponentStatus(daemon.name, healthy, daemon.address, daemon.pid(), detail))
    return rows


def _with_cluster_health(rows: list[ComponentStatus], brokers: list[KafkaBroker]) -> list[ComponentStatus]:
    """Each node's role (the active controller among the voters) and, on the first row, the
    partitions that are under-replicated or offline: what a cluster operator looks at first."""
    from confluent_kafka.admin import AdminClient

    live = [broker.bootstrap for broker, row in zip(brokers, rows, strict=True) if row.healthy]
    if not live:
        return rows
    admin = AdminClient(plain_config(",".join(live), log_level=3))
    try:
        topics = admin.list_topics(timeout=10).topics
    except Exception as exc:  # noqa: BLE001 - a cluster mid-election: say so, do not fail status
        return [replace(rows[0], detail=f"{rows[0].detail}; cluster unanswered: {exc}"), *rows[1:]]
    controller = active_controller(brokers)
    partitions = [p for t in topics.values() for p in t.partitions.values()]
    under = sum(1 for p in partitions if len(p.isrs) < len(p.replicas))
    offline = sum(1 for p in partitions if p.leader < 0)
    out = []
    for broker, row in zip(brokers, rows, strict=True):
        role = "active controller" if controller == broker else "voter"
        out.append(replace(row, detail=f"node {broker.node_id}, {role}; {row.detail}"))
    summary = f"{len(partitions)} partitions, {under} under-replicated, {offline} offline"
    out[0] = replace(out[0], detail=f"{out[0].detail}; {summary}")
    return out


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
    if broker.port not in {port_of(address.strip(), -1) for address in common.kafka_bootstrap.split(",")}:
        detail += f"; clients use ONCEFLOW_KAFKA_BOOTSTRAP={common.kafka_bootstrap}"
    return ComponentStatus(broker.name, healthy, broker.bootstrap, pid, detail)


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


def _postgres_status(server: PostgresServer, common: CommonSettings) -> ComponentStatus:
    pid = server.pid()
    healthy = pid is not None and server.is_healthy()
    if healthy:
        detail = f"PostgreSQL {server.version()}, {display_path(server.data_dir)}"
    elif pid is not None:
        detail = f"running but not accepting connections (recovering?); see {display_path(server.log_path)}"
    elif server.bin_dir() is None:
        detail = "not installed (onceflow infra up --postgres installs it)"
    else:
        detail = "stopped"
    if port_of(common.postgres_url, -1) != server.port:
        detail += f"; clients use ONCEFLOW_POSTGRES_URL={common.postgres_url}"
    return ComponentStatus(server.name, healthy, server.address, pid, detail)
