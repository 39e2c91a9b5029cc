"""`onceflow demo`: the main job, end to end on real parts.

Start Kafka and Redis, then the whole pipeline on a fresh topic prefix of its own: ingest
(acking on), the acker, the dedup gate, a compute worker (PySpark, the ``auctionbids`` job) and
the sink. Push a Nexmark stream (persons, auctions, bids; out of order by up to
``--max-delay-ms``) through ingest with concurrent clients, some of which send batches again (as
a client does after a lost reply); halfway through, kill -9 the compute worker and restart it
(the supervisor's job). A live table shows each service's rate and progress while it runs.

Then the exactly-once report: every generated event is in ingest.records (duplicates only from
client re-sends), dedup.records holds each record_id exactly once, no transaction hangs, and
the table the sink serves from Redis equals the batch answer (the same job run by Spark over the
generated events as one bounded input), which itself equals a plain Python fold of the bids.
Exit 0 only if all of it holds."""

from __future__ import annotations

import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from onceflow.admin.fleet import Endpoint
from onceflow.codec import decode_envelope
from onceflow.config import CommonSettings
from onceflow.kafka import inspect
from onceflow.redis_client import connect, delete_prefix
from onceflow.topology import Topic, job_topic
from onceflow_tools.cli.pipeline_view import PipelineView
from onceflow_tools.infra import stack
from onceflow_tools.console.server import BackgroundConsole
from onceflow_tools.console.settings import ConsoleSettings
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.jvm_output import stderr_to
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service
from onceflow_tools.workloads import ResultTable, auctionbids, nexmark
from onceflow_tools.workloads.senders import Senders

console = Console()
JOB = auctionbids.JOB
SERVICES = ("acker", "dedup", "compute", "sink", "ingest")  # start order: ingest last, once its downstream serves


def demo(
    events: int = typer.Option(100_000, help="Nexmark events to generate (1 person : 3 auctions : 46 bids)."),
    rate: int = typer.Option(10_000, help="Events per second of event time."),
    max_delay_ms: int = typer.Option(2_000, help="How late an event may arrive (out-of-orderness, ms of event time)."),
    batch: int = typer.Option(500, help="Records per Ingest call."),
    clients: int = typer.Option(4, help="Concurrent clients."),
    retry_ratio: float = typer.Option(0.05, help="Share of batches a client sends twice."),
    seed: int = typer.Option(7, help="Workload seed."),
    keep: bool = typer.Option(False, help="Keep the run's topics and Redis tables afterwards (to inspect them)."),
) -> None:
    """Run the whole pipeline on a Nexmark stream with client re-sends and a kill -9, then prove
    every event took effect exactly once."""
    console.rule("[bold]onceflow demo")
    with console.status("starting Kafka (KRaft) and Redis on 127.0.0.1 ..."):
        stack.up()
    base = CommonSettings()
    console.print("infra: [green]up[/] (Kafka", base.kafka_bootstrap, "· Redis", base.redis_url + ")")
    # A topic prefix of its own: its topics, consumer groups, state and Redis tables start empty.
    prefix = f"demo{int(time.time())}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    console.print(f"topics: [green]created[/] with prefix {prefix!r}")

    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-demo-"))
    addresses = {name: f"127.0.0.1:{free_port()}" for name in SERVICES}
    services = {name: _service(name, addresses[name], prefix, max_delay_ms, log_dir) for name in SERVICES}
    ok = False
    web: BackgroundConsole | None = None
    try:
        for name, service in services.items():
            with console.status(f"starting {name} ..."):
                service.start()
                service.wait_healthy(addresses[name], timeout_s=120)
            console.print(f"{name}: [green]serving[/] on {addresses[name]} (log {service.log_path})")
        web = _start_console(common, addresses)
        ok = _run(common, addresses, services, events, rate, max_delay_ms, batch, clients, retry_ratio, seed, web, log_dir)
    finally:
        if web is not None:
            web.stop()
        for name, service in reversed(services.items()):
            try:
                code = service.terminate() if service.alive() else service.returncode
                console.print(f"{name} stopped (exit {code})")
            except AssertionError as exc:  # ignored SIGTERM: killed; the others must still stop
                console.print(f"[red]{name}[/]: {exc}")
            finally:
                service.ensure_dead()
        if keep:
            console.print(f"kept: topics and tables with prefix {prefix!r} (ONCEFLOW_TOPIC_PREFIX={prefix} to query them)")
        else:
            delete_topics(common.kafka_bootstrap, prefix=prefix)
            delete_prefix(connect(common.redis_url), prefix)
        console.print("infra keeps running: `onceflow infra down` stops it")
    if not ok:
        raise typer.Exit(1)


