"""Every configured service's health and Admin Status at once (`onceflow admin status --all`).

The addresses come from one TOML file (``infra/services.toml``). All services are queried in
parallel under one deadline, so a dead, hung or firewalled service costs the command at most
that deadline and shows as DOWN instead of hiding the others."""

from __future__ import annotations

import os
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from onceflow import topology
from onceflow.admin.tls import ClientTLS, channel
from onceflow.config import repo_root
from onceflow.probe import check_health
from onceflow.v1 import admin_pb2, admin_pb2_grpc

DOWN = "DOWN"
SERVING = "SERVING"


@dataclass(frozen=True)
class Endpoint:
    name: str
    address: str
    # Runs only where a deployment wants it (the Kafka source): down, it does not make the
    # pipeline unhealthy.
    optional: bool = False


@dataclass(frozen=True)
class ServiceStatus:
    endpoint: Endpoint
    # grpc.health.v1's answer (SERVING, NOT_SERVING, ...) or DOWN when the service did not answer.
    health: str
    status: admin_pb2.StatusReply | None = None
    error: str = ""
    extra: Message | None = None  # the ``also`` call's reply

    @property
    def serving(self) -> bool:
        return self.health == SERVING and self.status is not None


def services_file() -> Path:
    """ONCEFLOW_SERVICES_CONFIG, else the checkout's infra/services.toml."""
    configured = os.environ.get("ONCEFLOW_SERVICES_CONFIG")
    return Path(configured) if configured else repo_root() / "infra" / "services.toml"


def default_address(service: str, path: Path | None = None) -> str:
    """Where a command that names no address finds ``service``: its first instance in the
    services config, so that the CLI follows a deployment's ports; without one, the topology's
    default port on loopback."""
    path = path or services_file()
    if path.is_file():
        for endpoint in load_endpoints(path):
            if endpoint.name == service:
                return endpoint.address
    return topology.service(service).address()


def load_endpoints(path: Path) -> list[Endpoint]:
    """``[[service]]`` entries with ``name`` and ``address`` (host:port), and ``optional`` when
    it need not run, in file order."""
    entries = tomllib.loads(path.read_text()).get("service", [])
    endpoints = []
    for index, entry in enumerate(entries):
        if not isinstance(entry.get("name"), str) or not isinstance(entry.get("address"), str):
            raise ValueError(f"{path}: service entry {index + 1} needs a name and an address")
        endpoints.append(Endpoint(entry["name"], entry["address"], bool(entry.get("optional", False))))
    return endpoints


def _error(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


def query(
    endpoint: Endpoint, tls: ClientTLS | None, timeout_s: float, bearer: str | None = None,
    also: Callable[[grpc.Channel, float], Message] | None = None,
) -> ServiceStatus:
    """Health, then Status, then ``also`` (a call of the service's own, given the time left), all
    within ``timeout_s``. ``bearer``: the token reads carry (default: the environment's)."""
    deadline = time.monotonic() + timeout_s

    def remaining() -> float:
        return max(deadline - time.monotonic(), 0.001)

    try:
        chan = channel(endpoint.address, tls, bearer=bearer)
    except ValueError as exc:  # an unreadable TLS file
        return ServiceStatus(endpoint, DOWN, error=str(exc))
    with chan:
        try:
            reply = check_health(chan, timeout_s=remaining())
        except grpc.RpcError as exc:
            return ServiceStatus(endpoint, DOWN, error=_error(exc))
        health = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        try:
            status = admin_pb2_grpc.AdminStub(chan).Status(admin_pb2.StatusRequest(), timeout=remaining())
        except grpc.RpcError as exc:
            return ServiceStatus(endpoint, health, error=_error(exc))
        extra = None
        if also is not None:
            try:
                extra = also(chan, remaining())
            except grpc.RpcError as exc:
                return ServiceStatus(endpoint, health, status, _error(exc))
    return ServiceStatus(endpoint, health, status, status.last_error, extra)


def query_all(endpoints: list[Endpoint], tls: ClientTLS | None, timeout_s: float = 2.0) -> list[ServiceStatus]:
    """Every endpoint in parallel; results in the endpoints' order."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=len(endpoints), thread_name_prefix="status") as pool:
        return list(pool.map(lambda endpoint: query(endpoint, tls, timeout_s), endpoints))
