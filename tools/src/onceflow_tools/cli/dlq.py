"""`onceflow dlq ...`: list, show and follow the pipeline's dead letters. A shell over
``onceflow_client.dlq.DeadLetters``, which does the reading, decoding and filtering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings
from onceflow.topology import Topic
from onceflow_client.dlq import DLQ_TOPICS, DeadLetters, Letter, LetterFilter, reason_counts
from onceflow_tools import redrive as redrive_tool
from onceflow_tools.cli.options import full_width_console

app = typer.Typer(no_args_is_help=True, help="Dead letters: list, show, follow and re-drive them (read_committed).")
console = full_width_console()  # a pipe or a file gets every column whole

Prefix = Annotated[
    str | None, typer.Option("--prefix", help="The pipeline's topic prefix. Default: ONCEFLOW_TOPIC_PREFIX.", show_default=False)
]
Bootstrap = Annotated[
    str | None, typer.Option("--bootstrap", help="Kafka bootstrap list. Default: ONCEFLOW_KAFKA_BOOTSTRAP.", show_default=False)
]
Topics = Annotated[
    list[str] | None,
    typer.Option("--topic", "-t", help=f"A dead-letter topic to read (repeatable): {', '.join(DLQ_TOPICS)}. Default: all.",
                 show_default=False),
]
Stage = Annotated[str | None, typer.Option("--stage", help="Only letters of this stage (ingest, dedup, compute, compute-merge, sink, source, acker).")]
Job = Annotated[str | None, typer.Option("--job", help="Only letters of this compute job.")]
Reason = Annotated[str | None, typer.Option("--reason", help="Only letters whose error class or message contains this (any case).")]
RecordId = Annotated[str | None, typer.Option("--record-id", help="Only letters of this record id.")]
Stream = Annotated[str | None, typer.Option("--stream", help="Only letters of records of this stream (default: the default stream).", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


@contextmanager
def _reader(prefix: str | None, bootstrap: str | None, topics: list[str] | None) -> Iterator[DeadLetters]:
    common = CommonSettings()
    try:
        reader = DeadLetters(
            bootstrap or common.kafka_bootstrap, common.topic_prefix if prefix is None else prefix, topics or None,
            common.kafka_client_config(),
        )
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    with reader:
        yield reader


def _where(reader: DeadLetters) -> str:
    return f"{', '.join(reader.prefix + t for t in reader.partitions)}"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms else ""


def _row(letter: Letter) -> tuple[str, ...]:
    return (
        letter.topic, f"{letter.partition}@{letter.offset}", letter.stage, letter.error_class, letter.message,
        letter.record_id or "", letter.job or "", _when(letter.failed_at_ms),
    )


def _table(letters: list[Letter]) -> Table:
    table = Table(show_lines=False)
    for column in ("topic", "partition@offset", "stage", "error class", "message", "record id", "job", "failed at (UTC)"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        table.add_row(*_row(letter))
    return table


@app.command("list")
def list_(
    prefix: Prefix = None, bootstrap: Bootstrap = None, topic: Topics = None, stage: Stage = None, job: Job = None,
    reason: Reason = None, record_id: RecordId = None, stream: Stream = None,
    limit: Annotated[int, typer.Option("--limit", help="Show the newest N letters (the counts are of all); 0: all.")] = 200,
    as_json: Json = False,
) -> None:
    """Every dead letter there is now, with counts per reason, filtered by the options."""
    with _reader(prefix, bootstrap, topic) as reader:
        letters = reader.list(LetterFilter(stage, job, reason, record_id, stream))
        where, missing = _where(reader), reader.missing
    counts = reason_counts(letters).most_common()
    shown = letters[-limit:] if limit > 0 else letters
    if as_json:
        typer.echo(json.dumps({
            "topics": where.split(", "), "missing_topics": missing, "total": len(letters),
            "counts": dict(counts), "letters": [letter.to_dict() for letter in shown],
        }))
        return
    if missing:
        console.print(f"(no topic {', '.join(missing)} under this prefix: skipped)", highlight=False)
    if not letters:
        console.print(f"no dead letters in {where}", highlight=False)
        return
    console.print(f"{len(letters)} dead letter(s) in {where}", highlight=False)
    for name, count in counts:
        console.print(f"  {count:>6}  {name}", highlight=False)
    console.print(_table(shown))
    if len(shown) < len(letters):
        console.print(f"showing the newest {len(shown)} of {len(letters)} (--limit 0 for all)", highlight=False)


@app.command()
def show(
    topic: Annotated[str, typer.Argument(help=f"The dead-letter topic, without the prefix ({', '.join(DLQ_TOPICS)}).")],
    partition: Annotated[int, typer.Argument(help="Its partition.")],
    offset: Annotated[int, typer.Argument(help="The letter's offset.")],
    prefix: Prefix = None, bootstrap: Bootstrap = None, as_json: Json = False,
) -> None:
    """One dead letter whole, its original decoded where it can be."""
    if topic not in DLQ_TOPICS:
        console.print(f"[red]error:[/] not a dead-letter topic: {topic} (known: {', '.join(DLQ_TOPICS)})", highlight=False)
        raise typer.Exit(2)
    with _reader(prefix, bootstrap, [topic]) as reader:
        try:
            letter = reader.get(topic, partition, offset)
        except LookupError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None
    document = letter.to_dict()
    if as_json:
        typer.echo(json.dumps(document))
        return
    console.print_json(json.dumps(document))


@app.command()
def tail(
    prefix: Prefix = None, bootstrap: Bootstrap = None, topic: Topics = None, stage: Stage = None, job: Job = None,
    reason: Reason = None, record_id: RecordId = None, stream: Stream = None,
    most: Annotated[int | None, typer.Option("--max", help="Stop after this many letters.", show_default=False)] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop after this many seconds.", show_default=False)] = None,
    as_json: Json = False,
) -> None:
    """Follow new dead letters as they are committed, until Ctrl-C (or --max / --timeout)."""
    seen = 0
    with _reader(prefix, bootstrap, topic) as reader:
        letters = reader.tail(LetterFilter(stage, job, reason, record_id, stream), most, timeout)
        # On stderr with --json, so stdout stays one JSON document a line.
        Console(stderr=True).print(f"following {_where(reader)} (Ctrl-C to stop)", highlight=False)
        try:
            for letter in letters:
                seen += 1
                if as_json:
                    typer.echo(json.dumps(letter.to_dict()))  # one JSON document a line
                else:
                    console.print("  ".join(part for part in _row(letter) if part), highlight=False)
        except KeyboardInterrupt:
            pass
    if not as_json:
        console.print(f"{seen} new dead letter(s)" if seen else f"no new dead letters in {_where(reader)}", highlight=False)


@app.command()
def redrive(
    prefix: Prefix = None, bootstrap: Bootstrap = None, topic: Topics = None, stage: Stage = None, job: Job = None,
    reason: Reason = None, record_id: RecordId = None, stream: Stream = None,
    fix: Annotated[
        Path | None,
        typer.Option(
            "--fix", exists=True, dir_okay=False, show_default=False,
            help='JSON lines {"record_id": ..., "payload": {...}}: the corrected payloads; only those letters are re-driven.',
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be re-driven; write nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Send the chosen letters back, exactly once: a compute job's letter to that job alone,
    a gate letter to its stream; a second redrive of the same letters changes nothing
    (docs/decisions/0026)."""
    fixes = _read_fixes(fix) if fix is not None else None
    with _reader(prefix, bootstrap, topic) as reader:
        letters = reader.list(LetterFilter(stage, job, reason, record_id, stream))
        common = CommonSettings(
            kafka_bootstrap=bootstrap or CommonSettings().kafka_bootstrap, topic_prefix=reader.prefix,
        )
    if fixes is not None:
        letters = [letter for letter in letters if letter.record_id in fixes]
    chosen = redrive_tool.plan(letters, fixes, redrive_tool.redriven(common))
    for why, count in chosen.refusals().most_common():
        console.print(f"  left {count:>6}: {why}", highlight=False)
    if not chosen.records:
        console.print(f"nothing to re-drive ({len(letters)} letter(s) chosen)", highlight=False)
        raise typer.Exit(1 if letters else 0)
    for target, count in chosen.targets.most_common():
        console.print(f"  {count:>6} record(s) to {target}", highlight=False)
    if chosen.fixed:
        console.print(f"  {chosen.fixed} with a corrected payload from {fix}", highlight=False)
    if dry_run:
        console.print(f"dry run: {len(chosen.records)} record(s) would be re-driven", highlight=False)
        return
    if not yes and not typer.confirm(f"re-drive {len(chosen.records)} record(s)?"):
        raise typer.Exit(1)
    try:
        written = redrive_tool.redrive(common, chosen)
    except ValueError as exc:
        console.print(f"[red]refused:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    console.print(
        f"re-drove {written} record(s) into {common.topic(Topic.INGEST_RECORDS)}; each letter is noted in "
        f"{common.topic(Topic.DLQ_REDRIVEN)} and never re-driven again",
        highlight=False,
    )


def _read_fixes(path: Path) -> dict[str, bytes]:
    fixes: dict[str, bytes] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            record_id, payload = item["record_id"], item["payload"]
        except (ValueError, KeyError, TypeError) as exc:
            console.print(f"[red]error:[/] {path}:{number}: want {{\"record_id\": ..., \"payload\": ...}} ({exc})", highlight=False)
            raise typer.Exit(2) from None
        fixes[str(record_id)] = payload.encode() if isinstance(payload, str) else json.dumps(payload, separators=(",", ":")).encode()
    return fixes
