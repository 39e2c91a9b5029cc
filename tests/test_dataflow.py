"""Event time on the real broker with real Spark: a windowed Nexmark query (q5's sliding-window
bid counts) over an out-of-order stream with records that are late by design, through three
kill -9s and a rebalance.

Checks:
- compute.late holds exactly the records the partition-order rule calls too late (computed here
  independently), each once, and they are exactly the generator's late-by-design events;
- the checker folds compute.results read_committed (every retraction withdraws the row in
  place, nothing is upserted twice), and once end-of-stream heartbeats push the watermark past
  everything, the folded table equals batch mode (Spark over the records that were not late)
  and a plain Python count;
- no transaction hangs."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Producer

from onceflow.codec import encode_envelope, new_id, now_ms
from onceflow.v1.envelope_pb2 import DeadLetter, Envelope
from onceflow.workloads import nexmark
from onceflow_compute.batch import run_batch, spark_engine
from onceflow_compute.dataflow.windows import Hopping
from onceflow_compute.jobs import load_job
from tests.conftest import Pipeline
from tests.harness import checker
from tests.test_compute import wait_consumed, worker

pytestmark = [pytest.mark.dataflow, pytest.mark.integration]

JOB = "nexmark_q5"
BOUND_MS = 2_000
PARTITIONS = 4
# Late by design: past the bound, the 10 s window and the 5 s allowed lateness, with margin.
CONFIG = nexmark.NexmarkConfig(
    events=12_000, rate=400, max_delay_ms=1_500, late_ratio=0.01, late_delay_ms=20_000, seed=11
)


def partition_of(event: nexmark.Event) -> int:
    return int(event.key) % PARTITIONS


def stream() -> list[nexmark.Event]:
    """The arrivals, then one heartbeat per partition far enough ahead to close every window."""
    arrivals = nexmark.arrival_order(CONFIG)
    last = max(e.time_ms for e in arrivals)
    heartbeats = []
    for partition in range(PARTITIONS):
        person_id = 10_000_000 + partition  # a person, so q5 (bids only) counts nothing of it
        fields = {"id": person_id, "date_time": last + 60_000}
        heartbeats.append(nexmark.Event(CONFIG.events + partition, "person", last + 60_000, last + 60_000, fields))
    return arrivals + heartbeats


def too_late(events: list[nexmark.Event], window: Hopping, lateness_ms: int) -> set[int]:
    """The rule, computed independently: in each partition's order, an event is too late when
    the earliest window holding it ended ``lateness_ms`` before (newest earlier event time - bound)."""
    newest: dict[int, int] = {}
    late = set()
    for e in events:
        partition = partition_of(e)
        first_end = min(w.end for w in window.assign(e.time_ms))
        if partition in newest and first_end + lateness_ms <= newest[partition] - BOUND_MS:
            late.add(e.number)
            continue
        newest[partition] = max(newest.get(partition, e.time_ms), e.time_ms)
    return late


def hot_items(events: list[nexmark.Event], window: Hopping) -> dict[str, dict]:
    """q5's counts in plain Python."""
    counts: Counter[tuple[int, int, int]] = Counter()
    for e in events:
        if e.kind == "bid":
            for w in window.assign(e.time_ms):
                counts[(e.fields["auction"], w.start, w.end)] += 1
    return {
        f"{auction}@{start}-{end}": {"auction": str(auction), "bids": n, "window_start": start, "window_end": end}
        for (auction, start, end), n in counts.items()
    }


