"""`onceflow query ...`: read the result tables the sink keeps in Redis, over its Query API."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import grpc
import typer
from rich.console import Console
from rich.table import Table

from onceflow.admin import fleet
from onceflow.admin.auth import ClientTokens
from onceflow_client import QueryClient
from onceflow_client.query import MAX_PAGE
from onceflow_tools.cli.options import ServiceAddress, TlsCa, TlsCert, TlsKey, client_tls, full_width_console

app = typer.Typer(no_args_is_help=True, help="Read result tables through the sink's Query API.")


def console() -> Console:
    """The output console, made when used: whether stdout is a terminal, and COLUMNS, are read
    then, not when the module was imported."""
    return full_width_console()

notes = Console(stderr=True)

Address = Annotated[str, typer.Option("--address", "-a", help="host:port of a sink")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
TIMEOUT_S = 5.0
T = TypeVar("T")


def _query_call(address: str, tls_ca: str, tls_cert: str, tls_key: str, call: Callable[[QueryClient], T]) -> T:
    """``call`` on a QueryClient with the read token (ONCEFLOW_READ_TOKEN) and the TLS options."""
    try:
        token = ClientTokens().bearer()
    except ValueError as exc:
        console().print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    with QueryClient(address, token, client_tls(tls_ca, tls_cert, tls_key), TIMEOUT_S) as query:
        try:
            return call(query)
        except grpc.RpcError as exc:
            console().print(f"[red]{address}: {exc.code().name}[/]: {exc.details()}")
            raise typer.Exit(2) from None


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        return value.hex()


def _json_value(value: bytes) -> Any:
    """A row's value for --json: the sink writes rows as JSON, so it goes out as that JSON (an
    object, not a string holding one); a value that is not JSON (written by hand, say) stays its
    text."""
    try:
        return json.loads(value)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        return _text(value)


def _first_rows(rows: Iterable[tuple[str, bytes]], limit: int | None) -> tuple[list[tuple[str, bytes]], bool]:
    """Up to ``limit`` distinct rows (all of them with None), sorted by key, and whether the table
    held more. One more row than the limit is read to tell: a Scan may hand out a row twice
    (HSCAN's promise), so rows are counted by key."""
    found: dict[str, bytes] = {}
    more = False
    for key, value in rows:
        if limit is not None and key not in found and len(found) == limit:
            more = True
            break
        found[key] = value
    return sorted(found.items()), more


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
        typer.echo(json.dumps({"found": value is not None, "value": _json_value(value) if value is not None else None}))
    elif value is not None:
        typer.echo(_text(value))
    else:
        console().print(f"no row {key!r} in {job!r}")
    if value is None:
        raise typer.Exit(1)


@app.command()
def scan(
    job: Annotated[str, typer.Argument(help="The job whose table to read.")],
    prefix: Annotated[str, typer.Option(help="Only keys starting with this.")] = "",
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows; the output says when the table has more.")] = 100,
    every: Annotated[bool, typer.Option("--all", help="Every row, page by page (--limit is ignored).")] = False,
    address: ServiceAddress = None,
    as_json: Json = False,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """Rows printed in key order: with --all the whole table; else the first --limit rows the
    store hands out (its scan order, not the smallest keys), and a note when there are more."""
    address = address or fleet.default_address("sink")
    page_size = MAX_PAGE if every else min(limit + 1, MAX_PAGE)

    def read(query: QueryClient) -> tuple[list[tuple[str, bytes]], bool]:
        return _first_rows(query.scan(job, prefix, page_size), None if every else limit)

    rows, more = _query_call(address, tls_ca, tls_cert, tls_key, read)
    cut = f"--limit {limit} reached, {job!r} has more rows: --all for every row"
    if as_json:
        if more:  # on stderr, so that stdout stays a list a script can load
            notes.print(cut, markup=False, highlight=False)
        typer.echo(json.dumps([{"key": key, "value": _json_value(value)} for key, value in rows]))
        return
    table = Table(title=f"{job}: first {len(rows)} rows, more exist" if more else f"{job}: {len(rows)} rows")
    table.add_column("key")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, _text(value))
    console().print(table)
    if more:
        console().print(cut, markup=False, highlight=False)
