"""The secure path, really exercised: `onceflow infra up --secure` starts a broker whose client
listeners are SASL_SSL (SCRAM-SHA-512) and mutual TLS, and a Redis that speaks only TLS with the default
user off, on a home and ports of their own. Clients without the credentials are refused by
both; the whole pipeline, given the settings `infra up` prints, runs a verify campaign exactly
once through kill -9s."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.config import CommonSettings, repo_root
from onceflow.kafka import clients
from onceflow.kafka.inspect import hanging_transactions
from onceflow.topology import Topic
from onceflow_tools.infra import secure
from onceflow_tools.process import free_port

pytestmark = [pytest.mark.security, pytest.mark.integration, pytest.mark.xdist_group("secure_stack")]


@dataclass
class SecureStack:
    env: dict[str, str]  # ONCEFLOW_HOME, the ports and ONCEFLOW_SECURE: what the CLI needs
    client: dict[str, str]  # the settings `infra up --secure` printed
    mtls: dict[str, str]  # the mutual-TLS alternative it printed for Kafka
    kafka_port: int
    redis_port: int


def _onceflow(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # The secure stack's settings only: none of this worker's plain stack leaks in.
    base = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    return subprocess.run(
        [sys.executable, "-m", "onceflow_tools", *args], cwd=repo_root(), env={**base, **env}, capture_output=True,
        text=True, timeout=timeout,
    )


@pytest.fixture(scope="module")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    home = tmp_path_factory.mktemp("secure-home")
    kafka_port, controller_port, redis_port, mtls_port = free_port(), free_port(), free_port(), free_port()
    env = {
        "ONCEFLOW_HOME": str(home), "ONCEFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "ONCEFLOW_KAFKA_MTLS_PORT": str(mtls_port),
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(controller_port), "ONCEFLOW_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    up = _onceflow(env, "infra", "up", "--secure", timeout=300)
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        client = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("export ")
        )
        assert client["ONCEFLOW_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", up.stdout
        mtls = dict(line.removeprefix("#   ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("#   "))
        assert mtls["ONCEFLOW_KAFKA_BOOTSTRAP"] == f"127.0.0.1:{mtls_port}", up.stdout
        yield SecureStack({**env, "ONCEFLOW_SECURE": "1"}, client, mtls, kafka_port, redis_port)
    finally:
        _onceflow({**env, "ONCEFLOW_SECURE": "1"}, "infra", "down", timeout=120)


def _kafka_answers(config: dict[str, str]) -> bool:
    try:
        admin = AdminClient({**config, "log_level": 0, "error_cb": lambda _e: None})
        admin.list_topics(timeout=8)
        return True
    except KafkaException:
        return False


def test_kafka_refuses_clients_without_credentials(secure_stack: SecureStack) -> None:
    bootstrap = f"127.0.0.1:{secure_stack.kafka_port}"
    client = secure_stack.client
    sasl_ssl = {
        "bootstrap.servers": bootstrap, "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": client["ONCEFLOW_KAFKA_SASL_USERNAME"], "ssl.ca.location": client["ONCEFLOW_KAFKA_SSL_CA_FILE"],
    }
    password = Path(client["ONCEFLOW_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
    assert _kafka_answers({**sasl_ssl, "sasl.password": password})  # the control: the right credentials work
    assert not _kafka_answers({"bootstrap.servers": bootstrap})  # plaintext
    assert not _kafka_answers({**sasl_ssl, "sasl.password": "not-the-password"})
    assert not _kafka_answers({**sasl_ssl, "sasl.password": password, "ssl.ca.location": str(Path(__file__))})  # an unknown CA


def test_kafka_mutual_tls_takes_a_certificate_the_ca_signed_and_nothing_less(secure_stack: SecureStack) -> None:
    """The second listener: TLS with a client certificate, no SCRAM user. onceflow's own
    settings (ONCEFLOW_KAFKA_SECURITY_PROTOCOL=SSL and the certificate files) reach it."""
    mtls = secure_stack.mtls
    common = CommonSettings(
        kafka_bootstrap=mtls["ONCEFLOW_KAFKA_BOOTSTRAP"], kafka_security_protocol="SSL",
        kafka_ssl_ca_file=mtls["ONCEFLOW_KAFKA_SSL_CA_FILE"], kafka_ssl_cert_file=mtls["ONCEFLOW_KAFKA_SSL_CERT_FILE"],
        kafka_ssl_key_file=mtls["ONCEFLOW_KAFKA_SSL_KEY_FILE"],
    )
    with_certificate = {"bootstrap.servers": common.kafka_bootstrap, **common.kafka_client_config()}
    assert _kafka_answers(with_certificate)  # the control
    topics = clients.admin(common).list_topics(timeout=10).topics
    assert str(Topic.INGEST_RECORDS) in topics, sorted(topics)  # what `infra up` created, read over mTLS
    tls_only = {k: v for k, v in with_certificate.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
    assert not _kafka_answers(tls_only)  # TLS, but no client certificate
    assert not _kafka_answers({"bootstrap.servers": common.kafka_bootstrap})  # plaintext


def test_redis_refuses_clients_without_tls_or_the_password(secure_stack: SecureStack) -> None:
    client = secure_stack.client
    ca = client["ONCEFLOW_REDIS_SSL_CA_FILE"]
    password = Path(client["ONCEFLOW_REDIS_PASSWORD_FILE"]).read_text().strip()
    port = secure_stack.redis_port
    good = redis.Redis(port=port, ssl=True, ssl_ca_certs=ca, username="onceflow", password=password, socket_timeout=5)
    assert good.ping()  # the control
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5).ping()  # plaintext
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        redis.Redis(port=port, ssl=True, ssl_ca_certs=ca, socket_timeout=5).ping()  # TLS, the default user (off)
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        redis.Redis(port=port, ssl=True, ssl_ca_certs=ca, username="onceflow", password="nope", socket_timeout=5).ping()


def _service_settings(stack: SecureStack, service: str) -> CommonSettings:
    """What ``service`` runs with on the secure stack: the printed settings, then its own credentials."""
    env = {**stack.client, **secure.service_env(service, stack.client["ONCEFLOW_REDIS_URL"], Path(stack.env["ONCEFLOW_HOME"]))}
    fields = {name.removeprefix("ONCEFLOW_").lower(): value for name, value in env.items()}
    return CommonSettings(**fields)


def _visible_topics(common: CommonSettings) -> set[str]:
    # Metadata lists only the topics a principal may describe.
    return set(clients.admin(common).list_topics(timeout=10).topics)


def _produce(common: CommonSettings, topic: str) -> KafkaError | None:
    """One plain produce as ``common``'s principal: None if written, else the broker's error."""
    outcome: list[KafkaError | None] = []
    producer = Producer(
        {"bootstrap.servers": common.kafka_bootstrap, **common.kafka_client_config(), "message.timeout.ms": 10_000,
         "log_level": 0, "error_cb": lambda _e: None}
    )
    producer.produce(topic, b"squat", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    assert outcome, f"no delivery report for {topic}"
    return outcome[0]


def _init_transactions(common: CommonSettings, transactional_id: str) -> KafkaError | None:
    producer = Producer(
        {"bootstrap.servers": common.kafka_bootstrap, **common.kafka_client_config(), "transactional.id": transactional_id,
         "log_level": 0, "error_cb": lambda _e: None}
    )
    try:
        producer.init_transactions(15)
        return None
    except KafkaException as exc:
        return exc.args[0]


def connect_redis(common: CommonSettings) -> redis.Redis:
    password = Path(common.redis_password_file).read_text().strip()
    return redis.Redis.from_url(common.redis_url, password=password, ssl_ca_certs=common.redis_ssl_ca_file, socket_timeout=5)


def test_each_service_reaches_only_its_own_topics_transactions_and_keys(secure_stack: SecureStack) -> None:
    """Least privilege (ADR 0029): each service runs as a principal of its own. It sees and
    writes its hops' topics and no other's, cannot take another service's transactional ids
    (so it cannot fence it), and in Redis reaches only its own keys."""
    ingest, dedup, sink = (_service_settings(secure_stack, name) for name in ("ingest", "dedup", "sink"))
    # What each may see: the topics its hops read and write, and no other (metadata is filtered).
    assert _visible_topics(ingest) == {"ingest.records", "ingest.dlq", "acker.acks", "acker.events", "dedup.records"}
    seen_by_dedup = _visible_topics(dedup)
    assert {"ingest.records", "dedup.records", "dedup.changelog", "stream.readers"} <= seen_by_dedup
    assert not seen_by_dedup & {"compute.results", "acker.changelog", "jobs.registry", "ingest.dlq"}, seen_by_dedup
    # Writes: its own topic (the control), another's refused.
    assert _produce(ingest, "ingest.records") is None
    refused = _produce(ingest, "dedup.records")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    refused = _produce(dedup, "compute.results")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    # Transactions: its own id (the control); another service's id is refused, so a compromised
    # ingest cannot fence the gate.
    assert _init_transactions(ingest, "onceflow-ingest-squat") is None
    fenced = _init_transactions(ingest, "onceflow-dedup-0")
    assert fenced is not None and fenced.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fenced
    # Redis: the sink writes its keys (the control), not the gate's, and runs no admin command;
    # ingest, which needs no Redis, has no user there.
    ca = secure_stack.client["ONCEFLOW_REDIS_SSL_CA_FILE"]
    as_sink = connect_redis(sink)
    as_sink.hset("onceflow:{sink}:partition:0", "probe", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_sink.hset("onceflow:{dedup:0}:meta", "token", "99999999999999")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_sink.flushall()
    connect_redis(dedup).hset("onceflow:{t1.dedup:0}:meta", "probe", "1")  # a prefixed namespace's keys too
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        redis.Redis(port=secure_stack.redis_port, ssl=True, ssl_ca_certs=ca, socket_timeout=5).ping()
    assert ingest.redis_password_file == "" and "@" not in ingest.redis_url


def test_abort_hanging_speaks_the_secure_listener(secure_stack: SecureStack) -> None:
    """`onceflow infra abort-hanging` runs Kafka's TransactionsCommand with the admin's SCRAM
    credentials and the CA (a --command-config it writes and deletes): an open transaction on the
    secure broker is found and, with --abort --force, ended."""
    admin = CommonSettings(**{name.removeprefix("ONCEFLOW_").lower(): value for name, value in secure_stack.client.items()})
    topic = "held"
    kafka_admin = clients.admin(admin)  # held: a freed AdminClient never completes its futures
    kafka_admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = clients.transactional_producer(admin, "onceflow-quiet", **{"transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"r", b"k")
    assert producer.flush(30) == 0
    done = _onceflow(
        {**secure_stack.env, **secure_stack.client}, "infra", "abort-hanging", "--topic", topic, "--older-than", "2",
        "--abort", "--force", timeout=180,
    )
    assert done.returncode == 0 and f"{topic}[0]: producer" in done.stdout and "aborted" in done.stdout, done.stdout + done.stderr
    assert hanging_transactions(admin, [topic], wait_s=10) == {}


@pytest.mark.extended  # about 2.5 min; make test-extended, pytest -m security
def test_the_whole_pipeline_runs_exactly_once_on_the_secure_stack(secure_stack: SecureStack) -> None:
    """A short verify campaign (ingest, acker, dedup, compute, sink, the checker) with only
    the printed settings: it must talk SASL_SSL and TLS everywhere, or nothing would flow."""
    done = _onceflow(
        {**secure_stack.env, **secure_stack.client}, "verify", "--workload", "keyed-count", "--duration", "15s",
        "--rate", "40", "--faults", "kill9", "--fault-every", "6", "--settle", "180",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "every record took effect exactly once" in done.stdout + done.stderr
