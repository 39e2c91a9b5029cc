"""Exactly-once on a 3-node Kafka cluster against one broker, and how fast the pipeline recovers
from each broker fault, in one run on this machine.

- **3 brokers ÷ 1 broker**: the pipeline (usersum, exactly-once) on each topology, each on a
  stack of its own (own home and ports: a running default stack is left alone). Sustainable
  rate (a backlog as fast as ingest takes it, trees completed between 10% and 90% of it) and
  p50/p99 of client send -> tree completed, and the ratios.
- **Recovery per fault kind**, on the cluster: load offered at ``--load`` × the cluster's
  sustainable rate; after ``--pre`` seconds one fault (``onceflow_tools.verify.kafka_faults``, the
  same faults verify injects); recovery = from the fault until tree completions run at ≥ 50% of
  the pre-fault rate again for 3 s in a row (``onceflow_tools.bench.recovery``). Targets: < 15 s after
  a leader kill, < 30 s after a coordinator kill. A paused broker's figure includes its pause.

Run: .venv/bin/python bench/kafka_cluster.py [--kinds leader-kill9,...] [--json]
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from onceflow_tools.bench.pipeline import PipelineOptions, PipelineRun, completion_rate, percentile
from onceflow_tools.bench.recovery import recovery_s
from onceflow_tools.infra import stack
from onceflow_tools.infra.paths import runtime_dir
from onceflow_tools.verify import kafka_faults

console = Console(width=140, stderr=True)
# Each topology's stack: first Kafka port, its controller on +1, Redis on +9 (a cluster's nodes
# take +10 and +20).
BASE_PORT = {1: 19600, 3: 19700}
TARGETS_S = {"leader-kill9": 15.0, "coordinator-kill9": 30.0}
STACKS = runtime_dir() / "bench-stacks"  # read once: each topology then points ONCEFLOW_HOME below it


@dataclass
class Topology:
    brokers: int
    sustainable: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass
class Recovery:
    kind: str
    offered: float
    what: str = ""
    pre_rate: float = 0.0
    recovery_s: float | None = None
    target_s: float | None = None


@dataclass
class Result:
    topologies: list[Topology] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)


def _use_stack(brokers: int) -> None:
    """Point this process, and the services it starts, at the topology's own stack."""
    base = BASE_PORT[brokers]
    os.environ.update({
        "ONCEFLOW_HOME": str(STACKS / f"kafka-{brokers}"),
        "ONCEFLOW_KAFKA_BROKERS": str(brokers),
        "ONCEFLOW_KAFKA_BOOTSTRAP": ",".join(f"127.0.0.1:{base + 10 * i}" for i in range(brokers)),
        "ONCEFLOW_KAFKA_CONTROLLER_PORT": str(base + 1),
        "ONCEFLOW_REDIS_URL": f"redis://127.0.0.1:{base + 9}/0",
    })


def _recovery(run: PipelineRun, kind: str, rate: float, pre_s: float, post_s: float, seed: int) -> Recovery:
    result = Recovery(kind, rate, target_s=TARGETS_S.get(kind))
    fault: dict[str, float | str] = {}

    def inject() -> None:
        fault["at_ms"] = time.time() * 1000
        try:
            fault["what"] = kafka_faults.inject(kind, random.Random(seed), run.prefix)
        except Exception as exc:  # noqa: BLE001 - reported in the table, the run goes on
            fault["what"] = f"fault failed: {exc}"

    timer = threading.Timer(pre_s, inject)
    timer.start()
    times, _latencies = run.send(f"{kind}:", int(rate * (pre_s + post_s)), rate, faulty=True)
    timer.join()
    result.what = str(fault.get("what", ""))
    fault_ms = float(fault["at_ms"])
    result.pre_rate = sum(1 for t in times if fault_ms - 10_000 <= t < fault_ms) / 10
    result.recovery_s = recovery_s(times, fault_ms)
    kafka_faults.wait_fully_replicated(os.environ["ONCEFLOW_KAFKA_BOOTSTRAP"])  # the next fault starts from a whole cluster
    return result