def produce(pipe: Pipeline, events: list[nexmark.Event], chunks: int, pause_s: float) -> None:
    """Envelopes into dedup.records in arrival order, one producer, each partition in order."""
    producer = Producer({"bootstrap.servers": pipe.common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 10})
    size = max(1, len(events) // chunks)
    for start in range(0, len(events), size):
        for e in events[start : start + size]:
            envelope = Envelope(
                record_id=f"nx:{e.number}", root_id=new_id(), edge_id=new_id(), attempt=1, event_time_ms=e.time_ms,
                ingest_time_ms=now_ms(), key=e.key.encode(), payload=e.payload(),
            )
            producer.produce(pipe.topic("dedup.records"), encode_envelope(envelope), key=e.key.encode(), partition=partition_of(e))
        assert producer.flush(30) == 0
        time.sleep(pause_s)


@pytest.mark.fault
def test_sliding_windows_stay_exact_and_late_records_are_counted_through_kill9s_and_a_rebalance(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    job = load_job(JOB)
    assert isinstance(job.window, Hopping)
    events = stream()
    late = too_late(events, job.window, job.allowed_lateness_ms)
    # The generator's ground truth: only events late by design are late, and all of them that
    # the rest of the stream overtakes by more than bound + window + lateness (near its end,
    # nothing does: there it depends on the window's end, so both bounds are checked).
    last = max(e.time_ms for e in events[:-PARTITIONS])
    slack = CONFIG.late_delay_ms - BOUND_MS - job.allowed_lateness_ms
    by_design = [e for e in events if e.delay_ms == CONFIG.late_delay_ms]
    surely = {e.number for e in by_design if e.arrival_ms < last + slack - job.window.slide_ms - CONFIG.max_delay_ms}
    possibly = {e.number for e in by_design if e.arrival_ms <= last + slack}
    assert surely <= late <= possibly and 30 < len(surely), (len(surely), len(late), len(possibly))
    on_time = [e for e in events if e.number not in late]
    expected = hot_items(on_time, job.window)
    path = tmp_path / "on_time.jsonl"
    path.write_bytes(b"\n".join(e.payload() for e in on_time) + b"\n")
    engine = spark_engine(master="local[1]")
    try:
        assert run_batch(job, path, engine).table == expected  # batch mode is the same answer
    finally:
        engine.close()

    # Small map batches: each starts from the partitions' committed event time, which a restart
    # or a rebalance must restore (a late record first in a batch would slip through otherwise).
    env = {
        "ONCEFLOW_COMPUTE_WATERMARK_BOUND_MS": str(BOUND_MS),
        "ONCEFLOW_COMPUTE_MIN_BATCH_RECORDS": "50",
        "ONCEFLOW_COMPUTE_MAX_BATCH_RECORDS": "300",
    }
    body, tail = events[: -PARTITIONS - 1000], events[-PARTITIONS - 1000 :]
    sender = threading.Thread(target=produce, args=(pipeline, body, 12, 1.0), daemon=True)
    sender.start()
    workers = {"a": worker(pipeline, JOB, "a", **env).start()}
    workers["a"].wait_log("compute: assigned", 120)
    workers["b"] = worker(pipeline, JOB, "b", **env).start()  # a rebalance: b takes half
    rng = random.Random(5)
    for _ in range(3):
        time.sleep(rng.uniform(2.0, 6.0))
        name = rng.choice("ab")
        workers[name].kill9()
        workers[name] = worker(pipeline, JOB, name, **env).start()
    sender.join(180)
    assert not sender.is_alive()
    # b leaves: a restores b's panes and watermarks from the changelogs for the tail.
    workers["a"].wait_log("compute-merge: assigned", 120)
    assert workers["b"].terminate() == 0, workers["b"].log_tail()
    produce(pipeline, tail, 1, 0.0)
    wait_consumed(pipeline, JOB)

    letters = [DeadLetter.FromString(r.value) for r in checker.read_committed(pipeline.common, pipeline.topic("compute.late"))]
    late_ids = Counter(checker.record_id_of_bytes(letter.original) for letter in letters)
    assert set(late_ids) == {f"nx:{n}" for n in late} and set(late_ids.values()) == {1}
    assert all(letter.message.startswith("late: ") for letter in letters)
    assert not checker.read_committed(pipeline.common, pipeline.topic("compute.dlq"), timeout_s=5)

    def folded() -> dict[str, dict]:
        fold = checker.fold_results(checker.read_committed(pipeline.common, pipeline.topic("compute.results")), JOB)
        assert not fold.problems, fold.problems[:10]
        return {key: json.loads(row) for key, row in fold.table.items()}

    deadline = time.monotonic() + 120
    while (table := folded()) != expected and time.monotonic() < deadline:
        time.sleep(3.0)  # the last heartbeats' watermark reaches the merge tasks
    missing, extra = expected.keys() - table.keys(), table.keys() - expected.keys()
    wrong = {k for k in expected.keys() & table.keys() if table[k] != expected[k]}
    assert table == expected, (len(missing), len(extra), len(wrong), sorted(wrong)[:3], sorted(missing)[:3])
    assert len(table) > 500
    hanging = checker.hanging_transactions(
        pipeline.common, [pipeline.topic(t) for t in ("compute.partials", "compute.results", "compute.late")], wait_s=30
    )
    assert not hanging, hanging
    assert workers["a"].terminate() == 0, workers["a"].log_tail()
