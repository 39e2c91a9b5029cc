"""Options several commands share: how the CLI reaches services over TLS."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.console import Console

from onceflow.admin.tls import ClientTLS

# Wide enough for any row a command prints: a pipe or a file has no width to fit.
UNBOUNDED_WIDTH = 100_000

# A command's service address; unset: that service's first instance in the services config
# (ONCEFLOW_SERVICES_CONFIG, else infra/services.toml), so the CLI follows a deployment's ports.
ServiceAddress = Annotated[
    str | None,
    typer.Option(
        "--address", "-a", show_default=False,
        help="host:port of the service (default: its first instance in ONCEFLOW_SERVICES_CONFIG or infra/services.toml).",
    ),
]
# A record's stream (docs/decisions/0025); empty: the default stream.
StreamOption = Annotated[
    str,
    typer.Option("--stream", show_default=False, help="The record's stream (default: the default stream)."),
]
# The producer that sent a record (docs/decisions/0027); empty: none (anonymous).
ProducerOption = Annotated[
    str,
    typer.Option("--producer", show_default=False, help="The producer that sent it (default: none, anonymous)."),
]
TlsCa = Annotated[
    str,
    typer.Option(
        "--tls-ca", envvar="ONCEFLOW_TLS_CA_FILE", show_default=False,
        help="CA certificate (PEM) to verify the services with; turns TLS on.",
    ),
]
TlsCert = Annotated[
    str,
    typer.Option(
        "--tls-cert", envvar="ONCEFLOW_TLS_CLIENT_CERT_FILE", show_default=False,
        help="Client certificate (PEM), for services that require one (ONCEFLOW_TLS_CLIENT_CA_FILE).",
    ),
]
TlsKey = Annotated[
    str,
    typer.Option("--tls-key", envvar="ONCEFLOW_TLS_CLIENT_KEY_FILE", show_default=False, help="The client certificate's key (PEM)."),
]


def client_tls(ca_file: str, cert_file: str, key_file: str) -> ClientTLS | None:
    """None (plaintext) when no TLS option is given."""
    try:
        return ClientTLS.of(ca_file, cert_file, key_file)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def full_width_console(**kwargs: Any) -> Console:
    """A Console that fits a terminal's width, and does not cut lines at rich's default 80 columns
    when the output is a pipe or a file (a script reading a table wants whole rows). COLUMNS,
    when set, still wins."""
    console = Console(**kwargs)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = UNBOUNDED_WIDTH
    return console
