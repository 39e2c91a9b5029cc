"""`onceflow query ...`: read the result tables the sink keeps in Redis, over its Query API."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Annotated, TypeVar

import grpc
import typer
from rich.console import Console
from rich.table import Table

from onceflow.admin import fleet
from onceflow.admin.auth import ClientTokens
from onceflow_client import QueryClient
from onceflow_client.query import MAX_PAGE
from onceflow_tools.cli.options import ServiceAddress, TlsCa, TlsCert, TlsKey, client_tls

app = typer.Typer(no_args_is_help=True, help="Read result tables through the sink's Query API.")
console = Console()

Address = Annotated[str, typer.Option("--address", "-a", help="host:port of a sink")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
TIMEOUT_S = 5.0
T = TypeVar("T")


def _query_call(address: str, tls_ca: str, tls_cert: str, tls_key: str, call: Callable[[QueryClient], T]) -> T:
    """``call`` on a QueryClient with the read token (ONCEFLOW_READ_TOKEN) and the TLS options."""
    try:
        token = ClientTokens().bearer()
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    with QueryClient(address, token, client_tls(tls_ca, tls_cert, tls_key), TIMEOUT_S) as query:
        try:
            return call(query)
        except grpc.RpcError as exc:
            console.print(f"[red]{address}: {exc.code().name}[/]: {exc.details()}")  # type: ignore[attr-defined]
            raise typer.Exit(2) from None


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()


@app.command()
def get(
    job: Annotated[str, typer.Argument(help="The job whose table to read.")],
    key: Annotated[str, typer.Argument(help="The row key.")],
    address: ServiceAddress = None,
    as_json: Json = False,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """One row; exit 1 when it does not exist."""
    address = address or fleet.default_address("sink")
    value = _query_call(address, tls_ca, tls_cert, tls_key, lambda query: query.get(job, key))
    if as_json:
        typer.echo(json.dumps({"found": value is not None, "value": _text(value or b"")}))
    elif value is not None:
        typer.echo(_text(value))
    else:
        console.print(f"no row {key!r} in {job!r}")
    if value is None:
        raise typer.Exit(1)


@app.command()
def scan(
    job: Annotated[str, typer.Argument(help="The job whose table to read.")],
    prefix: Annotated[str, typer.Option(help="Only keys starting with this.")] = "",
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 100,
    every: Annotated[bool, typer.Option("--all", help="Every row, page by page (limit is ignored).")] = False,
    address: ServiceAddress = None,
    as_json: Json = False,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """Rows in key order: the first --limit found, or with --all the whole table."""
    address = address or fleet.default_address("sink")
    page_size = MAX_PAGE if every else min(limit, MAX_PAGE)

    def read(query: QueryClient) -> dict[str, bytes]:
        rows = query.scan(job, prefix, page_size)
        return dict(rows if every else itertools.islice(rows, limit))

    rows = sorted(_query_call(address, tls_ca, tls_cert, tls_key, read).items())
    if as_json:
        typer.echo(json.dumps([{"key": key, "value": _text(value)} for key, value in rows]))
        return
    table = Table(title=f"{job}: {len(rows)} rows")
    table.add_column("key")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, _text(value))
    console.print(table)
