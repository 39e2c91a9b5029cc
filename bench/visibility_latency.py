"""Latency to visibility on an idle pipeline: one record at a time, from the client's send to
its row readable through the sink's ``Query.Get``, polled by the bench itself (independent of
the acker). The same pipeline (ingest -> gate -> compute ``usersum`` -> sink, acker on) runs
twice in one run, each on a topic prefix of its own:

- **baseline**: every hop lingers its whole poll wait after a first record (100 ms, the map
  hop 200 ms), which is how the hops batched before ``ONCEFLOW_LOOP_LINGER_MS``;
- **default**: the shipped settings (5 ms, the map hop 20 ms).

Each record has a user of its own, so its row appears exactly when it was applied. After each
one, a second record is sent with ``wait=PROCESSED`` (the acker's view: its tree completes once
its row is in Redis, docs/decisions/0016), and its row is read the moment the reply arrives.
Reported per setting: p50 and p99 of send -> visible, of ingest's reply, and of send ->
PROCESSED; how many PROCESSED replies found their row already there (all of them, or the tree
ended early); and default ÷ baseline.

Run: .venv/bin/python bench/visibility_latency.py [--records 40] [--gap-ms 300] [--json]
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
from rich.table import Table

from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.v1 import ingest_pb2, ingest_pb2_grpc, sink_pb2, sink_pb2_grpc
from onceflow_tools.bench.pipeline import percentile
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads import usersum

console = Console(stderr=True)

SETTINGS = {
    "baseline": ({"ONCEFLOW_LOOP_LINGER_MS": "100"}, {"LINGER_MS": "200"}),
    "default": ({}, {}),
}


def _measure(name: str, records: int, gap_s: float) -> dict[str, float]:
    loop_env, compute_env = SETTINGS[name]
    prefix = f"vis{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    supervisor = Supervisor(
        prefix, Path(tempfile.mkdtemp(prefix=f"onceflow-vis-{name}-")),
        settings={"compute": {"JOB": usersum.JOB, **compute_env}}, env=loop_env,
    )
    try:
        console.print(f"{name}: starting the pipeline (logs in {supervisor.log_dir})")
        supervisor.start_all()
        ingest = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(supervisor.address("ingest")))
        query = sink_pb2_grpc.QueryStub(grpc.insecure_channel(supervisor.address("sink")))
        visible, replies, processed = [], [], []
        visible_at_processed = 0

        def record(record_id: str) -> ingest_pb2.IngestRecord:
            user = f"u{record_id}"
            return ingest_pb2.IngestRecord(
                record_id=record_id.encode(), key=user.encode(), payload=json.dumps({"user": user, "amount": 1}).encode()
            )

        for index in range(-5, records):  # five to warm up (first Spark job, first commits)
            user = f"u{prefix}{index + 5}"
            sent = time.perf_counter()
            ingest.Ingest(ingest_pb2.IngestRequest(records=[record(f"{prefix}{index + 5}")]), timeout=30)
            replied = time.perf_counter()
            deadline = sent + 60
            while not query.Get(sink_pb2.GetRowRequest(job=usersum.JOB, key=user), timeout=10).found:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{name}: {user} not visible after 60 s")
                time.sleep(0.002)
            if index >= 0:
                visible.append((time.perf_counter() - sent) * 1000)
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
        console.print(f"{name}: visible p50 {statistics.median(visible):.0f} ms, processed p50 {statistics.median(processed):.0f} ms")
        return {
            "visible_p50_ms": statistics.median(visible), "visible_p99_ms": percentile(visible, 99),
            "reply_p50_ms": statistics.median(replies), "reply_p99_ms": percentile(replies, 99),
            "processed_p50_ms": statistics.median(processed), "processed_p99_ms": percentile(processed, 99),
            "visible_at_processed": float(visible_at_processed), "records": float(records),
        }
    finally:
        supervisor.stop_all()
        delete_topics(common.kafka_bootstrap, prefix=prefix)
        delete_prefix(connect(common.redis_url), prefix)


def main(
    records: int = typer.Option(40, help="Records measured per setting (after 5 to warm up)."),
    gap_ms: int = typer.Option(300, help="Idle time between one record's visibility and the next send."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON on stdout."),
) -> None:
    stack.up()
    results = {name: _measure(name, records, gap_ms / 1000) for name in SETTINGS}
    base, new = results["baseline"], results["default"]
    table = Table(title=f"send -> visible through Query.Get, idle pipeline, {records} records each")
    for column in ("", "baseline (linger 100/200 ms)", "default (linger 5/20 ms)", "default ÷ baseline"):
        table.add_column(column)
    for key, label in (
        ("visible_p50_ms", "visible p50, ms"), ("visible_p99_ms", "visible p99, ms"),
        ("reply_p50_ms", "ingest reply p50, ms"), ("reply_p99_ms", "ingest reply p99, ms"),
        ("processed_p50_ms", "send -> PROCESSED p50, ms"), ("processed_p99_ms", "send -> PROCESSED p99, ms"),
    ):
        table.add_row(label, f"{base[key]:.0f}", f"{new[key]:.0f}", f"{new[key] / base[key]:.2f}")
    table.add_row(
        "row there at the PROCESSED reply", f"{base['visible_at_processed']:.0f} of {records}",
        f"{new['visible_at_processed']:.0f} of {records}", "",
    )
    console.print(table)
    if as_json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    typer.run(main)
