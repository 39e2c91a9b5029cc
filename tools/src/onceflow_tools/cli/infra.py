"""`onceflow infra up | down | status | logs | install | topics`."""

import enum
import os
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from confluent_kafka import KafkaException
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow_tools.infra import secure as secure_stack
from onceflow_tools.infra import access, spark, stack, transactions
from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.infra.kafka import cluster as kafka_cluster
from onceflow_tools.infra.paths import display_path
from onceflow_tools.infra.plumbing import InfraError, tail
from onceflow_tools.infra.postgres import PostgresServer
from onceflow_tools.infra.redis import SENTINEL_MASTER, RedisServer
from onceflow_tools.infra.redis import topology as redis_topology
from onceflow_tools.infra.settings import InfraSettings
from onceflow_tools.jobs import workers
from onceflow_tools.infra.topics import TopicReplicationError, count_brokers, ensure_topics, load_specs, shared_specs

app = typer.Typer(no_args_is_help=True, help="Local Kafka (KRaft), Redis and, if asked, PostgreSQL and a Spark cluster on 127.0.0.1.")
out = Console()
err = Console(stderr=True)
T = TypeVar("T")


class Component(enum.StrEnum):
    kafka = "kafka"
    redis = "redis"
    postgres = "postgres"
    spark = "spark"


class SparkCluster(enum.StrEnum):
    none = "none"
    standalone = "standalone"
    connect = "connect"


class RedisTopology(enum.StrEnum):
    single = "single"
    sentinel = "sentinel"


