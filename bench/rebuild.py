"""How fast a new job version rebuilds its table from history, against the live version's rate
on the same machine (issue 38; docs/jobs.md#versions-and-bluegreen).

A history of usersum records ({"user": "u<k>", "amount": n}) is written to dedup.records of a
fresh topic prefix. Then, on the same engine (Spark by default):

- **live**: version 1 is deployed from the earliest record and promoted once caught up; then a
  fresh stream of ``--live-records`` is written as fast as the producer goes, and its rate is
  the live version's records consumed per second while it keeps up with that stream;
- **rebuild**: version 2 is deployed from the earliest record over the whole history (while
  version 1 stays up, idle): its map group's records consumed per second, from its first commit
  to its last, and the time from the deploy until a promotion is allowed (``lifecycle.lagging``
  empty: map, merge and sink all caught up).

The ratio rebuild / live is what a reprocessing costs against ordinary running. Both rates are
measured in the same run; absolute figures depend on the machine.
Run: .venv/bin/python bench/rebuild.py [--records 1000000] [--engine spark|pandas]
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import typer
from rich.console import Console

from onceflow.config import CommonSettings, repo_root
from onceflow.kafka.registry import read_registry
from onceflow.topology import COMPUTE_MAP, Topic, versioned
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow.kafka import positions
from onceflow_tools.jobs import lifecycle
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compute_throughput import produce_usersum  # noqa: E402 - the same records as the throughput bench

console = Console(width=140)
JOB = "usersum"


def consumed(common: CommonSettings, name: str) -> int:
    group = COMPUTE_MAP.group_id(common.topic_prefix, name)
    return sum(positions.group_positions(common, group, common.topic(Topic.DEDUP_RECORDS)).values())


def follow(common: CommonSettings, name: str, target: int, timeout_s: float) -> tuple[float, float]:
    """Poll the version's map group until it has consumed ``target`` records: (first time it
    moved, time it reached the target), monotonic."""
    start = consumed(common, name)
    first = None
    deadline = time.monotonic() + timeout_s
    while True:
        now = consumed(common, name)
        if first is None and now > start:
            first = time.monotonic()
        if now >= target:
            return first or time.monotonic(), time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: {now} of {target} records consumed after {timeout_s:.0f}s")
        time.sleep(0.2)


def worker(common: CommonSettings, deployed: lifecycle.Deployed, log_dir: Path, engine: str) -> ServiceProcess:
    env = {
        **deployed.env, "ONCEFLOW_TOPIC_PREFIX": common.topic_prefix, "ONCEFLOW_COMPUTE_PORT": str(free_port()),
        "ONCEFLOW_COMPUTE_ENGINE": engine,
    }
    return ServiceProcess(deployed.name, "onceflow_compute", env, log_dir, cwd=repo_root()).start()


def main(
    records: int = typer.Option(1_000_000, help="Records of history the new version rebuilds from."),
    live_records: int = typer.Option(200_000, help="Records of the fresh stream the live version keeps up with."),
    users: int = typer.Option(1_000, help="Distinct users (group keys)."),
    engine: str = typer.Option("spark", help="spark or pandas."),
    timeout_s: float = typer.Option(1_800.0, help="The longest any phase may take."),
    output: Path = typer.Option(Path("bench/results/rebuild.json")),
) -> None:
    stack.up(create_topics=False)
    prefix = f"rebuild-{uuid.uuid4().hex[:6]}."
    os.environ["ONCEFLOW_TOPIC_PREFIX"] = prefix
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    log_dir = repo_root() / ".onceflow" / "bench" / "rebuild"
    log_dir.mkdir(parents=True, exist_ok=True)
    sink_port = free_port()
    sink = pipeline_service("sink", f"127.0.0.1:{sink_port}", prefix, "bench", log_dir, ACKING="false").start()
    processes = [sink]
    try:
        console.print(f"writing {records:,} records of history to {prefix}dedup.records ...")
        produce_usersum(common, records, users, seed=1)
        v1 = lifecycle.deploy(common, JOB, start=False)
        processes.append(worker(common, v1, log_dir, engine))
        follow(common, v1.name, records, timeout_s)
        lifecycle.promote(common, JOB, 1, wait_s=timeout_s)
        console.print(f"{v1.name} built and live; writing a fresh stream of {live_records:,} records ...")
        produced_at = time.monotonic()
        produce_usersum(common, live_records, users, seed=2)
        produce_s = time.monotonic() - produced_at
        first, last = follow(common, v1.name, records + live_records, timeout_s)
        live_rate = live_records / max(1e-9, last - min(first, produced_at))

        deployed_at = time.monotonic()
        v2 = lifecycle.deploy(common, JOB, start=False)
        processes.append(worker(common, v2, log_dir, engine))
        first, last = follow(common, v2.name, records + live_records, timeout_s)
        rebuild_rate = (records + live_records) / max(1e-9, last - first)
        record = read_registry(common)[JOB]
        while lifecycle.lagging(common, record, record.versions[2]):
            if time.monotonic() - deployed_at > timeout_s:
                raise TimeoutError("v2 never caught up")
            time.sleep(0.5)
        catch_up_s = time.monotonic() - deployed_at
        result = {
            "engine": engine, "history_records": records + live_records, "live_records": live_records,
            "live_records_per_s": round(live_rate), "producer_records_per_s": round(live_records / produce_s),
            "rebuild_records_per_s": round(rebuild_rate), "rebuild_over_live": round(rebuild_rate / live_rate, 2),
            "deploy_to_promotable_s": round(catch_up_s, 1), "startup_s": round(first - deployed_at, 1),
        }
        console.print_json(json.dumps(result))
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"{versioned(JOB, 2)} rebuilt {records + live_records:,} records at {rebuild_rate:,.0f}/s, "
                      f"{rebuild_rate / live_rate:.2f}x the live version's {live_rate:,.0f}/s; promotable "
                      f"{catch_up_s:.0f}s after its deploy")
    finally:
        for process in reversed(processes):
            if process.alive():
                process.terminate(60)
        delete_topics(common.kafka_bootstrap, prefix)


if __name__ == "__main__":
    typer.run(main)
