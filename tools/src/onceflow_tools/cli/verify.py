"""`onceflow verify`: run the whole pipeline through a fault campaign and check that every
record took effect exactly once. Exit 0 only if nothing was lost or duplicated, no aborted write
was read, no transaction hangs, and the sink's table equals the batch answer; 1 if the checker
found a violation; 2 if the campaign could not run to the end (no verdict)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from onceflow.faults import VERIFY_SABOTAGES
from onceflow_tools.cli.pipeline_view import PipelineView
from onceflow_tools.verify import campaign
from onceflow_tools.verify.check import Verdict
from onceflow_tools.verify.schedule import KINDS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``2m``, ``1.5h`` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 2m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def verify(
    duration: str = typer.Option("2m", help="How long the clients send and faults are injected (90s, 2m, 30m)."),
    rate: int = typer.Option(300, help="Records per second the clients offer."),
    records: int = typer.Option(0, help="Records to send (default: rate × duration)."),
    faults: str = typer.Option(
        "", help=f"Fault kinds, comma-separated: {', '.join(KINDS)}. Default: every kind the stack can take (redis-failover needs --redis sentinel, the targeted broker faults --brokers 3, the Spark faults --spark standalone, recreate-source-topic --source, the postgres ones --sink postgres)."
    ),
    fault_every: float = typer.Option(10.0, help="Seconds between faults."),
    resend_ratio: float = typer.Option(0.05, help="Share of batches a client sends twice (client retries). Not with --source."),
    late_resends: bool = typer.Option(
        True, help="Send earlier batches again after each fault and at the end (what exposes a dedup id Redis lost). Off, nothing re-delivers what a broken build lost. Not with --source."
    ),
    source: bool = typer.Option(
        False, "--source", help="Feed the workload through the Kafka source instead of ingest's clients: produced once each (an idempotent producer) into the run's topic <prefix>user.orders, copied by the source service (a sixth service, under its default kafka://... record ids); the checker expects every record produced. Enables the recreate-source-topic fault. No client re-sends or late re-sends: a record produced again is a new record."
    ),
    sink: str = typer.Option(
        "redis", help="Where the results go: redis (the default), postgres (the sink's tables in PostgreSQL, started if needed; enables postgres-kill and postgres-rollback), or kafka (a second sink writes the job's table to the output topic <prefix>results.<job>, checked too)."
    ),
    clients: int = typer.Option(4, help="Concurrent clients."),
    seed: int = typer.Option(1, help="Seed of the workload and of the fault schedule."),
    workload: str = typer.Option("nexmark", help="nexmark (job auctionbids) or keyed-count (job usersum)."),
    users: int = typer.Option(1_000, help="keyed-count: distinct keys."),
    settle: float = typer.Option(300.0, help="Seconds the sink may take to converge after the clients finish."),
    sabotage: str = typer.Option(
        "", help=f"Test the checker: run a deliberately broken build ({', '.join(VERIFY_SABOTAGES)}; comma-separated); verify must then fail."
    ),
    brokers: int | None = typer.Option(
        None, help="1: one broker. 3: a KRaft cluster of three nodes (started if needed; enables the targeted broker faults). Default: ONCEFLOW_KAFKA_BROKERS or 1."
    ),
    spark_cluster: str | None = typer.Option(
        None, "--spark", help="none: compute runs Spark in-process. standalone: on a Spark master and two workers (started if needed; enables the Spark faults). Default: ONCEFLOW_SPARK_CLUSTER or none."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the verdict as JSON on stdout (the report goes to stderr)."),
    keep: bool = typer.Option(False, help="Keep the run's topics and Redis tables afterwards."),
) -> None:
    """A chaos campaign (kill -9, crashes inside transactions, zombies, broker restarts, Redis
    kill -9, rollback and flush, client retries and late re-sends) over the whole pipeline, then
    the exactly-once checker, on the drained pipeline."""
    console = Console(stderr=json_out)
    if brokers is not None:
        if brokers not in (1, 3):
            raise typer.BadParameter("--brokers takes 1 or 3")
        os.environ["ONCEFLOW_KAFKA_BROKERS"] = str(brokers)
    if spark_cluster is not None:
        if spark_cluster not in ("none", "standalone"):
            raise typer.BadParameter("--spark takes none or standalone")
        os.environ["ONCEFLOW_SPARK_CLUSTER"] = spark_cluster
    try:
        options = campaign.CampaignOptions(
            records=records, rate=rate, duration_s=parse_duration(duration),
            faults=tuple(f.strip() for f in faults.split(",") if f.strip()), fault_every_s=fault_every,
            resend_ratio=resend_ratio, late_resends=late_resends, clients=clients, seed=seed, settle_s=settle, sabotage=sabotage, keep=keep,
            workload=workload, users=users, source=source, sink=sink,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    console.rule(
        f"[bold]onceflow verify[/]: {options.workload}, {options.records:,} records at {options.rate:,}/s, "
        f"faults {', '.join(options.faults)}{', through the Kafka source' if options.source else ''}"
        f"{'' if options.sink == 'redis' else f', sink {options.sink}'}"
    )
    view: PipelineView | None = None
    printed = 0

    def render(progress: campaign.Progress) -> Group:
        nonlocal view
        if progress.addresses and (view is None or view.addresses != progress.addresses):
            if view is not None:
                view.close()
            view = PipelineView(dict(progress.addresses))
        header = f"[bold]{progress.phase}[/] · clients {progress.sent:,}/{progress.total:,}"
        return Group(header, view.render() if view is not None else "")

    with Live(console=console, refresh_per_second=2, transient=True) as live:

        def update(progress: campaign.Progress) -> None:
            nonlocal printed
            for text in progress.notes[printed:]:  # faults and restarts scroll above the live view
                live.console.print(f"{time.strftime('%H:%M:%S')} {text}")
            printed = len(progress.notes)
            live.update(render(progress))

        try:
            verdict = campaign.run(options, on_progress=update)
        except RuntimeError as exc:  # the run itself broke (a client gave up, a fault failed): no verdict
            console.print(f"[red]FAILED[/]: {exc}")
            raise typer.Exit(2) from None
    if view is not None:
        view.close()
    _report(console, verdict, source=options.source)
    if json_out:
        print(json.dumps(verdict.to_json(), indent=2))
    if not verdict.ok:
        raise typer.Exit(1)


def _report(console: Console, verdict: Verdict, source: bool = False) -> None:
    def count(n: int) -> str:
        return "[green]0[/]" if n == 0 else f"[red]{n:,}[/]"

    table = Table(title="exactly-once verdict", show_header=False)
    for name, value in [
        ("records produced into the source topic (each once)" if source else "records generated (all accepted by ingest)", f"{verdict.records:,}"),
        ("distinct record_ids through the gate", f"{verdict.distinct:,}"),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in verdict.faults_injected.items())),
        ("zombies' exit codes", ", ".join(map(str, verdict.zombie_exits)) or "-"),
        ("services restarted after exiting on their own", ", ".join(f"{k} {v}" for k, v in verdict.unexpected_restarts.items()) or "0"),
        ("aborted writes (ingest + gate)", f"{verdict.aborted_writes:,}"),
        ("copies dropped at the gate", f"{verdict.dropped_duplicates:,}"),
        ("ingest replays (timed-out trees)", f"{verdict.ingest_replays:,}"),
        ("records with a completed tree", f"{verdict.trees_completed:,} ({verdict.records_without_completed_tree:,} without)"),
        ("dead letters / late", f"{verdict.dlq:,} / {verdict.late:,}"),
        ("sink rows", f"{verdict.sink_rows:,} ({verdict.sink_rows_wrong:,} differ from the batch answer)"),
        ("lost", count(verdict.lost)),
        ("duplicated", count(verdict.duplicated)),
        ("unknown ids", count(verdict.unknown)),
        ("aborted reads", count(verdict.aborted_reads)),
        ("hanging transactions", count(verdict.hanging_transactions)),
        ("late re-sends (earlier batches, after faults)", f"{verdict.late_resends:,}"),
        ("stores rebuilt from Kafka (Redis, PostgreSQL)", f"{verdict.redis_repairs:,}"),
        ("drained when judged", "[green]yes[/]" if not verdict.undrained else f"[red]no[/]: {'; '.join(verdict.undrained)}"),
        ("sink matches batch", "[green]yes[/]" if verdict.sink_matches_batch else "[red]no[/]"),
        *([] if verdict.output_topic_rows < 0 else [
            ("output topic matches batch (folded, read_committed)",
             f"[green]yes[/] ({verdict.output_topic_rows:,} rows)" if verdict.output_topic_matches_batch else "[red]no[/]"),
            ("changes written to the output topic twice", count(verdict.output_duplicates)),
        ]),
        (
            "gate's Redis store matches dedup.changelog",
            "[green]yes[/]" if verdict.dedup_store_matches_changelog else f"[red]no[/] ({verdict.dedup_store_ids_wrong:,} ids)",
        ),
    ]:
        table.add_row(name, value)
    console.print(table)
    for problem, examples in verdict.examples.items():
        console.print(f"  {problem}: {', '.join(examples[:5])}")
    if verdict.ok:
        console.print("[green]ok[/]: every record took effect exactly once through every fault above.")
    else:
        console.print("[red]FAILED[/]: the run did not hold exactly once (see above).")
