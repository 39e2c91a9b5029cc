"""The broker's configuration: server.properties rendered from infra/kafka's template, the
secure mode's properties (SCRAM over TLS, mutual TLS, ACLs), and what the storage format is
given (the SCRAM user, a cluster id)."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Protocol

from onceflow_tools.infra import plumbing, secure
from onceflow_tools.infra.paths import infra_dir


class BrokerPlace(Protocol):
    """What a node's properties are made of (a `KafkaBroker` is one)."""

    port: int
    controller_port: int
    node_id: int
    voters: str
    secure: bool
    mtls_port: int

    @property
    def data_dir(self) -> Path: ...

    @property
    def props_path(self) -> Path: ...


def render_server_properties(broker: BrokerPlace) -> Path:
    """infra/kafka/server.properties filled in for ``broker``, written to its props_path."""
    return plumbing.render(infra_dir() / "kafka" / "server.properties", broker.props_path, server_values(broker))


def server_values(broker: BrokerPlace) -> dict[str, object]:
    """The template's placeholders: one standalone node, or a voter of a static quorum."""
    if broker.voters:
        quorum, replicas = f"controller.quorum.voters={broker.voters}", len(broker.voters.split(","))
    else:
        quorum, replicas = f"controller.quorum.bootstrap.servers=127.0.0.1:{broker.controller_port}", 1
    tls = broker.secure
    return {
        "kafka_port": broker.port, "controller_port": broker.controller_port, "data_dir": broker.data_dir,
        "node_id": broker.node_id, "quorum": quorum, "replicas": min(3, replicas),
        "min_isr": max(1, min(2, replicas - 1)),
        "listener": "SASL_SSL" if tls else "PLAINTEXT", "security": security_properties() if tls else "",
        "mtls_listener": f",SSL://127.0.0.1:{broker.mtls_port}" if tls else "",
        "mtls_protocol": ",SSL:SSL" if tls else "",
        "controller_protocol": "SSL" if tls else "PLAINTEXT",
    }


def security_properties() -> str:
    """The secure mode's block of server.properties, with its certificates and password."""
    m = secure.material()
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{secure.USER}" password="{m.kafka_password}";'
    )
    return "\n".join([
        "# Secure mode (onceflow_tools.infra.secure): SCRAM over TLS, the broker's own connections too.",
        f"sasl.enabled.mechanisms={secure.SCRAM_MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={secure.SCRAM_MECHANISM}",
        f"listener.name.sasl_ssl.{secure.SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={m.server_keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={m.ca}",
        "# The mutual-TLS listener: a client certificate the CA signed, or no connection.",
        "listener.name.ssl.ssl.client.auth=required",
        "# The controller listener: TLS with the broker's own certificate, so it has a principal too.",
        "listener.name.controller.ssl.client.auth=required",
        "# Least privilege (ADR 0029): nothing is allowed that no ACL allows. The admin user, the",
        "# broker's certificate (its connections to the controller) and the operator's client",
        "# certificate are super users; each service is a principal of its own (infra/access.py).",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{secure.USER};User:CN=server;User:CN=client",
    ])


def scram_format_args() -> list[str]:
    """The SCRAM user, written into the metadata log at format time (KRaft has no ZooKeeper
    to hold it, and the broker needs it for its own connections before it can serve)."""
    password = secure.material().kafka_password
    return ["--add-scram", f"{secure.SCRAM_MECHANISM}=[name={secure.USER},password={password}]"]


def random_cluster_id() -> str:
    # Kafka's own format (Uuid.randomUuid): url-safe base64 without padding, never leading '-'.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid
