"""`onceflow admin ...`: operate running services over gRPC. Every call has a deadline."""

from __future__ import annotations

import json
from typing import Annotated

import grpc
import typer
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from onceflow.v1 import acker_pb2, acker_pb2_grpc, admin_pb2, admin_pb2_grpc, dedup_pb2, dedup_pb2_grpc

app = typer.Typer(no_args_is_help=True, help="Operate running services (gRPC admin calls).")
acker_app = typer.Typer(no_args_is_help=True, help="The acker's own calls: stats, tree, pending.")
app.add_typer(acker_app, name="acker")
dedup_app = typer.Typer(no_args_is_help=True, help="The dedup gate's own calls: check, stats, forget.")
app.add_typer(dedup_app, name="dedup")
console = Console()

Address = Annotated[str, typer.Option("--address", "-a", help="host:port of the service")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
TIMEOUT_S = 5.0


def _call(address: str, fn):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(address) as channel:
        try:
            return fn(channel)
        except grpc.RpcError as exc:
            console.print(f"[red]{address}: {exc.code().name}[/]: {exc.details()}")  # type: ignore[attr-defined]
            raise typer.Exit(2) from None


def _print(message: Message, as_json: bool) -> None:
    data = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(show_header=False, box=None)
    for key, value in data.items():
        table.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    console.print(table)


@app.command()
def status(address: Address = "127.0.0.1:50051", as_json: Json = False) -> None:
    """The common Admin Status of one service."""
    reply = _call(address, lambda ch: admin_pb2_grpc.AdminStub(ch).Status(admin_pb2.StatusRequest(), timeout=TIMEOUT_S))
    _print(reply, as_json)


@acker_app.command("stats")
def acker_stats(address: Address = "127.0.0.1:50052", as_json: Json = False) -> None:
    """Pending trees, decisions, completed/s, tree latency p50/p99."""
    reply = _call(address, lambda ch: acker_pb2_grpc.AckerAdminStub(ch).Stats(acker_pb2.AckerStatsRequest(), timeout=TIMEOUT_S))
    _print(reply, as_json)


@acker_app.command("tree")
def acker_tree(
    root_id: Annotated[int | None, typer.Option(help="The tree's root id.")] = None,
    record_id: Annotated[str | None, typer.Option(help="A record id: its pending trees.")] = None,
    address: Address = "127.0.0.1:50052",
    as_json: Json = False,
) -> None:
    """A pending tree by root id or record id."""
    if (root_id is None) == (record_id is None):
        raise typer.BadParameter("give exactly one of --root-id and --record-id")
    request = acker_pb2.GetTreeRequest(root_id=root_id) if root_id is not None else acker_pb2.GetTreeRequest(record_id=record_id)
    reply = _call(address, lambda ch: acker_pb2_grpc.AckerAdminStub(ch).GetTree(request, timeout=TIMEOUT_S))
    _print(reply, as_json)


@acker_app.command("pending")
def acker_pending(
    limit: Annotated[int, typer.Option(help="At most this many trees (<= 1000).")] = 20,
    older_than_ms: Annotated[int, typer.Option(help="Only trees older than this.")] = 0,
    address: Address = "127.0.0.1:50052",
    as_json: Json = False,
) -> None:
    """The oldest pending trees."""
    request = acker_pb2.ListPendingRequest(limit=limit, older_than_ms=older_than_ms)
    reply = _call(address, lambda ch: acker_pb2_grpc.AckerAdminStub(ch).ListPending(request, timeout=TIMEOUT_S))
    if as_json:
        _print(reply, True)
        return
    table = Table(title=f"{reply.total_pending} pending")
    for column in ("root_id", "record_id", "attempt", "age ms", "init seen", "failed"):
        table.add_column(column)
    for tree in reply.trees:
        table.add_row(str(tree.root_id), tree.origin.record_id, str(tree.attempt), str(tree.age_ms), str(tree.init_seen), str(tree.failed))
    console.print(table)


@dedup_app.command("check")
def dedup_check(
    record_id: Annotated[str, typer.Argument(help="The record id to look up.")],
    address: Address = "127.0.0.1:50053",
    as_json: Json = False,
) -> None:
    """Whether the gate would drop a new copy of RECORD_ID, and until when."""
    request = dedup_pb2.CheckRequest(record_id=record_id)
    reply = _call(address, lambda ch: dedup_pb2_grpc.DedupAdminStub(ch).Check(request, timeout=TIMEOUT_S))
    _print(reply, as_json)


@dedup_app.command("stats")
def dedup_stats(address: Address = "127.0.0.1:50053", as_json: Json = False) -> None:
    """Passed, dropped, fast-path ratio, store reads, measured vs configured false positives."""
    reply = _call(address, lambda ch: dedup_pb2_grpc.DedupAdminStub(ch).Stats(dedup_pb2.DedupStatsRequest(), timeout=TIMEOUT_S))
    _print(reply, as_json)


@dedup_app.command("forget")
def dedup_forget(
    record_id: Annotated[str, typer.Argument(help="The record id to forget.")],
    address: Address = "127.0.0.1:50053",
    token: Annotated[str, typer.Option(envvar="ONCEFLOW_ADMIN_TOKEN", help="Admin bearer token.")] = "",
    as_json: Json = False,
) -> None:
    """Drop RECORD_ID from the gate's exact store (a committed tombstone), so it can be re-driven."""
    request = dedup_pb2.ForgetRequest(record_id=record_id)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    reply = _call(
        address, lambda ch: dedup_pb2_grpc.DedupAdminStub(ch).Forget(request, metadata=metadata, timeout=TIMEOUT_S * 8)
    )
    _print(reply, as_json)
