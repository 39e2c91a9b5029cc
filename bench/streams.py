"""One job's rate while another stream carries 10x its traffic, against the same job alone, and
against the layout before named streams (issue 45 item 1; docs/decisions/0025-named-streams.md).

The job is the built-in ``usersum`` (the default stream, ``dedup.records``); its records are
usersum envelopes ({"user": "u<k>", "amount": n}, Kafka key = user). The other traffic is
envelopes of another schema ({"payer": "p<k>", "cents": n}, key = payer). Every scenario runs on
a fresh topic prefix (its topics deleted after), with the same engine (Spark by default), and
writes all its records straight into the stream topics (as the gate would; ingest and the gate
are not what is measured) before one usersum worker starts from the earliest record:

- **alone**: N usersum records in ``dedup.records``;
- **beside a 10x stream**: the same N, and 10N other records (``Envelope.stream = "other"``) in
  ``dedup.records.other``, a stream made by ``onceflow.streams.create``; the job must not read
  that topic at all (its map group's committed offsets there are checked);
- **one shared topic** (the layout before streams): N usersum records and 10N other records
  interleaved (one usersum, then ten others) in ``dedup.records``; the job reads all 11N and the
  other records become dead letters in ``compute.dlq``.

Per scenario, the job's map group's committed offsets are polled until it has consumed its whole
input topic (all N of its records, and in the shared topic the 10N others around them):

- seconds done: from the worker's start (JVM and group join included) until then;
- usersum records/s: the records the group consumed after its first commit was seen, over the
  time from that commit to done, times the usersum share of what it read (1, or N / 11N in the
  shared topic). The first commit is left out because it also pays the start.

The ratio to "alone" (same run, same machine) is what the other traffic costs the job; absolute
figures depend on the machine. A few thousand records are read in a batch or two: a check that
the bench runs, not a rate (seconds done is the figure to look at then).
Run: .venv/bin/python bench/streams.py [--records 100000] [--engine spark|pandas]
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow import streams
from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings, runtime_dir
from onceflow.kafka import positions
from onceflow.kafka.inspect import committed_offsets
from onceflow.topology import COMPUTE_MAP, Topic
from onceflow.v1.envelope_pb2 import Envelope
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compute_throughput import usersum_payload  # noqa: E402 - the same usersum records as the throughput bench

console = Console(width=140)
JOB = "usersum"
OTHER = "other"
PROGRESS_S = 10.0  # seconds between progress lines while waiting
SCENARIOS = {
    "alone": "alone",
    "beside": "beside a {ratio}x stream",
    "shared": "one shared topic (before streams)",
}


def _envelope(record_id: str, key: str, payload: bytes, stream: str) -> Envelope:
    stamp = now_ms()
    return Envelope(
        record_id=record_id, root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=stamp,
        ingest_time_ms=stamp, key=key.encode(), payload=payload, stream=stream,
    )


def usersum_envelopes(count: int, users: int, seed: int = 1) -> Iterator[Envelope]:
    rng = random.Random(seed)
    for index in range(count):
        user, payload = usersum_payload(rng, users)
        yield _envelope(f"bench-{index:09d}", user, payload, "")


def other_envelopes(count: int, payers: int, stream: str, seed: int = 2) -> Iterator[Envelope]:
    """Records of another schema: usersum finds its required ``user`` missing in every one."""
    rng = random.Random(seed)
    for index in range(count):
        payer = f"p{rng.randrange(payers)}"
        payload = json.dumps({"payer": payer, "cents": rng.randrange(1, 100_000)}).encode()
        yield _envelope(f"other-{index:09d}", payer, payload, stream)


def interleaved(ours: Iterator[Envelope], others: Iterator[Envelope], ratio: int) -> Iterator[Envelope]:
    """One of ours, then ``ratio`` others, and so on; what is left of either at the end."""
    for envelope in ours:
        yield envelope
        for _ in range(ratio):
            other = next(others, None)
            if other is None:
                break
            yield other
    yield from others


def write(common: CommonSettings, topic: str, envelopes: Iterable[Envelope], total: int, label: str) -> float:
    """Every envelope into ``topic`` (before the prefix), keyed by its key, as fast as the
    producer goes, with a progress line every few seconds; returns the records/s."""
    name = common.topic(topic)
    failed: list[str] = []

    def delivered(err: object, _message: object) -> None:
        if err is not None:
            failed.append(str(err))

    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    started = last = time.monotonic()
    written = 0
    for envelope in envelopes:
        while True:
            try:
                producer.produce(name, encode_envelope(envelope), key=envelope.key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        written += 1
        if written % 10_000 == 0:
            producer.poll(0)
            now = time.monotonic()
            if now - last >= 5.0:
                last = now
                console.print(f"  {label}: {written:,} of {total:,} written to {name} ({written / (now - started):,.0f}/s)")
    left = producer.flush(120)
    if left or failed:
        raise RuntimeError(f"{name}: {left} records undelivered, {len(failed)} failed ({failed[:3]})")
    took = time.monotonic() - started
    console.print(f"  {label}: {written:,} records written to {name} in {took:.1f}s ({written / max(took, 1e-9):,.0f}/s)")
    return written / max(took, 1e-9)


def consumed(common: CommonSettings, group: str, topic: str) -> int:
    """Records of ``topic`` (before the prefix) the group has consumed (its next offsets: the
    bench's producer writes no transaction markers, so offsets count records)."""
    return sum(positions.group_positions(common, group, common.topic(topic)).values())


@dataclass(frozen=True)
class Followed:
    first: float  # monotonic: when the group was first seen to have moved
    first_count: int  # what it had consumed then
    done: float  # monotonic: when it had consumed the target


def follow(
    common: CommonSettings, group: str, topic: str, target: int, timeout_s: float, process: ServiceProcess, label: str,
) -> Followed:
    """Poll the group until it has consumed ``target`` records of ``topic``, with a progress
    line every PROGRESS_S."""
    start = consumed(common, group, topic)
    first: float | None = None
    first_count = start
    began = last = time.monotonic()
    while True:
        now = consumed(common, group, topic)
        at = time.monotonic()
        if first is None and now > start:
            first, first_count = at, now
        if now >= target:
            return Followed(first if first is not None else at, first_count, at)
        if not process.alive():
            raise RuntimeError(f"{process.name} exited with {process.returncode}\n{process.log_tail()}")
        if at - began > timeout_s:
            raise TimeoutError(f"{label}: {now:,} of {target:,} records consumed after {timeout_s:.0f}s")
        if at - last >= PROGRESS_S:
            last = at
            moving = f", {(now - first_count) / (at - first):,.0f}/s since its first commit" if first is not None and at > first else ""
            console.print(f"  {label}: {now:,} of {target:,} records of {common.topic(topic)} consumed after {at - began:.0f}s{moving}")
        time.sleep(0.1)


def worker(common: CommonSettings, log_dir: Path, engine: str, scenario: str) -> ServiceProcess:
    """A usersum worker (map and merge hops) on the scenario's prefix."""
    return pipeline_service(
        "compute", f"127.0.0.1:{free_port()}", common.topic_prefix, "bench", log_dir,
        log_name=f"compute-{scenario}", JOB=JOB, ENGINE=engine,
    ).start()


def dead_letters(common: CommonSettings) -> tuple[int, bool]:
    """Committed records in compute.dlq: counted up to positions.COUNT_EXACTLY_UP_TO; beyond, its
    offsets (False), a little over the count (every transaction leaves a marker per partition)."""
    topic = common.topic(Topic.COMPUTE_DLQ)
    behind = positions.behind(common, topic, {}, positions.stable_ends(common, topic))
    return behind.records, behind.exact


def run(scenario: str, records: int, ratio: int, users: int, engine: str, timeout_s: float, log_dir: Path) -> dict[str, Any]:
    label = SCENARIOS[scenario].format(ratio=ratio)
    prefix = f"streams-{scenario}-{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    console.rule(f"{label}: prefix {prefix}")
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    others = records * ratio
    default_topic, other_topic = streams.topic_of(streams.DEFAULT), streams.topic_of(OTHER)
    group = COMPUTE_MAP.group_id(prefix, JOB)
    process: ServiceProcess | None = None
    try:
        if scenario == "shared":
            mixed = interleaved(usersum_envelopes(records, users), other_envelopes(others, users, ""), ratio)
            write(common, default_topic, mixed, records + others, label)
            target = records + others
        else:
            write(common, default_topic, usersum_envelopes(records, users), records, label)
            target = records
        if scenario == "beside":
            assert streams.create(common, OTHER), f"stream {OTHER} already there on a fresh prefix"
            write(common, other_topic, other_envelopes(others, users, OTHER), others, label)

        console.print(f"  {label}: starting the {JOB} worker ({engine}); it reads {common.topic(default_topic)} from the earliest")
        started = time.monotonic()
        process = worker(common, log_dir, engine, scenario)
        followed = follow(common, group, default_topic, target, timeout_s, process, label)
        read_other = 0
        if scenario == "beside":
            read_other = sum(o for o in committed_offsets(common, group, common.topic(other_topic)).values() if o >= 0)
        read = target + read_other
        said = f"job {JOB} reads "  # the worker's own account (its log is appended to across runs: this prefix's)
        reads = next((line.split(" reads ", 1)[1] for line in process.log_path.read_text(errors="replace").splitlines()
                      if said in line and common.topic(default_topic) in line), None)
        if reads:
            console.print(f"  {label}: the worker said it reads {reads}")
    finally:
        if process is not None and process.alive():
            try:
                process.terminate(60)
            except AssertionError as exc:
                console.print(f"  {label}: [yellow]{exc}[/yellow]")
    try:
        letters, exact = dead_letters(common)
    finally:
        delete_topics(common.kafka_bootstrap, prefix)

    timed = target - followed.first_count
    seconds = followed.done - followed.first
    rate = timed / seconds * records / target if timed > 0 and seconds > 0 else None
    result = {
        "scenario": scenario, "label": label, "records_read": read, "records_read_of_other_stream": read_other,
        "usersum_records": records, "other_records": 0 if scenario == "alone" else others,
        "startup_s": round(followed.first - started, 1), "done_s": round(followed.done - started, 1),
        "timed_records": timed, "timed_s": round(seconds, 2),
        "usersum_records_per_s": round(rate) if rate is not None else None,
        "dead_letters": letters, "dead_letters_exact": exact,
    }
    shown = f"{rate:,.0f} usersum records/s" if rate is not None else "usersum records/s not timed (all read by the first commit seen)"
    console.print(
        f"  {label}: {read:,} records read, done {result['done_s']}s after the worker's start "
        f"(first commit after {result['startup_s']}s), {shown}, {'' if exact else '~'}{letters:,} dead letters"
    )
    return result


def main(
    records: int = typer.Option(100_000, help="usersum records (N); the other stream carries ratio x N."),
    ratio: int = typer.Option(10, help="The other stream's records per usersum record."),
    users: int = typer.Option(1_000, help="Distinct users (usersum's group keys), and distinct payers."),
    engine: str = typer.Option("spark", help="spark or pandas."),
    timeout_s: float = typer.Option(3_600.0, help="The longest a worker may take over one scenario's records."),
    output: Path = typer.Option(Path("bench/results/streams.json")),
) -> None:
    stack.up(create_topics=False)
    log_dir = runtime_dir() / "bench" / "streams"
    log_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"{JOB} on {engine}: {records:,} records of its own, {records * ratio:,} of another schema; worker logs in {log_dir}")
    results = [run(scenario, records, ratio, users, engine, timeout_s, log_dir) for scenario in SCENARIOS]

    alone = results[0]["usersum_records_per_s"]
    table = Table(title=f"{JOB} ({engine}), {records:,} records of its own, beside {records * ratio:,} of another stream")
    for column in ("scenario", "records the job read", "seconds until its N done", "usersum records/s", "ratio to alone", "dead letters"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    for result in results:
        rate = result["usersum_records_per_s"]
        result["ratio_to_alone"] = round(rate / alone, 2) if rate and alone else None
        table.add_row(
            result["label"], f"{result['records_read']:,}", f"{result['done_s']:.1f}",
            f"{rate:,}" if rate is not None else "-",
            f"{result['ratio_to_alone']:.2f}x" if result["ratio_to_alone"] is not None else "-",
            f"{'' if result['dead_letters_exact'] else '~'}{result['dead_letters']:,}",
        )
    console.print(table)
    summary = {"job": JOB, "engine": engine, "records": records, "ratio": ratio, "users": users, "scenarios": results}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {output}")


if __name__ == "__main__":
    typer.run(main)
