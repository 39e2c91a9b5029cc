"""`onceflow stream ...`: the pipeline's named streams (docs/decisions/0025). A stream exists
once its topic does, and only an operator creates one: a misspelt name in a client or a job is
refused, never a new stream."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from confluent_kafka import KafkaException
from rich.table import Table

from onceflow import readers, streams
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets
from onceflow.kafka.positions import low_watermarks
from onceflow_tools.cli.options import full_width_console

app = typer.Typer(no_args_is_help=True, help="Named streams: create and list them, and see which jobs read them.")
console = full_width_console()


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="The stream's name: 1 to 100 of A-Z, a-z, 0-9, '_' and '-'.")],
) -> None:
    """Create stream NAME (its topic, declared as dedup.records is); a stream that exists is left as it is."""
    common = CommonSettings()
    try:
        streams.check_stream_name(name)
    except ValueError as exc:
        console.print(f"[red]refused:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    try:
        created = streams.create(common, name, common.history_retention_ms)
    except (KafkaException, TimeoutError) as exc:
        console.print(f"[red]error:[/] the broker at {common.kafka_bootstrap}: {exc}", highlight=False)
        raise typer.Exit(1) from None
    topic = common.topic(streams.topic_of(name))
    console.print(f"stream {streams.display(name)}: {'created' if created else 'exists'} ({topic})", highlight=False)


@app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False) -> None:
    """Every stream of the pipeline (ONCEFLOW_TOPIC_PREFIX): its topic, partitions and how many
    records it holds (offsets retained, transaction markers included)."""
    common = CommonSettings()
    admin = clients.admin(common)
    try:
        topics = admin.list_topics(timeout=10).topics
    except KafkaException as exc:
        console.print(f"[red]error:[/] the broker at {common.kafka_bootstrap}: {exc}", highlight=False)
        raise typer.Exit(1) from None
    rows = []
    for topic in sorted(topics):
        if not topic.startswith(common.topic_prefix):
            continue
        name = streams.stream_of_topic(topic[len(common.topic_prefix) :])
        if name is None:
            continue
        lows = low_watermarks(common, topic)
        held = sum(high - lows.get(p, 0) for p, (_lso, high) in end_offsets(common, topic).items())
        rows.append({"stream": name, "topic": topic, "partitions": len(topics[topic].partitions), "offsets": held})
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("stream", "topic", "partitions", "offsets held")
    for row in rows:
        table.add_row(str(row["stream"]), str(row["topic"]), str(row["partitions"]), f"{row['offsets']:,}")
    console.print(table)
    if not rows:
        console.print(f"no streams under prefix {common.topic_prefix!r}: run `onceflow infra topics`", highlight=False)


@app.command("readers")
def readers_(
    forget: Annotated[
        str, typer.Option("--forget", metavar="JOB", help="Remove JOB (as it runs: `job` or `job@n`) from the stream's readers, for good.")
    ] = "",
    stream: Annotated[str, typer.Option("--stream", help="With --forget: the stream JOB read.")] = streams.DEFAULT,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Which jobs read which stream (docs/decisions/0028): a record's tree ends once each has
    processed it. A worker says so at start and unsays it on a clean stop; a job whose workers
    were killed and will never come back keeps its records' trees waiting until they time out:
    --forget removes it."""
    common = CommonSettings()
    try:
        if forget:
            removed = readers.forget(common, stream, forget)
            console.print(f"stream {streams.display(stream)}: {removed} worker(s) of {forget} forgotten", highlight=False)
            if not removed:
                raise typer.Exit(1)
            return
        entries = readers.read_readers(common)
    except (KafkaException, RuntimeError) as exc:
        console.print(f"[red]error:[/] {readers.readers_topic(common)} at {common.kafka_bootstrap}: {exc}", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps([{"stream": streams.display(r.stream), "job": r.job, "instance": r.instance, "since_ms": r.since_ms} for r in entries]))
        return
    if not entries:
        console.print("no job reads any stream (a compute worker says so when it starts)", highlight=False)
        return
    table = Table("stream", "job", "instance", "since")
    for entry in entries:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.since_ms / 1000)) if entry.since_ms else "-"
        table.add_row(streams.display(entry.stream), entry.job, entry.instance, since)
    console.print(table)
