"""The local stack's secure mode (`onceflow infra up --secure`, ``ONCEFLOW_SECURE=1``): the broker
with a SASL_SSL listener (SCRAM-SHA-512) and Redis with TLS and an ACL user, both with
certificates and passwords generated once for this home, so the secure path is really
exercised. Its broker and Redis live in homes of their own (``kafka-secure``, ``redis-secure``):
SCRAM credentials are written when the storage is formatted.

What clients need (``client_env``) is the same set of ``ONCEFLOW_*`` settings a production
deployment gives its services; `infra up --secure` prints it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from onceflow.kafka.clients import plain_config
from onceflow_tools.infra import access, plumbing
from onceflow_tools.infra.certs import CertAuthority
from onceflow_tools.infra.paths import runtime_dir
from onceflow_tools.infra.settings import InfraSettings, kafka_mtls_port, kafka_port, redis_port

USER = "onceflow"
SCRAM_MECHANISM = "SCRAM-SHA-512"
CERT_DAYS = 365


@dataclass(frozen=True)
class Material:
    """The CA, the servers' certificate (for 127.0.0.1 and localhost), a client certificate
    (mutual TLS) and the two passwords."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def server_keystore(self) -> Path:
        """Key and certificate in one PEM file: Kafka's ``ssl.keystore.type=PEM``."""
        return self.dir / "server-keystore.pem"

    @property
    def client_cert(self) -> Path:
        """A client certificate for the broker's mutual-TLS listener."""
        return self.dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    @property
    def kafka_password_file(self) -> Path:
        return self.dir / "kafka-password"

    @property
    def redis_password_file(self) -> Path:
        return self.dir / "redis-password"

    @property
    def kafka_password(self) -> str:
        return self.kafka_password_file.read_text().strip()

    @property
    def redis_password(self) -> str:
        return self.redis_password_file.read_text().strip()

    def service_password_file(self, system: str, service: str) -> Path:
        """A service's own password for ``system`` (kafka or redis): least privilege, ADR 0029."""
        return self.dir / f"{system}-password-{service}"

    def service_passwords(self, system: str, services: Iterable[str]) -> dict[str, str]:
        return {service: self.service_password_file(system, service).read_text().strip() for service in services}

    def ensure(self) -> Material:
        """Create what is missing (idempotent; several processes may ask at once)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with plumbing.file_lock(self.dir / ".lock"):
            if not self.server_keystore.exists():
                ca = CertAuthority.create(self.dir, "ca", days=CERT_DAYS)
                leaf = ca.issue("server", "serverAuth,clientAuth", days=CERT_DAYS)
                assert leaf.cert == self.server_cert and leaf.key == self.server_key
                self.server_keystore.write_text(self.server_key.read_text() + self.server_cert.read_text())
            if not self.client_cert.exists():  # also for a home made before mutual TLS was added
                ca = CertAuthority(self.dir, self.ca, self.dir / "ca.key")
                client = ca.issue("client", "clientAuth", days=CERT_DAYS)
                assert client.cert == self.client_cert and client.key == self.client_key
            own = [self.service_password_file(system, service) for system in ("kafka", "redis") for service in access.SERVICES]
            for path in (self.kafka_password_file, self.redis_password_file, *own):
                if not path.exists():
                    path.write_text(secrets.token_hex(16) + "\n")  # hex: safe in JAAS and ACL syntax
            for path in self.dir.iterdir():
                if path.is_file():
                    path.chmod(0o600)
        return self


def material(home: Path | None = None) -> Material:
    return Material((home or runtime_dir()) / "secure").ensure()


def enabled() -> bool:
    return InfraSettings().secure


def client_env(kafka_bootstrap: str, redis_port: int, home: Path | None = None) -> dict[str, str]:
    """The settings every client of the secure stack needs (services, CLI, tests)."""
    m = material(home)
    return {
        "ONCEFLOW_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ONCEFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ONCEFLOW_KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
        "ONCEFLOW_KAFKA_SASL_USERNAME": USER,
        "ONCEFLOW_KAFKA_SASL_PASSWORD_FILE": str(m.kafka_password_file),
        "ONCEFLOW_KAFKA_SSL_CA_FILE": str(m.ca),
        "ONCEFLOW_REDIS_URL": f"rediss://{USER}@127.0.0.1:{redis_port}/0",
        "ONCEFLOW_REDIS_PASSWORD_FILE": str(m.redis_password_file),
        "ONCEFLOW_REDIS_SSL_CA_FILE": str(m.ca),
    }


def service_env(service: str, redis_url: str, home: Path | None = None) -> dict[str, str]:
    """What ``service`` runs with on the secure stack instead of the admin's credentials: its own
    Kafka principal, and its own Redis user if it uses Redis (else none: the default user is off,
    so Redis refuses it). Laid over `client_env`'s settings (ADR 0029)."""
    m = material(home)
    env = {
        "ONCEFLOW_KAFKA_SASL_USERNAME": access.principal(service),
        "ONCEFLOW_KAFKA_SASL_PASSWORD_FILE": str(m.service_password_file("kafka", service)),
        "ONCEFLOW_KAFKA_SASL_PASSWORD": "",
        "ONCEFLOW_REDIS_PASSWORD": "",
    }
    rest = redis_url.split("://", 1)[-1].split("@", 1)[-1]  # host:port/db
    if service in access.REDIS_KEYS:
        env |= {
            "ONCEFLOW_REDIS_URL": f"rediss://{access.principal(service)}@{rest}",
            "ONCEFLOW_REDIS_PASSWORD_FILE": str(m.service_password_file("redis", service)),
        }
    else:
        env |= {"ONCEFLOW_REDIS_URL": f"rediss://{rest}", "ONCEFLOW_REDIS_PASSWORD_FILE": ""}
    return env


def mtls_client_env(home: Path | None = None) -> dict[str, str]:
    """The Kafka settings of a client of the mutual-TLS listener instead (no SCRAM user)."""
    m = material(home)
    return {
        "ONCEFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_mtls_port()}",
        "ONCEFLOW_KAFKA_SECURITY_PROTOCOL": "SSL",
        "ONCEFLOW_KAFKA_SSL_CA_FILE": str(m.ca),
        "ONCEFLOW_KAFKA_SSL_CERT_FILE": str(m.client_cert),
        "ONCEFLOW_KAFKA_SSL_KEY_FILE": str(m.client_key),
    }


def apply_client_env() -> dict[str, str]:
    """In secure mode, point this process's clients at the secure stack (what the user did not
    set already); the settings, for `infra up` to print."""
    env = client_env(f"127.0.0.1:{kafka_port()}", redis_port())
    for name, value in env.items():
        if name == "ONCEFLOW_REDIS_URL" and os.environ.get(name, "").startswith("redis://"):
            os.environ[name] = value  # the plain URL of the same port: the secure one instead
        os.environ.setdefault(name, value)
    return env


def grant_access(bootstrap: str, prefix: str = "", timeout: float = 30.0) -> int:
    """As the admin: give every service its SCRAM credentials (upserted: idempotent) and its ACLs
    on topic prefix ``prefix`` (`access.bindings`); returns the number of ACL bindings. A home
    made before least privilege gets them on its next `infra up --secure`."""
    admin = AdminClient(plain_config(bootstrap))
    passwords = material().service_passwords("kafka", access.SERVICES)
    upserts = access.scram_upsertions({access.principal(service): password for service, password in passwords.items()})
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout).values():
        future.result()
    wanted = access.bindings(prefix)
    for future in admin.create_acls(wanted, request_timeout=timeout).values():
        future.result()
    return len(wanted)
