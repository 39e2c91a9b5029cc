"""`onceflow query ...`: read the result tables the sink keeps in Redis, over its Query API."""

from __future__ import annotations

import json
from typing import Annotated

import grpc
import typer
from rich.console import Console
from rich.table import Table

from onceflow.admin.tls import channel
from onceflow.client import scan_rows
from onceflow.v1 import sink_pb2, sink_pb2_grpc
from onceflow_tools.cli.options import TlsCa, TlsCert, TlsKey, client_tls

app = typer.Typer(no_args_is_help=True, help="Read result tables through the sink's Query API.")
console = Console()

Address = Annotated[str, typer.Option("--address", "-a", help="host:port of a sink")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
TIMEOUT_S = 5.0


def _stub_call(address: str, tls_ca: str, tls_cert: str, tls_key: str, call):  # type: ignore[no-untyped-def]
    with channel(address, client_tls(tls_ca, tls_cert, tls_key)) as chan:
        try:
            return call(sink_pb2_grpc.QueryStub(chan))
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
    address: Address = "127.0.0.1:15055",
    as_json: Json = False,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """One row; exit 1 when it does not exist."""
    request = sink_pb2.GetRowRequest(job=job, key=key)
    reply = _stub_call(address, tls_ca, tls_cert, tls_key, lambda stub: stub.Get(request, timeout=TIMEOUT_S))
    if as_json:
        typer.echo(json.dumps({"found": reply.found, "value": _text(reply.value)}))
    elif reply.found:
        typer.echo(_text(reply.value))
    else:
        console.print(f"no row {key!r} in {job!r}")
    if not reply.found:
        raise typer.Exit(1)


@app.command()
def scan(
    job: Annotated[str, typer.Argument(help="The job whose table to read.")],
    prefix: Annotated[str, typer.Option(help="Only keys starting with this.")] = "",
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 100,
    every: Annotated[bool, typer.Option("--all", help="Every row, page by page (limit is ignored).")] = False,
    address: Address = "127.0.0.1:15055",
    as_json: Json = False,
    tls_ca: TlsCa = "",
    tls_cert: TlsCert = "",
    tls_key: TlsKey = "",
) -> None:
    """Rows in key order: the first --limit found, or with --all the whole table."""
    most = None if every else limit
    found = _stub_call(address, tls_ca, tls_cert, tls_key, lambda stub: scan_rows(stub, job, prefix, TIMEOUT_S, most))
    rows = sorted(found.items())
    if as_json:
        typer.echo(json.dumps([{"key": key, "value": _text(value)} for key, value in rows]))
        return
    table = Table(title=f"{job}: {len(rows)} rows")
    table.add_column("key")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, _text(value))
    console.print(table)
