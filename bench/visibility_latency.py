"""Latency to visibility on an idle pipeline: one record at a time, from the client's send to
its row readable through the sink's ``Query.Get``, polled by the bench itself (independent of
the acker). The same pipeline (ingest -> gate -> compute ``usersum`` -> sink, acker on) runs
twice in one run, each on a topic prefix of its own:

- **baseline**: every hop lingers its whole poll wait after a first record (100 ms, the map
  hop 200 ms), which is how the hops batched before ``ONCEFLOW_LOOP_LINGER_MS``;
- **default**: the shipped settings (5 ms on every hop; the map hop lingered 20 ms until 2026-11-27).

Before measuring, one-record sends 100 ms apart warm the Spark driver's JVM until the map hop
has run ``--warm-up-jobs`` Spark jobs (read from its ``onceflow_compute_job_seconds`` metric): the
JVM compiles its planner and executor code as jobs run, so its speed depends on how many jobs it
has run, not how many records (``bench/spark_job_warmup.py``). Counting jobs gives every setting
the same warm-up, however it batches. A burst of records is a few big jobs and leaves the JVM
cold; a long-running worker at light load is warm. ``--warm-up-jobs 0`` measures the cold case.
The map hop's mean Spark time per job is reported over the measured part (its records, the
five that settle it and the ``PROCESSED`` sends).

Each record has a user of its own, so its row appears exactly when it was applied. After each
one, a second record is sent with ``wait=PROCESSED`` (the acker's view: its tree completes once
its row is in Redis, docs/decisions/0016), and its row is read the moment the reply arrives.
Reported per setting: p50 and p99 of send -> visible, of ingest's reply, and of send ->
PROCESSED; how many PROCESSED replies found their row already there (all of them, or the tree
ended early); and default ÷ baseline. ``--compute KEY=VALUE`` adds a third pipeline, the default
with those compute settings (the candidate), and candidate ÷ default.

Run: .venv/bin/python bench/visibility_latency.py [--records 40] [--gap-ms 300] [--warm-up-jobs 200]
     [--compute KEY=VALUE] [--json]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc, sink_pb2, sink_pb2_grpc
from onceflow_tools.bench import histograms
from onceflow_tools.bench.pipeline import compute_settings, percentile
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import free_port
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum

console = Console(stderr=True)

JOB_SECONDS = "onceflow_compute_job_seconds"
WARM_UP_GAP_S = 0.1  # about one Spark job per record: the map hop's job takes about as long
WARM_UP_MAX_SENDS_PER_JOB = 10  # a map hop that runs no jobs is broken, not slow

SETTINGS = {
    "baseline": ({"ONCEFLOW_LOOP_LINGER_MS": "100"}, {"LINGER_MS": "200"}),
    "default": ({}, {}),
}


def _measure(
    name: str, loop_env: dict[str, str], compute_env: dict[str, str], records: int, gap_s: float, warm_up_jobs: int
) -> dict[str, float]:
    metrics = {"compute": free_port()}
    prefix = f"vis{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    supervisor = Supervisor(
        prefix, Path(tempfile.mkdtemp(prefix=f"onceflow-vis-{name}-")),
        settings={"compute": {"JOB": usersum.JOB, "METRICS_PORT": str(metrics["compute"]), **compute_env}}, env=loop_env,
    )
    try:
        console.print(f"{name}: starting the pipeline (logs in {supervisor.log_dir})")
        supervisor.start_all()
        ingest = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(supervisor.address("ingest")))
        query = sink_pb2_grpc.QueryStub(grpc.insecure_channel(supervisor.address("sink")))
        latencies, replies, processed = [], [], []
        visible_at_processed = 0

        def record(record_id: str) -> ingest_pb2.IngestRecord:
            user = f"u{record_id}"
            return ingest_pb2.IngestRecord(
                record_id=record_id.encode(), key=user.encode(), payload=json.dumps({"user": user, "amount": 1}).encode()
            )

        def visible(user: str) -> None:
            deadline = time.perf_counter() + 60
            while not query.Get(sink_pb2.GetRowRequest(job=usersum.JOB, key=user), timeout=10).found:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{name}: {user} not visible after 60 s")
                time.sleep(0.002)

        def jobs_run() -> float:
            return float(histograms.scrape(metrics, (JOB_SECONDS,)).get((JOB_SECONDS, usersum.JOB), (0.0, 0.0))[1])

        if warm_up_jobs:
            # Counted in Spark jobs, not records: a setting that lingers longer batches more
            # records per job, and would otherwise be measured on a colder JVM.
            console.print(f"{name}: warming the Spark driver with {warm_up_jobs} map-hop jobs of a record or two")
            sends = 0
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("warm-up", total=warm_up_jobs)
                while (done := jobs_run()) < warm_up_jobs:
                    if sends >= WARM_UP_MAX_SENDS_PER_JOB * warm_up_jobs:
                        raise RuntimeError(f"{name}: {sends} warm-up sends ran only {done:.0f} Spark jobs")
                    ingest.Ingest(ingest_pb2.IngestRequest(records=[record(f"{prefix}w{sends}")]), timeout=30)
                    sends += 1
                    progress.update(task, completed=done)
                    time.sleep(WARM_UP_GAP_S)
            if sends:
                visible(f"u{prefix}w{sends - 1}")
        warm = histograms.scrape(metrics, (JOB_SECONDS,))
        jobs_before = warm.get((JOB_SECONDS, usersum.JOB), (0.0, 0.0))[1]
        for index in range(-5, records):  # five more to settle (or to warm up: first Spark job, first commits)
            user = f"u{prefix}{index + 5}"
            sent = time.perf_counter()
            ingest.Ingest(ingest_pb2.IngestRequest(records=[record(f"{prefix}{index + 5}")]), timeout=30)
            replied = time.perf_counter()
            visible(user)
            if index >= 0:
                latencies.append((time.perf_counter() - sent) * 1000)
                replies.append((replied - sent) * 1000)
            time.sleep(gap_s)  # idle between records: each meets a quiet pipeline
            waited_id = f"{prefix}p{index + 5}"
            sent = time.perf_counter()
            ingest.Ingest(ingest_pb2.IngestRequest(records=[record(waited_id)], wait=ingest_pb2.WAIT_FOR_PROCESSED), timeout=60)
            done = time.perf_counter()
            found = query.Get(sink_pb2.GetRowRequest(job=usersum.JOB, key=f"u{waited_id}"), timeout=10).found
            if index >= 0:
                processed.append((done - sent) * 1000)
                visible_at_processed += found
            time.sleep(gap_s)
        jobs, reset = histograms.difference(warm, histograms.scrape(metrics, (JOB_SECONDS,)))
        if reset:
            console.print(f"[red]{name}: the compute worker's counters went back (it restarted?): no Spark time reported")
        job_seconds, job_count = jobs.get((JOB_SECONDS, usersum.JOB), (0.0, 0.0))
        job_ms = 1000 * job_seconds / job_count if job_count else 0.0
        console.print(
            f"{name}: visible p50 {statistics.median(latencies):.0f} ms, processed p50 {statistics.median(processed):.0f} ms, "
            f"Spark job {job_ms:.0f} ms on average over {job_count:.0f} jobs (before: {jobs_before:.0f} jobs)"
        )
        return {
            "visible_p50_ms": statistics.median(latencies), "visible_p99_ms": percentile(latencies, 99),
            "reply_p50_ms": statistics.median(replies), "reply_p99_ms": percentile(replies, 99),
            "processed_p50_ms": statistics.median(processed), "processed_p99_ms": percentile(processed, 99),
            "visible_at_processed": float(visible_at_processed), "records": float(records),
            "spark_job_ms": job_ms, "warm_up_jobs": jobs_before,
        }
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        delete_prefix(connect(common.redis_url), prefix)


def main(
    records: int = typer.Option(40, help="Records measured per setting (after 5 to settle)."),
    gap_ms: int = typer.Option(300, help="Idle time between one record's visibility and the next send."),
    warm_up_jobs: int = typer.Option(
        200, min=0, help="Spark jobs the map hop runs before measuring (one-record sends 100 ms apart), to warm the "
        "driver's JVM (0: cold)."
    ),
    compute: list[str] = typer.Option(
        [], help="Also measure the default with this compute setting, KEY=VALUE without the ONCEFLOW_COMPUTE_ prefix "
        "(repeatable; all of them make one more column, the candidate)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
) -> None:
    try:
        candidate = dict(compute_settings(compute))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if fixed := sorted(set(candidate) & {"JOB", "ENGINE", "METRICS_PORT"}):
        raise typer.BadParameter(f"{fixed}: this bench runs usersum on Spark and reads its own metrics port")
    settings = dict(SETTINGS)
    if candidate:
        settings["candidate"] = ({}, candidate)
    stack.up()
    results = {
        name: _measure(name, loop_env, compute_env, records, gap_ms / 1000, warm_up_jobs)
        for name, (loop_env, compute_env) in settings.items()
    }
    base, new = results["baseline"], results["default"]
    other = results.get("candidate")
    table = Table(
        title=f"send -> visible through Query.Get, idle pipeline, {records} records each, "
        f"after {warm_up_jobs} warm-up Spark jobs"
    )
    columns = ["", "baseline (linger 100/200 ms)", "default (linger 5 ms)", "default ÷ baseline"]
    if other is not None:
        columns += [f"candidate ({' '.join(f'{k}={v}' for k, v in candidate.items())})", "candidate ÷ default"]
    for column in columns:
        table.add_column(column)

    def more(key: str, ratio: bool = True) -> list[str]:
        if other is None:
            return []
        return [f"{other[key]:.0f}", f"{other[key] / new[key]:.2f}" if ratio else ""]

    for key, label in (
        ("visible_p50_ms", "visible p50, ms"), ("visible_p99_ms", "visible p99, ms"),
        ("reply_p50_ms", "ingest reply p50, ms"), ("reply_p99_ms", "ingest reply p99, ms"),
        ("processed_p50_ms", "send -> PROCESSED p50, ms"), ("processed_p99_ms", "send -> PROCESSED p99, ms"),
    ):
        table.add_row(label, f"{base[key]:.0f}", f"{new[key]:.0f}", f"{new[key] / base[key]:.2f}", *more(key))
    for key, label in (("spark_job_ms", "map hop's Spark job, mean ms"), ("warm_up_jobs", "Spark jobs run before measuring")):
        table.add_row(label, f"{base[key]:.0f}", f"{new[key]:.0f}", "", *more(key, ratio=False))
    there = {name: f"{result['visible_at_processed']:.0f} of {records}" for name, result in results.items()}
    table.add_row(
        "row there at the PROCESSED reply", there["baseline"], there["default"], "",
        *([there["candidate"], ""] if other is not None else []),
    )
    console.print(table)
    if as_json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    typer.run(main)
