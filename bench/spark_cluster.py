"""The compute hop on a Spark cluster against Spark in the worker's own process, in one run on
this machine.

Every setup runs real compute workers (``python -m onceflow_compute``, the map and merge hops)
on the same backlog of usersum envelopes, each setup under a topic prefix of its own:

- **local[2]** (the baseline): Spark in the worker's process;
- **standalone**: a master and two workers from the pyspark wheel (``onceflow_tools.infra.spark``),
  one compute worker, its executors on both;
- **standalone, 2 workers**: two compute workers, each its own application with one core
  (``spark.cores.max=1``), sharing the partitions;
- **connect**: one compute worker as a Spark Connect client of a server (driver on local[2]).

Throughput: records the map hop committed from its first commit to its last, over that time
(Spark's start-up is not in it). Per-batch engine time p50/p99: the workers' own Stats (Spark's
job time per micro-batch, scheduling included). Ratios are against local[2] from the same run.

On a 2-core machine a cluster cannot be faster: its daemons, executors and drivers share the
same two cores, and every batch pays the cluster's scheduling (task launch on an executor
process, results back over RPC). These ratios show that overhead; docs/performance.md says what
changes on real hardware.

Run: .venv/bin/python bench/spark_cluster.py [--records N] [--batch N] [--json]
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.config import CommonSettings, repo_root
from onceflow.kafka.inspect import committed_offsets, consumed_everything
from onceflow.topology import Topic
from onceflow.v1 import compute_pb2, compute_pb2_grpc
from onceflow.v1.envelope_pb2 import Envelope
from onceflow_tools.infra import spark, stack
from onceflow_tools.infra.settings import InfraSettings
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port

console = Console(width=140, stderr=True)
JOB = "usersum"
MASTER_PORT = 17477  # the bench's own cluster: a running default one is left alone


@dataclass
class Setup:
    name: str
    workers: int
    master: str
    conf: str = ""
    records_per_s: float = 0.0
    job_p50_ms: float = 0.0
    job_p99_ms: float = 0.0
    seconds: float = 0.0


def _produce(common: CommonSettings, records: int, users: int = 1_000, seed: int = 1) -> None:
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    topic = common.topic(Topic.DEDUP_RECORDS)
    for index in range(records):
        user = f"u{rng.randrange(users)}"
        envelope = Envelope(
            record_id=f"bench-{index:09d}", root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=now_ms(),
            ingest_time_ms=now_ms(), key=user.encode(),
            payload=json.dumps({"user": user, "amount": rng.randrange(1, 1000)}).encode(),
        )
        while True:
            try:
                producer.produce(topic, encode_envelope(envelope), key=user.encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _committed(common: CommonSettings, group: str) -> int:
    return sum(max(offset, 0) for offset in committed_offsets(common, group, common.topic(Topic.DEDUP_RECORDS)).values())


def _run(setup: Setup, records: int, batch: int, log_dir: Path) -> Setup:
    prefix = f"bsc{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    workers: list[ServiceProcess] = []
    ports = []
    try:
        _produce(common, records)
        for index in range(setup.workers):
            ports.append(free_port())
            env = {
                "ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_COMPUTE_JOB": JOB, "ONCEFLOW_COMPUTE_INSTANCE": f"bench-{index}",
                "ONCEFLOW_COMPUTE_PORT": str(ports[-1]), "ONCEFLOW_COMPUTE_METRICS_PORT": "0",
                "ONCEFLOW_COMPUTE_SPARK_MASTER": setup.master, "ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON": spark.executor_python(),
                "ONCEFLOW_COMPUTE_MIN_BATCH_RECORDS": str(batch), "ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS": str(batch),
            }
            if setup.conf:
                env["ONCEFLOW_COMPUTE_SPARK_CONF"] = setup.conf
            workers.append(ServiceProcess(f"{setup.name.replace(' ', '-')}-{index}", "onceflow_compute", env, log_dir, cwd=repo_root()).start())
        group = f"{prefix}onceflow-compute-{JOB}-map"
        points: list[tuple[float, int]] = []
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            done = _committed(common, group)
            if done:
                points.append((time.monotonic(), done))
            if done >= records and consumed_everything(common, group, common.topic(Topic.DEDUP_RECORDS)):
                break
            if not all(worker.alive() for worker in workers):
                raise RuntimeError(f"{setup.name}: a worker exited; see {log_dir}")
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{setup.name}: the map hop did not finish in 900 s; see {log_dir}")
        (t0, n0), (t1, n1) = points[0], points[-1]
        setup.seconds = t1 - t0
        setup.records_per_s = (n1 - n0) / max(t1 - t0, 1e-9)
        stats = [
            compute_pb2_grpc.ComputeAdminStub(grpc.insecure_channel(f"127.0.0.1:{port}")).Stats(
                compute_pb2.ComputeStatsRequest(), timeout=10
            )
            for port in ports
        ]
        setup.job_p50_ms = max(s.job_seconds_p50 for s in stats) * 1000
        setup.job_p99_ms = max(s.job_seconds_p99 for s in stats) * 1000
        return setup
    finally:
        for worker in workers:
            worker.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)


def main(
    records: int = typer.Option(60_000, help="Records in each setup's backlog."),
    batch: int = typer.Option(5_000, help="Records per micro-batch (min = max)."),
    json_out: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
) -> None:
    logging.basicConfig(level=logging.WARNING)
    stack.up()
    home = Path(tempfile.mkdtemp(prefix="onceflow-bench-spark-"))
    daemons = spark.cluster(InfraSettings(spark_master_port=MASTER_PORT, spark_workers=2), home / "cluster")
    connect = spark.ConnectServer(free_port(), "local[2]", "1g", home / "connect")
    setups = [
        Setup("local[2]", 1, "local[2]"),
        Setup("standalone", 1, daemons[0].master_url),
        Setup("standalone, 2 workers", 2, daemons[0].master_url, json.dumps({"spark.cores.max": "1"})),
        Setup("connect", 1, connect.url),
    ]
    try:
        for setup in setups:
            console.print(f"[bold]{setup.name}[/]: {setup.workers} compute worker(s) on {setup.master}, {records:,} records ...")
            if setup.master.startswith("spark://"):
                spark.up(180, daemons)
            if setup.master.startswith("sc://"):
                spark.down(daemons)  # its cores back for the Connect server's driver
                connect.up(180)
            _run(setup, records, batch, home)
            console.print(f"  {setup.records_per_s:,.0f} records/s, engine p50 {setup.job_p50_ms:.0f} ms p99 {setup.job_p99_ms:.0f} ms")
    finally:
        connect.stop()
        spark.down(daemons)
    base = setups[0]
    table = Table(title=f"compute map hop, usersum, {records:,} records, batches of {batch:,} (logs: {home})")
    for column in ("setup", "records/s", "÷ local[2]", "engine p50 ms", "÷ local[2]", "engine p99 ms", "÷ local[2]"):
        table.add_column(column, justify="left" if column == "setup" else "right")
    for setup in setups:
        table.add_row(
            setup.name, f"{setup.records_per_s:,.0f}", f"{setup.records_per_s / base.records_per_s:.2f}×",
            f"{setup.job_p50_ms:.0f}", f"{setup.job_p50_ms / base.job_p50_ms:.2f}×",
            f"{setup.job_p99_ms:.0f}", f"{setup.job_p99_ms / base.job_p99_ms:.2f}×",
        )
    two, one = setups[2], setups[1]
    Console(width=140).print(table)
    Console(width=140).print(f"2 compute workers ÷ 1 on the cluster: {two.records_per_s / one.records_per_s:.2f}× throughput")
    if json_out:
        print(json.dumps([asdict(s) for s in setups], indent=2))


if __name__ == "__main__":
    typer.run(main)
