"""The Kafka output sink's rate against the bare transactional copier, in the same run on the same
broker and the same backlog (issue 44: "the Kafka sink's rate against the transactional copier").

Each round writes a backlog of ``ResultChange`` records of one job (JSON rows, 20% retractions,
over 10,000 keys) into a fresh prefixed ``compute.results``, then times both contenders on it,
in an order alternating by round, each from its consumer group's first commit until it has
committed the whole backlog (startup and group join not counted), with the shared loop's batch
bounds:

- **copier**: ``onceflow_tools.bench.copier`` (``onceflow bench``'s ceiling for one hop):
  consume -> produce the records as they are -> send_offsets -> commit, into a compacted topic
  with as many partitions as ``compute.results``, as the sink's output;
- **Kafka output sink**: ``python -m onceflow_sink.kafka_output`` as deployed
  (``ONCEFLOW_SINK_KAFKA_JOB``, ``ONCEFLOW_SINK_KAFKA_TOPIC``, on the pipeline's cluster): each
  change decoded, its job checked, its row checked to be a JSON object, written as a record (or
  a tombstone) with its ``onceflow-results`` header, offsets in the same transaction.

The broker is warmed first by untimed copier runs (``onceflow bench``'s warm-up). The best and the
median of the rounds are reported, with each contender's CPU per record over its timed span.
Run: .venv/bin/python bench/kafka_sink_throughput.py [--records N] [--rounds R]   (also part of `make bench`)
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from onceflow.config import CommonSettings, repo_root
from onceflow.kafka.inspect import partitions_of
from onceflow.topology import Topic
from onceflow.v1.results_pb2 import ResultChange
from onceflow_tools.bench import hops, workload
from onceflow_tools.bench.watch import BacklogRun, GroupWatch
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import TopicSpec, ensure_topics
from onceflow_tools.process import ServiceProcess

from onceflow_sink.kafka_output import group_id
from onceflow_sink.kafka_output_config import KafkaOutputSettings

console = Console(width=160)
JOB = "bench"
CONTENDERS = ("copier", "Kafka output sink")


def _backlog(count: int, seed: int = 1) -> Iterator[tuple[bytes, bytes]]:
    """(key, ResultChange) as compute writes them to compute.results: keyed by the row key."""
    rng = random.Random(seed)
    for i in range(count):
        key = f"row-{rng.randrange(10_000)}"
        if rng.random() < 0.2:
            change = ResultChange(job=JOB, key=key, op=ResultChange.RETRACT)
        else:
            row = {"user": f"u{rng.randrange(1_000)}", "total": rng.randrange(100_000), "count": i % 1_000}
            change = ResultChange(job=JOB, key=key, value=json.dumps(row).encode(), op=ResultChange.UPSERT)
        yield key.encode(), change.SerializeToString()


def _copier(common: CommonSettings, records: int, log_dir: Path) -> BacklogRun:
    results = common.topic(Topic.COMPUTE_RESULTS)
    output = "copier.out"  # compacted, as the sink's output topic
    ensure_topics(common.kafka_bootstrap, prefix=common.topic_prefix,
                  specs=[TopicSpec(output, len(partitions_of(common, results)), compacted=True)])
    group = common.topic("copier")
    process = ServiceProcess(
        "copier", "onceflow_tools.bench.copier", {}, log_dir, cwd=repo_root(),
        args=[results, common.topic(output), group, group],
    )
    return hops.time_process(process, GroupWatch(common, group, results), records)


def _kafka_output(common: CommonSettings, records: int, log_dir: Path) -> BacklogRun:
    output = common.topic("out")  # under the prefix, so it goes with the namespace
    settings = KafkaOutputSettings(common=common, job=JOB, topic=output)
    process = ServiceProcess(
        "sink-kafka", "onceflow_sink.kafka_output",
        {"ONCEFLOW_TOPIC_PREFIX": common.topic_prefix, "ONCEFLOW_SINK_KAFKA_JOB": JOB, "ONCEFLOW_SINK_KAFKA_TOPIC": output},
        log_dir, cwd=repo_root(),
    )
    return hops.time_process(process, GroupWatch(common, group_id(settings), common.topic(Topic.COMPUTE_RESULTS)), records)


RUNNERS: dict[str, Callable[[CommonSettings, int, Path], BacklogRun]] = {
    "copier": _copier, "Kafka output sink": _kafka_output,
}


def main(
    records: int = typer.Option(200_000, help="ResultChange records per backlog."),
    rounds: int = typer.Option(5, help="Interleaved rounds; the best of each contender is reported."),
    warm_up: bool = typer.Option(True, help="Warm the broker with untimed copier runs first."),
    output: Path = typer.Option(Path("bench/results/kafka_sink_throughput.json"), help="JSON results."),
) -> None:
    stack.up(create_topics=False)
    log_dir = Path(tempfile.mkdtemp(prefix="onceflow-bench-"))
    console.print(f"service logs in {log_dir}")
    warm_rates: list[float] = []
    if warm_up:
        with console.status("warming the broker: untimed copier runs until its rate is steady"):
            warm_rates = hops.warm_broker(hops.HopOptions(records=records, warm_up_records=records, log_dir=log_dir),
                                          lambda text: console.print(text))
    runs: dict[str, list[BacklogRun]] = {name: [] for name in CONTENDERS}
    for r in range(rounds):
        order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]  # alternated, so drift hits both alike
        with hops.namespace("ksink") as common:
            with console.status(f"round {r + 1}/{rounds}: {records:,} ResultChange records into compute.results"):
                workload.write_backlog(common, common.topic(Topic.COMPUTE_RESULTS), _backlog(records))
            for name in order:
                with console.status(f"round {r + 1}/{rounds}: {name}"):
                    run = RUNNERS[name](common, records, log_dir)
                runs[name].append(run)
                console.print(f"round {r + 1}/{rounds} {name}: {run.records_per_s:,.0f} records/s")
    best = {name: max(run.records_per_s for run in values) for name, values in runs.items()}
    median = {name: statistics.median(run.records_per_s for run in values) for name, values in runs.items()}
    ratio = best["Kafka output sink"] / best["copier"]
    median_ratio = median["Kafka output sink"] / median["copier"]
    table = Table(title=f"Kafka output sink vs the transactional copier, {records:,} records, same broker, same run "
                  f"(best of {rounds}, interleaved)")
    for column in ("contender", "records/s (best)", "÷ copier", "median", "÷ copier (median)", "runs", "own CPU µs/record", "broker CPU µs/record"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for name in CONTENDERS:
        cpu = [run.cpu for run in runs[name] if run.cpu is not None]
        table.add_row(
            name, f"{best[name]:,.0f}", f"{best[name] / best['copier']:.2f}x",
            f"{median[name]:,.0f}", f"{median[name] / median['copier']:.2f}x",
            ", ".join(f"{run.records_per_s:,.0f}" for run in runs[name]),
            ", ".join(f"{c.own_us:.0f}" for c in cpu), ", ".join(f"{c.broker_us:.0f}" for c in cpu),
        )
    console.print(table)
    console.print(f"Kafka output sink ÷ copier = {ratio:.2f}x (best of each), {median_ratio:.2f}x (medians)")
    result: dict[str, Any] = {
        "records": records, "rounds": rounds, "broker_warm_up": warm_rates, "best": best, "median": median,
        "ratio_sink_vs_copier": ratio, "median_ratio_sink_vs_copier": median_ratio,
        "runs": {name: [run.records_per_s for run in values] for name, values in runs.items()},
        "cpu_us_per_record": {name: [{"own": run.cpu.own_us, "broker": run.cpu.broker_us} for run in values if run.cpu]
                              for name, values in runs.items()},
    }
    path = repo_root() / output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    console.print(f"written to {output}")


if __name__ == "__main__":
    typer.run(main)