def _measure(brokers: int, options: PipelineOptions, saturation: int, warm_up: int, kinds: list[str], load: float,
             pre_s: float, post_s: float, result: Result) -> None:
    _use_stack(brokers)
    console.print(f"[bold]{brokers} broker(s)[/]: starting the stack")
    stack.up()
    try:
        with PipelineRun("exactly_once", options, lambda text: console.print(f"  {text}")) as run:
            run.send("warm:", warm_up, 0)
            times, latencies = run.send("sat:", saturation, 0)
            topology = Topology(brokers, completion_rate(times), percentile(latencies, 50), percentile(latencies, 99))
            result.topologies.append(topology)
            console.print(f"  sustainable {topology.sustainable:,.0f} records/s, p50 {topology.p50_ms:.0f} ms, p99 {topology.p99_ms:.0f} ms")
            for index, kind in enumerate(kinds if brokers > 1 else []):
                console.print(f"  {kind}: offering {topology.sustainable * load:,.0f} records/s")
                recovery = _recovery(run, kind, topology.sustainable * load, pre_s, post_s, seed=index)
                result.recoveries.append(recovery)
                console.print(f"  {recovery.what}: back to half rate after {recovery.recovery_s} s")
    finally:
        stack.down()


def main(
    kinds: str = typer.Option("leader-kill9,coordinator-kill9,controller-kill9,broker-pause", help="Fault kinds to time."),
    saturation: int = typer.Option(150_000, help="Records pushed as fast as ingest takes them, per topology."),
    warm_up: int = typer.Option(20_000, help="Records through each fresh pipeline first (Spark's JIT)."),
    load: float = typer.Option(0.5, help="Offered rate during the faults, as a share of the cluster's sustainable rate."),
    pre: float = typer.Option(15.0, help="Seconds of load before each fault."),
    post: float = typer.Option(60.0, help="Seconds of load after each fault starts."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
    output: Path = typer.Option(Path("bench/results/kafka_cluster.json")),
) -> None:
    logging.basicConfig(level=logging.WARNING)
    chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    if unknown := set(chosen) - set(kafka_faults.CLUSTER_KINDS):
        raise typer.BadParameter(f"unknown kinds {sorted(unknown)}; known: {', '.join(kafka_faults.CLUSTER_KINDS)}")
    options = PipelineOptions(log_dir=Path(tempfile.mkdtemp(prefix="onceflow-bench-cluster-")))
    console.print(f"service logs in {options.log_dir}")
    result = Result()
    for brokers in (1, 3):
        _measure(brokers, options, saturation, warm_up, chosen, load, pre, post, result)

    one, three = result.topologies
    table = Table(title="exactly-once pipeline: 3 brokers ÷ 1 broker (same run)")
    for column in ("", "1 broker", "3 brokers", "3 ÷ 1"):
        table.add_column(column, justify="right")
    table.add_row("sustainable, records/s", f"{one.sustainable:,.0f}", f"{three.sustainable:,.0f}", f"{three.sustainable / one.sustainable:.2f}")
    table.add_row("p50, ms (saturated)", f"{one.p50_ms:.0f}", f"{three.p50_ms:.0f}", f"{three.p50_ms / one.p50_ms:.2f}")
    table.add_row("p99, ms (saturated)", f"{one.p99_ms:.0f}", f"{three.p99_ms:.0f}", f"{three.p99_ms / one.p99_ms:.2f}")
    console.print(table)
    faults = Table(title="recovery: from the fault until trees complete at ≥ 50% of the pre-fault rate for 3 s")
    for column in ("kind", "what", "pre-fault trees/s", "recovery", "target"):
        faults.add_column(column)
    for r in result.recoveries:
        back = "never" if r.recovery_s is None else f"{r.recovery_s:.0f} s"
        faults.add_row(r.kind, r.what, f"{r.pre_rate:,.0f}", back, f"< {r.target_s:.0f} s" if r.target_s else "")
    console.print(faults)

    figures = asdict(result) | {
        "ratios": {
            "sustainable": three.sustainable / one.sustainable,
            "p50": three.p50_ms / one.p50_ms,
            "p99": three.p99_ms / one.p99_ms,
        }
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(figures, indent=2))
    if json_out:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    typer.run(main)
