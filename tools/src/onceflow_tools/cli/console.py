"""`onceflow console`: the live pipeline as a web page (docs/console.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from onceflow.admin import fleet
from onceflow_tools.cli.options import TlsCa, TlsCert, TlsKey, client_tls
from onceflow_tools.console.server import serve, url
from onceflow_tools.console.settings import ConsoleSettings

out = Console()


def console(
    host: Annotated[str | None, typer.Option(help="Address to bind (ONCEFLOW_CONSOLE_HOST, default 127.0.0.1).", show_default=False)] = None,
    port: Annotated[int | None, typer.Option(help="Port (ONCEFLOW_CONSOLE_PORT, default 8090).", show_default=False)] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            envvar="ONCEFLOW_SERVICES_CONFIG", show_default=False,
            help="The services to watch (default infra/services.toml).",
        ),
    ] = None,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """Serve the operations console: the pipeline live, each service, record lookup, result
    tables and admin actions (which ask for the admin token). Stops on Ctrl-C."""
    # Only the options given: the rest come from ONCEFLOW_CONSOLE_*; pydantic validates both alike.
    overrides: dict[str, Any] = {key: value for key, value in {"host": host, "port": port}.items() if value is not None}
    settings = ConsoleSettings(**overrides)
    source = config or settings.services_config or fleet.services_file()
    try:
        endpoints = fleet.load_endpoints(source)
    except (OSError, ValueError) as exc:
        out.print(f"[red]{source}[/]: {exc}")
        raise typer.Exit(2) from None
    if not endpoints:
        out.print(f"[red]{source}[/]: no [[service]] entries to watch")
        raise typer.Exit(2)
    out.print(f"console: {url(settings)} watching {len(endpoints)} services from {source}", highlight=False)
    serve(settings, endpoints, client_tls(tls_ca, tls_cert, tls_key))
