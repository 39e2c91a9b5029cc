"""`onceflow health ADDRESS`: exit 0 when a service's grpc.health.v1 answers SERVING.
Readiness probes (Tilt, Compose) call it."""

from __future__ import annotations

import grpc
import typer
from grpc_health.v1 import health_pb2

from onceflow.admin.tls import channel
from onceflow.probe import check_health
from onceflow_tools.cli.options import TlsCa, TlsCert, TlsKey, client_tls


def health(
    address: str = typer.Argument(..., help="host:port of a onceflow service"),
    timeout: float = typer.Option(2.0, help="Deadline in seconds."),
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """Check a service's gRPC health (exit 0 = SERVING)."""
    try:
        chan = channel(address, client_tls(tls_ca, tls_cert, tls_key))
    except ValueError as exc:  # an unreadable TLS file
        typer.echo(f"{address}: {exc}")
        raise typer.Exit(1) from None
    with chan:
        try:
            reply = check_health(chan, timeout)
        except grpc.RpcError as exc:
            typer.echo(f"{address}: unreachable ({exc.code().name})")
            raise typer.Exit(1) from None
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    typer.echo(f"{address}: {name}")
    raise typer.Exit(0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)