def _run(what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` under a spinner; infrastructure errors become one red message and exit 1."""
    try:
        with err.status(what):
            return fn()
    except (InfraError, KafkaException, TimeoutError) as e:
        err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _status_table(rows: list[stack.ComponentStatus]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("component", "state", "address", "pid", "detail"):
        table.add_column(col)
    for r in rows:
        state = "[green]up[/]" if r.healthy else "[red]down[/]"
        table.add_row(r.name, state, r.address, str(r.pid or "-"), r.detail)
    return table


@app.command()
def install() -> None:
    """Fetch Kafka's jars from Maven Central (cached) and install redis-server if missing."""
    broker, redis = KafkaBroker.from_env(), RedisServer.from_env()
    t0 = time.monotonic()
    fetched = _run(f"assembling Kafka {broker.version} with Maven", broker.install)
    how = f"fetched in {time.monotonic() - t0:.1f}s" if fetched else "up to date"
    out.print(f"kafka {broker.version}: jars {how} ({display_path(broker.libs_dir)})", highlight=False)
    installed = _run("installing redis-server", redis.ensure_installed)
    out.print(
        f"redis-server: {'installed' if installed else 'present'} ({RedisServer.binary()})", highlight=False
    )
    # Reported only: `infra up --postgres` installs it when a sink needs it.
    pg_bin = PostgresServer.bin_dir()
    out.print(
        f"postgresql: {f'present ({pg_bin})' if pg_bin else 'not installed (onceflow infra up --postgres installs it)'}",
        highlight=False,
    )


@app.command()
def up(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each component.")] = 90.0,
    topics: Annotated[bool, typer.Option(help="Create the declared topics.")] = True,
    brokers: Annotated[
        int | None,
        typer.Option(help="1: one broker. 3: a KRaft cluster of three nodes. Default: ONCEFLOW_KAFKA_BROKERS or 1."),
    ] = None,
    redis: Annotated[
        RedisTopology | None,
        typer.Option(help="single: one redis-server. sentinel: a primary, a replica and a Sentinel that fails over. Default: ONCEFLOW_REDIS_TOPOLOGY or single."),
    ] = None,
    secure: Annotated[
        bool,
        typer.Option("--secure", help="Kafka with a SASL_SSL (SCRAM) listener and Redis with TLS and a password, certificates and passwords generated for this home. Default: ONCEFLOW_SECURE."),
    ] = False,
    spark_cluster: Annotated[
        SparkCluster | None,
        typer.Option("--spark", help="none: compute runs Spark in-process (local[*]). standalone: also a Spark master and workers from the pyspark wheel. connect: also a Spark Connect server. Default: ONCEFLOW_SPARK_CLUSTER or none."),
    ] = None,
    postgres: Annotated[
        bool,
        typer.Option("--postgres", help="Also a local PostgreSQL on ONCEFLOW_POSTGRES_URL's port (Debian's package, installed if missing; docs/postgres.md), for a sink that keeps its tables there."),
    ] = False,
) -> None:
    """Start Kafka and Redis (installing first if needed), create the topics, and PostgreSQL and a Spark cluster if asked."""
    t0 = time.monotonic()
    if brokers is not None:
        if brokers not in (1, 3):
            raise typer.BadParameter("--brokers takes 1 or 3")
        os.environ["ONCEFLOW_KAFKA_BROKERS"] = str(brokers)
    if redis is not None:
        os.environ["ONCEFLOW_REDIS_TOPOLOGY"] = redis.value
    if spark_cluster is not None:
        os.environ["ONCEFLOW_SPARK_CLUSTER"] = spark_cluster.value
    if secure:
        os.environ["ONCEFLOW_SECURE"] = "1"
    if not KafkaBroker.from_env().is_installed():
        install()
    what = "starting Kafka, Redis and PostgreSQL" if postgres else "starting Kafka and Redis"
    rows = _run(what, lambda: stack.up(timeout=timeout, create_topics=topics, postgres=postgres))
    out.print(_status_table(rows))
    healthy = all(r.healthy for r in rows)
    if healthy:
        out.print(f"ready in {time.monotonic() - t0:.1f}s", style="dim")
    nodes = kafka_cluster()
    bootstrap = ",".join(node.bootstrap for node in nodes)
    if len(nodes) > 1 and CommonSettings().kafka_bootstrap != bootstrap:
        out.print(f"services reach every node with ONCEFLOW_KAFKA_BOOTSTRAP={bootstrap}", highlight=False)
    sentinel = next((server for server in redis_topology() if server.sentinel_of), None)
    if sentinel is not None and not CommonSettings().redis_url.startswith("redis+sentinel"):
        out.print(
            f"services follow failovers with ONCEFLOW_REDIS_URL=redis+sentinel://127.0.0.1:{sentinel.port}/{SENTINEL_MASTER}/0",
            highlight=False,
        )
    if InfraSettings().spark_cluster == "standalone" and not os.environ.get("ONCEFLOW_COMPUTE_SPARK_MASTER", "").startswith("spark://"):
        out.print(
            f"compute runs on it with ONCEFLOW_COMPUTE_SPARK_MASTER={spark.cluster()[0].master_url} "
            f"ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON={spark.executor_python()}",
            highlight=False,
        )
    if InfraSettings().spark_cluster == "connect" and not os.environ.get("ONCEFLOW_COMPUTE_SPARK_MASTER", "").startswith("sc://"):
        out.print(f"compute runs on it with ONCEFLOW_COMPUTE_SPARK_MASTER={spark.connect_server().url}", highlight=False)
    cluster = PostgresServer.from_env()
    if postgres and CommonSettings().postgres_url != cluster.url:
        out.print(f"services reach it with ONCEFLOW_POSTGRES_URL={cluster.url}", highlight=False)
    if InfraSettings().secure:
        out.print("services and the CLI reach the secure stack with:", highlight=False)
        for name, value in secure_stack.apply_client_env().items():
            out.print(f"export {name}={value}", highlight=False, soft_wrap=True)
        out.print("or, for Kafka, mutual TLS (a client certificate, no SCRAM user):", highlight=False)
        for name, value in secure_stack.mtls_client_env().items():
            out.print(f"#   {name}={value}", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if healthy else 1)


@app.command()
def down() -> None:
    """Stop the job versions' workers `onceflow job deploy` started here, then Kafka, every
    Redis and PostgreSQL (data is kept; delete .onceflow/ to start over)."""
    versions = workers.stop_all()
    if versions:
        out.print(f"stopped the workers of {', '.join(versions)} (`onceflow job deploy` started them here)")
    stopped = _run("stopping", stack.down)
    out.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status() -> None:
    """Show each component; exit code 0 only if all are healthy."""
    rows = stack.status()
    out.print(_status_table(rows))
    raise typer.Exit(0 if all(r.healthy for r in rows) else 1)


@app.command()
def logs(
    component: Annotated[Component | None, typer.Argument(help="Default: all.")] = None,
    lines: Annotated[int, typer.Option("-n", "--lines", help="Lines to show.")] = 40,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
) -> None:
    """Show the brokers' server.log, the Redis logs (primary, and replica and Sentinel if started), PostgreSQL's and Spark's, if they run."""
    paths = {
        Component.kafka: [node.log_path for node in kafka_cluster()],
        Component.redis: [server.log_path for server in redis_topology()],
        Component.postgres: [cluster.log_path] if (cluster := PostgresServer.from_env()).home.exists() else [],
        Component.spark: ([daemon.log_path for daemon in spark.cluster()] if spark.running() else [])
        + ([spark.connect_server().log_path] if spark.connect_running() else []),
    }
    chosen = paths[component] if component else [path for group in paths.values() for path in group]
    if follow:
        # tail -F copes with log4j2's rollover and files that do not exist yet.
        os.execvp("tail", ["tail", "-n", str(lines), "-F", *map(str, chosen)])
    for i, path in enumerate(chosen):
        if len(chosen) > 1:
            typer.echo(f"{chr(10) if i else ''}==> {display_path(path)} <==")
        text = tail(path, lines)
        typer.echo(text if text else f"(no log yet at {display_path(path)})")


@app.command()
def topics(
    prefix: Annotated[
        str | None, typer.Option(help="Prepended to each name. Default: ONCEFLOW_TOPIC_PREFIX.")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option(help="Any cluster's bootstrap list, host:port[,host:port]. Default: ONCEFLOW_KAFKA_BOOTSTRAP.")
    ] = None,
) -> None:
    """Create the topics declared in infra/topics.toml that do not exist yet, on any cluster, and
    set a declared timestamp type (LogAppendTime on ingest.records and acker.acks) on those made
    before it. The per-job ones (compute.partials.<job>, ...) are created by each compute job at start."""
    common = CommonSettings()
    prefix = common.topic_prefix if prefix is None else prefix
    bootstrap = bootstrap or common.kafka_bootstrap
    brokers = _run(f"asking {bootstrap} for its brokers", lambda: count_brokers(bootstrap))
    if not brokers:
        err.print(
            f"[red]error:[/] no broker answers on {bootstrap} (onceflow infra up, or check the address)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    declared = load_specs()
    specs = shared_specs(declared)
    try:
        created = set(_run("creating topics", lambda: ensure_topics(bootstrap, prefix, specs, history_retention_ms=common.history_retention_ms)))
    except TopicReplicationError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("topic", "partitions", "replicas", "policy", ""):
        table.add_column(col)
    for s in specs:
        name = prefix + s.name
        if s.compacted:
            policy = "compact"
        elif s.retention_ms:
            policy = f"delete {s.retention_ms / 86_400_000:g}d"
        else:
            policy = "delete"
        replicas, in_sync = s.replication_for(brokers)
        table.add_row(
            name, str(s.partitions), f"{replicas} (min in sync {in_sync})", policy,
            "[green]created[/]" if name in created else "exists",
        )
    out.print(table)
    per_job = ", ".join(prefix + s.name for s in declared if s.per_job)
    out.print(f"per job, made by each compute worker for its job at start: {per_job}", highlight=False, soft_wrap=True)


@app.command()
def acls(
    service: Annotated[list[str] | None, typer.Option("--service", help="Print only this service's (repeat). Default: every service. --apply always grants every service's.")] = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="Create them on the broker (as the admin user), with each service's SCRAM user: what `infra up --secure` does.")
    ] = False,
) -> None:
    """What each service's Kafka principal may do on ONCEFLOW_TOPIC_PREFIX's topics (least
    privilege, ADR 0029): every pattern is a name prefix. A deployment with an authorizer gives
    its services these ACLs; --apply creates them here."""
    common = CommonSettings()
    chosen = service or list(access.SERVICES)
    unknown = sorted(set(chosen) - set(access.SERVICES))
    if unknown:
        raise typer.BadParameter(f"no service {', '.join(unknown)} (known: {', '.join(access.SERVICES)})", param_hint="--service")
    table = Table("principal", "resource", "name prefix", "operations", "why")
    for name in chosen:
        for grant in access.grants(name, common.topic_prefix):
            table.add_row(
                f"User:{access.principal(name)}", grant.resource.name.lower(), grant.name,
                ", ".join(op.name.lower() for op in grant.operations), grant.why,
            )
    out.print(table)
    out.print(f"Redis: {'; '.join(f'{access.principal(n)} ~{p} {access.REDIS_COMMANDS}' for n, p in access.REDIS_KEYS.items())}; "
              "the other services have no Redis user.", highlight=False, soft_wrap=True)
    if apply:
        try:
            count = secure_stack.grant_access(common.kafka_bootstrap, common.topic_prefix)
        except KafkaException as exc:
            err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        out.print(f"{count} ACL binding(s), every service's, in place on {common.kafka_bootstrap}", highlight=False)


@app.command("abort-hanging")
def abort_hanging(
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="A topic to look at, full name (repeat). Default: every topic under ONCEFLOW_TOPIC_PREFIX.")
    ] = None,
    older_than: Annotated[float, typer.Option(help="Seconds a partition's last stable offset must stay below its end.")] = 30.0,
    abort: Annotated[
        bool, typer.Option("--abort", help="Abort the hanging ones (KIP-664). Their records are then never read: see the warning it prints.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="With --abort: the open ones whose coordinator still knows them too (their producer's hop retries).")
    ] = False,
) -> None:
    """Find the transactions that hold a partition's last stable offset back (read_committed
    readers, restores among them, stall there), with Kafka's own TransactionsCommand, and with
    --abort end the hanging ones (no coordinator will). Exit 0 once no partition is held back."""
    common, broker = CommonSettings(), KafkaBroker.from_env()
    left = 0
    try:
        names = topic or sorted(
            t for t in clients.admin(common).list_topics(timeout=10).topics
            if t.startswith(common.topic_prefix) and not t.startswith("__")
        )
        with out.status(f"watching {len(names)} topic(s) for {older_than:.0f} s ..."):
            held = transactions.stalled(common, names, older_than)
        if not held:
            out.print(f"no partition of {len(names)} topic(s) holds its last stable offset back", highlight=False, soft_wrap=True)
            return
        for name, partitions in sorted(held.items()):
            for partition in partitions:
                hanging = transactions.find_hanging(broker, common, name, partition)
                for open_txn in transactions.describe_open(broker, common, name, partition, hanging):
                    what = "hanging: no coordinator will end it" if open_txn.hanging else "open: its coordinator knows it"
                    out.print(
                        f"{name}[{partition}]: producer {open_txn.producer_id} epoch {open_txn.producer_epoch}, from offset "
                        f"{open_txn.start_offset}: {what}", highlight=False, soft_wrap=True,
                    )
                    if not abort or not (open_txn.hanging or force):
                        left += 1
                        continue
                    transactions.abort(broker, common, open_txn)
                    out.print("  aborted: readers go on past it; its records are never read", highlight=False, soft_wrap=True)
    except (InfraError, KafkaException) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if left:
        out.print(
            f"{left} transaction(s) left. An abort is safe when the transaction's lost outcome was an abort; if it "
            "committed on its other partitions (a lost COMMIT marker: docs/architecture.md, 'Hanging transactions'), "
            "aborting loses its records here: check the pipeline with `onceflow verify`'s checker afterwards. "
            "--abort ends the hanging ones; --abort --force also those a live producer holds.",
            highlight=False, soft_wrap=True,
        )
        raise typer.Exit(1)
