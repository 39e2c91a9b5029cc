"""Acker throughput (acks/s on one core), tree latency at a fixed rate, memory per pending tree.

Baselines measured in the same run, on the same broker and the same input:
- throughput: a plain read_committed consumer that only reads and decodes the same acker
  messages (the ceiling for any Python consumer of that topic);
- latency: that consumer's produce-to-consume latency at the same offered rate.

The acker runs as its real service, pinned with all its threads (librdkafka's too) to one CPU,
with its default loop settings. Senders batch as stages do: one AckerBatch record per partition
per sending transaction (--trees-per-batch).
Run: .venv/bin/python bench/acker_throughput.py [--trees N] [--rate R]
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path

import grpc
import typer
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from onceflow import acks
from onceflow.codec import new_id, now_ms
from onceflow.config import CommonSettings, repo_root
from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets, partitions_of
from onceflow.state import MemoryStore
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import AckerBatch, AckerMessage, RecordRef
from onceflow_tools import admin_client
from onceflow_tools.infra import stack
from onceflow_tools.infra.topics import delete_topics, ensure_topics
from onceflow_tools.process import ServiceProcess, free_port

from onceflow_acker.trees import Tree

console = Console(width=160)



def _tree_messages(index: int) -> tuple[AckerMessage, list[AckerMessage]]:
    """One tree: INIT for two spout edges (from the spout's transaction), then one ACK per edge
    (from a bolt's transaction): 3 acker messages."""
    root, e1, e2 = new_id(), new_id(), new_id()
    origin = RecordRef(record_id=f"bench-{index:09d}", partition=0, offset=index)
    return acks.init(root, [e1, e2], origin, attempt=1, timeout_ms=60_000), [
        acks.ack(root, e1, [], "bench"),
        acks.ack(root, e2, [], "bench"),
    ]


def _produce(
    common: CommonSettings, topic: str, trees: range, trees_per_batch: int, rate: float | None = None
) -> None:
    """As stages send them: each "transaction" of ``trees_per_batch`` trees becomes one
    AckerBatch record per partition for the INITs, then one per partition for the ACKs."""
    producer = Producer({"bootstrap.servers": common.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    partitions = len(partitions_of(common, topic))
    started = time.perf_counter()
    for first in range(trees.start, trees.stop, trees_per_batch):
        inits, later = acks.AckBuffer(partitions), acks.AckBuffer(partitions)
        for index in range(first, min(first + trees_per_batch, trees.stop)):
            init, tree_acks = _tree_messages(index)
            inits.add(init)
            for message in tree_acks:
                later.add(message)
        for buffer in (inits, later):
            for partition, value in buffer.seal():
                while True:
                    try:
                        producer.produce(topic, value, partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.05)
        producer.poll(0)
        if rate is not None:
            ahead = (first + trees_per_batch - trees.start) / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
    producer.flush(60)


def _plain_consume(common: CommonSettings, topic: str, total: int) -> tuple[float, list[float]]:
    """The baseline: read and decode ``total`` acker messages; returns (acks/s, latencies ms)."""
    from confluent_kafka import TopicPartition

    reader = clients.reader(common, **{"enable.partition.eof": False})
    reader.assign([TopicPartition(topic, p, -2) for p in partitions_of(common, topic)])
    seen, first = 0, None
    latencies: list[float] = []
    while seen < total:
        for message in reader.consume(num_messages=5000, timeout=1.0):
            if message.error():
                continue
            first = first or time.perf_counter()
            now = now_ms()
            for decoded in AckerBatch.FromString(message.value() or b"").messages:
                latencies.append(now - decoded.sent_at_ms)
                seen += 1
    elapsed = time.perf_counter() - (first or time.perf_counter())
    reader.close()
    return seen / max(elapsed, 1e-9), latencies


class _DeliveryProbe(threading.Thread):
    """The latency baseline: a plain read_committed consumer following the topic from its end
    while the latency run produces, recording produce-to-consume latency."""

    def __init__(self, common: CommonSettings, topic: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import OFFSET_END, TopicPartition

        self.latencies: list[float] = []
        self.stop = threading.Event()
        self._reader = clients.reader(common, **{"enable.partition.eof": False})
        self._reader.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions_of(common, topic)])
        for _ in range(10):  # resolve the end offsets before anything is produced
            self._reader.consume(num_messages=1, timeout=0.2)

    def run(self) -> None:
        while not self.stop.is_set():
            for message in self._reader.consume(num_messages=5000, timeout=0.2):
                if message.error() is None:
                    now = now_ms()
                    self.latencies += [now - m.sent_at_ms for m in AckerBatch.FromString(message.value() or b"").messages]
        self._reader.close()


def _pin_to_one_core(pid: int, core: int) -> None:
    """"On one core", literally: the acker and every thread it has (librdkafka's too) share
    one CPU; the broker and this bench process keep the other."""
    os.sched_setaffinity(pid, {core})
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {core})


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0.0


def _memory_per_tree(count: int = 100_000) -> float:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = MemoryStore()
    store.apply(
        {acks.root_key(new_id()): Tree(new_id(), 1, 2, i, 1, 0, True, False, f"order-{i:09d}").encode() for i in range(count)},
        checkpoint=None,
    )
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    del store
    return size / count


def main(
    trees: int = typer.Option(300_000, help="Trees for the throughput run (3 acker messages each)."),
    rate: float = typer.Option(1000.0, help="Trees/s offered in the latency run."),
    seconds: float = typer.Option(15.0, help="Duration of the latency run."),
    core: int = typer.Option(max(os.cpu_count() or 1, 1) - 1, help="The CPU the acker is pinned to."),
    trees_per_batch: int = typer.Option(100, help="Trees per sending transaction in the throughput run."),
    latency_trees_per_batch: int = typer.Option(10, help="Trees per sending transaction in the latency run."),
    output: Path = typer.Option(Path("bench/results/acker_throughput.json")),
) -> None:
    stack.up(create_topics=False)
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    common = CommonSettings(topic_prefix=prefix)
    ensure_topics(common.kafka_bootstrap, prefix=prefix)
    topic = common.topic(Topic.ACKER_ACKS)
    total = trees * 3
    port = free_port()
    acker = ServiceProcess(
        "acker", "onceflow_acker",
        {"ONCEFLOW_TOPIC_PREFIX": prefix, "ONCEFLOW_ACKER_PORT": str(port), "ONCEFLOW_ACKER_METRICS_PORT": "0"},
        Path(tempfile.mkdtemp(prefix="onceflow-bench-")), cwd=repo_root(),
    )
    result: dict[str, float] = {}
    try:
        with console.status(f"producing {total:,} acker messages"):
            _produce(common, topic, range(trees), trees_per_batch)
        with console.status("baseline: plain consumer"):
            plain_rps, _ = _plain_consume(common, topic, total)
        acker.start()
        _pin_to_one_core(acker.pid, core)
        acker.wait_healthy(f"127.0.0.1:{port}")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        first: tuple[float, int] | None = None
        with console.status("acker: deciding the backlog"):
            while True:
                stats = admin_client.acker_stats(channel, 5)
                now = time.perf_counter()
                if stats.acks_processed and first is None:
                    first = (now, stats.acks_processed)
                if stats.acks_processed >= total:
                    break
                time.sleep(0.02)
        last = (now, stats.acks_processed)
        assert first is not None and last[0] > first[0], "backlog too small to time"
        acker_rps = (last[1] - first[1]) / (last[0] - first[0])
        assert stats.completed == trees and stats.pending == 0, stats
        # Trees whose INIT and last ACK fell into different acker transactions cost a
        # changelog write and a tombstone: the main source of run-to-run spread.
        changelog = end_offsets(common, common.topic(Topic.ACKER_CHANGELOG))
        result["changelog_records"] = sum(high for _lso, high in changelog.values())
        console.print(f"acker: {acker_rps:,.0f} acks/s; {result['changelog_records']:,} changelog records written")
        result |= {"acks": total, "trees_per_batch": trees_per_batch, "acker_acks_per_s": acker_rps, "plain_consume_per_s": plain_rps,
                   "throughput_ratio": acker_rps / plain_rps}

        offered = int(rate * seconds)
        probe = _DeliveryProbe(common, topic)
        probe.start()
        with console.status(f"latency: {rate:,.0f} trees/s for {seconds:.0f}s"):
            _produce(common, topic, range(trees, trees + offered), latency_trees_per_batch, rate=rate)
            while admin_client.acker_stats(channel, 5).completed < trees + offered:
                time.sleep(0.2)
        probe.stop.set()
        probe.join(10)
        stats = admin_client.acker_stats(channel, 5)
        tail = probe.latencies
        result |= {"rate_trees_per_s": rate, "tree_latency_p50_ms": stats.tree_latency_p50_ms,
                   "tree_latency_p99_ms": stats.tree_latency_p99_ms,
                   "plain_delivery_p50_ms": _pct(tail, 0.5), "plain_delivery_p99_ms": _pct(tail, 0.99)}
        result["bytes_per_pending_tree"] = _memory_per_tree()
    finally:
        acker.terminate()
        delete_topics(common.kafka_bootstrap, prefix=prefix)

    table = Table(title="acker (one process) vs a plain read_committed consumer, same run")
    table.add_column("measure")
    table.add_column("acker", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("acks/s (backlog of %s)" % f"{total:,}", f"{result['acker_acks_per_s']:,.0f}",
                  f"{result['plain_consume_per_s']:,.0f}", f"{result['throughput_ratio']:.2f}")
    table.add_row(f"latency p50 ms at {rate:,.0f} trees/s", f"{result['tree_latency_p50_ms']:.0f}",
                  f"{result['plain_delivery_p50_ms']:.0f}", "")
    table.add_row(f"latency p99 ms at {rate:,.0f} trees/s", f"{result['tree_latency_p99_ms']:.0f}",
                  f"{result['plain_delivery_p99_ms']:.0f}", "")
    table.add_row("bytes per pending tree (store)", f"{result['bytes_per_pending_tree']:.0f}", "", "")
    console.print(table)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    typer.run(main)