def _start_console(common: CommonSettings, addresses: dict[str, str]) -> BackgroundConsole | None:
    """The operations console on this run's services, on its usual port when that is free."""
    settings = ConsoleSettings()
    settings.port = settings.port if _port_free(settings.host, settings.port) else free_port()
    endpoints = [Endpoint(name, address) for name, address in addresses.items()]
    try:
        web = BackgroundConsole(settings, endpoints, common=common).start()
    except RuntimeError as exc:  # the demo's proof does not need it
        console.print(f"[yellow]console[/]: {exc}")
        return None
    console.print(f"console: [bold]{web.url}[/] (the pipeline live, record lookup, result tables)", highlight=False)
    return web


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _service(name: str, address: str, prefix: str, max_delay_ms: int, log_dir: Path) -> ServiceProcess:
    settings = {"JOB": JOB, "WATERMARK_BOUND_MS": str(max_delay_ms)} if name == "compute" else {}
    return pipeline_service(name, address, prefix, "demo", log_dir, **settings)


def _run(
    common: CommonSettings,
    addresses: dict[str, str],
    services: dict[str, ServiceProcess],
    events: int,
    rate: int,
    max_delay_ms: int,
    batch: int,
    clients: int,
    retry_ratio: float,
    seed: int,
    web: BackgroundConsole | None,
    log_dir: Path,
) -> bool:
    config = nexmark.NexmarkConfig(events=events, rate=rate, max_delay_ms=max_delay_ms, seed=seed)
    with console.status(f"generating {events:,} Nexmark events ..."):
        arrivals = nexmark.arrival_order(config)
    kinds = Counter(e.kind for e in arrivals)
    late = len(nexmark.late_events(arrivals, max_delay_ms))
    console.print(
        f"workload: {kinds['person']:,} persons, {kinds['auction']:,} auctions, {kinds['bid']:,} bids, "
        f"out of order by up to {max_delay_ms:,} ms ({late} beyond the watermark bound)"
    )
    senders = Senders(addresses["ingest"], nexmark.ingest_records(arrivals), batch, clients, retry_ratio, seed)
    view = PipelineView(addresses, event_time_origin_ms=config.base_time_ms)
    if web is not None:
        view.notes.append(f"console: {web.url}")
    progress = Progress(
        TextColumn("[bold]clients"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn()
    )
    task = progress.add_task("clients", total=events, rate="")
    started = time.monotonic()
    killed = False
    with Live(Group(progress, view.render()), console=console, refresh_per_second=4) as live:
        senders.start()
        while senders.running() or not killed:
            done = senders.acknowledged
            # The fault the demo proves itself against: a worker dies mid-batch, halfway through
            # the clients' records (or, if they were faster than one look, while compute still
            # works through the backlog they left).
            if not killed and (done >= events // 2 or not senders.running()):
                services["compute"].kill9()
                services["compute"].start()
                killed = True
                view.notes.append(f"[red]kill -9[/] compute at {done:,} records accepted; the supervisor restarted it")
            progress.update(task, completed=done, rate=f"{done / max(time.monotonic() - started, 1e-6):,.0f} rec/s")
            live.update(Group(progress, view.render()))
            if senders.running():
                time.sleep(0.5)
        progress.update(task, completed=senders.acknowledged)
        elapsed = time.monotonic() - started
        if senders.error is not None:
            return _fail(f"a client failed: {senders.error}")

        spark_log = log_dir / "batch-spark.log"
        view.notes.append(f"batch answer: Spark over the generated events (log {spark_log})")
        live.update(Group(progress, view.render()))
        batch_answer = _batch_answer(arrivals, spark_log)
        if batch_answer != auctionbids.fold_answer(arrivals):
            return _fail("Spark's batch answer differs from a plain fold of the bids")
        deadline = time.monotonic() + 300
        rows = auctionbids.sink_table(addresses["sink"])
        while rows != batch_answer and time.monotonic() < deadline:
            live.update(Group(progress, view.render()))
            time.sleep(1.0)
            rows = auctionbids.sink_table(addresses["sink"])
        live.update(Group(progress, view.render()))
    view.close()
    return _report(common, senders, arrivals, rows, batch_answer, elapsed, killed)


def _batch_answer(arrivals: list[nexmark.Event], spark_log: Path) -> ResultTable:
    """The batch answer, its Spark driver JVM started in this process with ``spark_log`` as its
    stderr: its notices and warnings (log4j's profile, the hostname, the default log level, the
    native-hadoop library) go there for as long as it lives, not to the terminal. The workers'
    JVMs already write to their own logs (each service's stdout and stderr are its log)."""
    with stderr_to(spark_log):
        return auctionbids.batch_answer(arrivals)


def _report(
    common: CommonSettings,
    senders: Senders,
    arrivals: list[nexmark.Event],
    rows: ResultTable,
    batch_answer: ResultTable,
    elapsed: float,
    killed: bool,
) -> bool:
    expected = {f"nexmark:{e.number}" for e in arrivals}
    sent_again = senders.sent_again
    with console.status("reading ingest.records and dedup.records back (read_committed) ..."):
        ingested = [decode_envelope(r.value) for r in inspect.read_committed(common, common.topic(Topic.INGEST_RECORDS))]
        passed = Counter(decode_envelope(r.value).record_id for r in inspect.read_committed(common, common.topic(Topic.DEDUP_RECORDS)))
        watched = (Topic.INGEST_RECORDS, Topic.DEDUP_RECORDS, Topic.COMPUTE_PARTIALS, Topic.COMPUTE_RESULTS)
        hanging = inspect.hanging_transactions(common, [common.topic(job_topic(t, JOB)) for t in watched])
    # Attempt 1 is what clients sent; later attempts are ingest's replays of timed-out trees.
    client_copies = Counter(e.record_id for e in ingested if e.attempt == 1)
    unexplained = {rid for rid, n in client_copies.items() if n > 1} - sent_again
    lost = expected - set(passed)
    duplicated = {rid for rid, n in passed.items() if n > 1}
    unknown = set(passed) - expected
    wrong = {key for key in batch_answer if rows.get(key) != batch_answer[key]} | (set(rows) - set(batch_answer))
    hanging_count = sum(len(p) for p in hanging.values())

    console.print()
    table = Table(title="exactly-once report", show_header=False)
    for name, value in [
        ("records generated", f"{len(expected):,}"),
        ("accepted by ingest", f"{senders.acknowledged:,} in {elapsed:.1f}s ({len(expected) / elapsed:,.0f} records/s)"),
        ("sent again by clients", f"{len(sent_again):,} records; transport retries {senders.retries:,}"),
        ("copies in ingest.records", f"{len(ingested):,} ({sum(e.attempt > 1 for e in ingested):,} ingest replays)"),
        ("distinct record_ids through the gate", f"{len(passed):,}"),
        ("dropped as duplicates", f"{len(ingested) - sum(passed.values()):,}"),
        ("kill -9 of the compute worker", "yes, mid-stream" if killed else "[red]no[/]"),
        (f"{JOB} rows in Redis", f"{len(rows):,}"),
        ("rows equal to the batch answer", f"{len(batch_answer) - len(wrong & set(batch_answer)):,} of {len(batch_answer):,}"),
        ("lost", _count(len(lost))),
        ("duplicated", _count(len(duplicated) + len(unexplained))),
        ("unknown ids", _count(len(unknown))),
        ("rows wrong, missing or extra", _count(len(wrong))),
        ("hanging transactions", _count(hanging_count)),
    ]:
        table.add_row(name, value)
    console.print(table)
    for key in sorted(wrong)[:5]:
        console.print(f"  auction {key}: batch answer {batch_answer.get(key)}, Redis {rows.get(key)}")
    if lost or duplicated or unexplained or unknown or wrong or hanging_count or not killed:
        return _fail("the run did not hold exactly once (see the report)")
    console.print(
        "[green]ok[/]: every event took effect exactly once: each record_id passed the gate once "
        "(client re-sends dropped), and the per-auction table in Redis equals the batch answer, "
        "through a kill -9 of the compute worker."
    )
    return True


def _count(n: int) -> str:
    return "[green]0[/]" if n == 0 else f"[red]{n:,}[/]"


def _fail(message: str) -> bool:
    console.print(f"[red]FAILED[/]: {message}")
    return False
