"""`onceflow admin ...`: operate running services over gRPC. Every call has a deadline.
TLS options go before the command (`onceflow admin --tls-ca ca.pem status --all`) or in
ONCEFLOW_TLS_* env vars, and apply to every command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
import typer
from google.protobuf.message import Message
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from onceflow.admin import fleet
from onceflow.admin.auth import ClientTokens
from onceflow.admin.tls import ClientTLS
from onceflow.v1 import acker_pb2, compute_pb2
from onceflow_tools import admin_client
from onceflow_tools.admin_client import NO_CHANNEL, CallFailed, as_dict
from onceflow_tools.cli.options import ProducerOption, ServiceAddress, StreamOption, TlsCa, TlsCert, TlsKey, client_tls

app = typer.Typer(no_args_is_help=True, help="Operate running services (gRPC admin calls).")
acker_app = typer.Typer(no_args_is_help=True, help="The acker's own calls: stats, tree, pending.")
app.add_typer(acker_app, name="acker")
dedup_app = typer.Typer(no_args_is_help=True, help="The dedup gate's own calls: check, stats, forget.")
app.add_typer(dedup_app, name="dedup")
compute_app = typer.Typer(no_args_is_help=True, help="A compute worker's own calls: jobs, state, stats.")
app.add_typer(compute_app, name="compute")
console = Console()

Address = Annotated[str, typer.Option("--address", "-a", help="host:port of the service")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Token = Annotated[str, typer.Option(envvar="ONCEFLOW_ADMIN_TOKEN", show_default=False, help="Admin bearer token (or ONCEFLOW_ADMIN_TOKEN_FILE: a file holding it).")]
TIMEOUT_S = 5.0
T = TypeVar("T")
M = TypeVar("M", bound=Message)


# Set by the group's callback before any command runs: one CLI invocation, one TLS choice.
_client_tls: ClientTLS | None = None


@app.callback()
def _connect(tls_ca: TlsCa = "", tls_cert: TlsCert = "", tls_key: TlsKey = "") -> None:
    global _client_tls
    _client_tls = client_tls(tls_ca, tls_cert, tls_key)


def _call(address: str, fn: Callable[[grpc.Channel], T]) -> T:
    """``fn`` on a channel to ``address`` (this invocation's TLS); a failure is printed, exit 2."""
    try:
        return admin_client.call(address, _client_tls, fn)
    except CallFailed as exc:
        where = address if exc.code == NO_CHANNEL else f"{address}: {exc.code}"
        console.print(f"[red]{where}[/]: {exc.details}")
        raise typer.Exit(2) from None


def _admin_token(token: str) -> str:
    """For a mutating call: --token, else ONCEFLOW_ADMIN_TOKEN or ONCEFLOW_ADMIN_TOKEN_FILE.
    Commands read it inside the call, once the channel is open: an unreadable TLS file is
    reported before an unreadable token file."""
    try:
        return token or ClientTokens().admin()
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _show(reply: M, as_json: bool, view: Callable[[M], RenderableType] | None = None) -> None:
    """--json: the reply as JSON for scripts; else ``view`` of it, by default its fields."""
    if as_json:
        typer.echo(json.dumps(as_dict(reply), indent=2))
    else:
        console.print(view(reply) if view is not None else _fields(reply))


def _show_stats(service: str, address: str | None, as_json: bool) -> None:
    """``service``'s own Stats, from ``address`` or its first instance in the services config."""
    address = address or fleet.default_address(service)
    _show(_call(address, lambda ch: admin_client.STATS[service](ch, TIMEOUT_S)), as_json)


def _fields(reply: Message) -> Table:
    table = Table(show_header=False, box=None)
    for key, value in as_dict(reply).items():
        table.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    return table


@app.command()
def status(
    address: Annotated[
        str | None, typer.Option("--address", "-a", help="host:port of one service (default: ingest, as the services config names it)")
    ] = None,
    all_services: Annotated[bool, typer.Option("--all", help="Every service in the services config, as one table.")] = False,
    config: Annotated[
        Path | None,
        typer.Option(
            envvar="ONCEFLOW_SERVICES_CONFIG", show_default=False,
            help="Services config for --all (default infra/services.toml).",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Deadline per service for --all, in seconds.")] = 2.0,
    as_json: Json = False,
) -> None:
    """The common Admin Status of one service, or of every service (--all; exit 1 unless all serve)."""
    if all_services:
        if address is not None:
            raise typer.BadParameter("give either --address or --all")
        _status_all(config or fleet.services_file(), timeout, as_json)
        return
    target = address or fleet.default_address("ingest")
    _show(_call(target, lambda ch: admin_client.status(ch, TIMEOUT_S)), as_json)


def _status_all(config: Path, timeout_s: float, as_json: bool) -> None:
    try:
        endpoints = fleet.load_endpoints(config)
    except (OSError, ValueError) as exc:  # tomllib's errors are ValueErrors
        console.print(f"[red]{config}[/]: {exc}")
        raise typer.Exit(2) from None
    results = fleet.query_all(endpoints, _client_tls, timeout_s)
    if as_json:
        typer.echo(json.dumps([_status_dict(r) for r in results], indent=2))
    else:
        console.print(_status_table(results))
    required = [r for r in results if not r.endpoint.optional]
    raise typer.Exit(0 if required and all(r.health == "SERVING" for r in required) else 1)


def _status_dict(result: fleet.ServiceStatus) -> dict[str, Any]:
    return {
        "service": result.endpoint.name,
        "address": result.endpoint.address,
        "health": result.health,
        "error": result.error,
        "status": as_dict(result.status) if result.status is not None else None,
    }


def _status_table(results: list[fleet.ServiceStatus]) -> RenderableType:
    """One row per instance; the last errors (often long Kafka messages) go below the table,
    so the columns stay readable in a terminal."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("service", "address", "instance", "health", "state", "partitions", "lag", "in", "out", "commits", "aborts"):
        numeric = column in ("lag", "in", "out", "commits", "aborts")
        # Narrow terminals truncate the figures before the names, health and state.
        keep = {"service": 7, "health": 11, "state": 8}.get(column)
        table.add_column(column, no_wrap=True, justify="right" if numeric else "left", min_width=keep)
    errors = Table.grid(padding=(0, 1))
    switched = Table.grid(padding=(0, 1))
    for r in results:
        health = {"SERVING": "[green]SERVING[/]", fleet.DOWN: "[red]DOWN[/]"}.get(r.health, f"[yellow]{r.health}[/]")
        if r.error:
            # A failed call's error is gRPC's long connect story; a service's own last error is kept whole.
            error = r.error if r.status is not None else _short(r.error)
            errors.add_row(f"{r.endpoint.name} {r.endpoint.address}:", f"[red]{escape(error)}[/]")
        s = r.status
        if s is None:
            table.add_row(r.endpoint.name, r.endpoint.address, "-", health, *["-"] * 7)
            continue
        if s.test_switches:
            switched.add_row(f"{r.endpoint.name} {r.endpoint.address}:", f"[bold red]{escape('; '.join(s.test_switches))}[/]")
        partitions = sorted(p.partition for p in s.partitions)
        table.add_row(
            s.service or r.endpoint.name, r.endpoint.address, s.instance, health, s.state,
            _ranges(partitions) if partitions else "-",
            f"{sum(p.lag for p in s.partitions):,}" if partitions else "-",
            f"{s.records_in:,}", f"{s.records_out:,}",
            f"{s.transactions_committed:,}", f"{s.transactions_aborted:,}",
        )
    parts: list[RenderableType] = [table]
    if switched.row_count:
        parts += [Text("\ntest-only switches on (not for production):", style="bold red"), switched]
    if errors.row_count:
        parts += [Text("\nlast errors:", style="bold"), errors]
    return Group(*parts) if len(parts) > 1 else table


def _short(error: str) -> str:
    """"UNAVAILABLE: failed to connect ...: Connection refused" -> "UNAVAILABLE: Connection refused"
    (--json keeps the whole text)."""
    code, _, detail = error.partition(": ")
    return f"{code}: {detail.rsplit(': ', 1)[-1]}" if detail else error


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> "0-3,6": a short column however many partitions an instance owns."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# Mutations take no default address: nothing gets paused by accident.
@app.command()
def pause(address: Address, token: Token = "", as_json: Json = False) -> None:
    """Stop taking work (needs the admin token)."""
    _show(_call(address, lambda ch: admin_client.pause(ch, TIMEOUT_S, _admin_token(token))), as_json)


@app.command()
def resume(address: Address, token: Token = "", as_json: Json = False) -> None:
    """Take work again, also after a drain (needs the admin token)."""
    _show(_call(address, lambda ch: admin_client.resume(ch, TIMEOUT_S, _admin_token(token))), as_json)


@app.command()
def drain(
    address: Address,
    wait: Annotated[int, typer.Option(help="Seconds the service waits for in-flight work to commit.")] = 30,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Stop taking work and commit what is in flight; the process stays up (needs the admin token)."""
    reply = _call(address, lambda ch: admin_client.drain(ch, wait, TIMEOUT_S, _admin_token(token)))
    _show(reply, as_json)
    if not reply.drained:
        raise typer.Exit(1)


@acker_app.command("stats")
def acker_stats(address: ServiceAddress = None, as_json: Json = False) -> None:
    """Pending trees, decisions, completed/s, tree latency p50/p99."""
    _show_stats("acker", address, as_json)


@acker_app.command("tree")
def acker_tree(
    root_id: Annotated[int | None, typer.Option(help="The tree's root id.")] = None,
    record_id: Annotated[str | None, typer.Option(help="A record id: its pending trees.")] = None,
    address: ServiceAddress = None,
    as_json: Json = False,
) -> None:
    """A pending tree by root id or record id."""
    address = address or fleet.default_address("acker")
    if (root_id is None) == (record_id is None):
        raise typer.BadParameter("give exactly one of --root-id and --record-id")
    tree = _call(address, lambda ch: admin_client.get_tree(ch, TIMEOUT_S, root_id=root_id, record_id=record_id or ""))
    _show(tree, as_json)


@acker_app.command("pending")
def acker_pending(
    limit: Annotated[int, typer.Option(help="At most this many trees (<= 1000).")] = 20,
    older_than_ms: Annotated[int, typer.Option(help="Only trees older than this.")] = 0,
    address: ServiceAddress = None,
    as_json: Json = False,
) -> None:
    """The oldest pending trees."""
    address = address or fleet.default_address("acker")
    _show(_call(address, lambda ch: admin_client.list_pending(ch, TIMEOUT_S, limit, older_than_ms)), as_json, _pending_table)


def _pending_table(reply: acker_pb2.ListPendingReply) -> Table:
    table = Table(title=f"{reply.total_pending} pending")
    for column in ("root_id", "record_id", "attempt", "age ms", "init seen", "failed"):
        table.add_column(column)
    for tree in reply.trees:
        table.add_row(str(tree.root_id), tree.origin.record_id, str(tree.attempt), str(tree.age_ms), str(tree.init_seen), str(tree.failed))
    return table


@dedup_app.command("check")
def dedup_check(
    record_id: Annotated[str, typer.Argument(help="The record id to look up.")],
    stream: StreamOption = "",
    producer: ProducerOption = "",
    address: ServiceAddress = None,
    as_json: Json = False,
) -> None:
    """Whether the gate would drop a new copy of RECORD_ID (of --stream), and until when."""
    address = address or fleet.default_address("dedup")
    _show(_call(address, lambda ch: admin_client.dedup_check(ch, TIMEOUT_S, record_id, stream, producer)), as_json)


@dedup_app.command("stats")
def dedup_stats(address: ServiceAddress = None, as_json: Json = False) -> None:
    """Passed, dropped, fast-path ratio, store reads, measured vs configured false positives."""
    _show_stats("dedup", address, as_json)


@dedup_app.command("forget")
def dedup_forget(
    record_id: Annotated[str, typer.Argument(help="The record id to forget.")],
    stream: StreamOption = "",
    producer: ProducerOption = "",
    address: ServiceAddress = None,
    token: Token = "",
    as_json: Json = False,
) -> None:
    """Drop RECORD_ID (of --stream) from the gate's exact store (a committed tombstone), so it can be re-driven."""
    address = address or fleet.default_address("dedup")
    reply = _call(address, lambda ch: admin_client.forget(ch, TIMEOUT_S * 8, _admin_token(token), record_id, stream, producer))
    _show(reply, as_json)


@compute_app.command("jobs")
def compute_jobs(address: ServiceAddress = None, as_json: Json = False) -> None:
    """The jobs a worker knows: the one it runs and the built-ins, with schema, key and aggregates."""
    address = address or fleet.default_address("compute")
    _show(_call(address, lambda ch: admin_client.list_jobs(ch, TIMEOUT_S)), as_json, _jobs_table)


def _jobs_table(reply: compute_pb2.ListJobsReply) -> Table:
    table = Table(title=f"{len(reply.jobs)} jobs")
    for column in ("name", "kind", "key", "aggregates", "input schema", "running"):
        # Long aggregates fold rather than lose their column names to an ellipsis.
        table.add_column(column, overflow="fold", no_wrap=column in ("kind", "running"))
    for job in reply.jobs:
        table.add_row(
            escape(job.name), job.kind, escape(job.key), escape("\n".join(job.aggregates)) or "-",
            escape(job.input_schema.replace(", ", "\n")), "[green]yes[/]" if job.running else "no",
        )
    return table


@compute_app.command("state")
def compute_state(
    job: Annotated[str, typer.Argument(help="The job (the one the worker runs).")],
    key: Annotated[str, typer.Argument(help="The group key.")],
    address: ServiceAddress = None,
    as_json: Json = False,
) -> None:
    """KEY's state in this worker: the committed row and its partials; exit 1 when not found here."""
    address = address or fleet.default_address("compute")
    reply = _call(address, lambda ch: admin_client.get_state(ch, TIMEOUT_S, job, key))
    missing = f"no state for {key!r} of {job!r} in this worker's partitions (another worker of the job may own it)"
    _show(reply, as_json, lambda r: _state_table(r) if r.found else missing)
    if not reply.found:
        raise typer.Exit(1)


def _state_table(reply: compute_pb2.GetStateReply) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("row", escape(reply.row))
    table.add_row("partials", escape(reply.partials))
    table.add_row("partition", str(reply.partition))
    table.add_row("owned", str(reply.owned))
    return table


@compute_app.command("stats")
def compute_stats(address: ServiceAddress = None, as_json: Json = False) -> None:
    """The job, engine, adaptive batch size, rates, job time p50/p99, records in, dead letters, keys."""
    _show_stats("compute", address, as_json)
