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
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from onceflow.config import CommonSettings, repo_root
from onceflow.kafka import clients
from onceflow.topology import Topic
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
