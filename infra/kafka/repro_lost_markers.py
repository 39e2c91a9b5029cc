"""Kafka alone, no onceflow: restart a lone broker while transactions commit, then look for
partitions whose last stable offset stays below the high watermark (docs/architecture.md,
'Hanging transactions').

Four transactional producers commit one record to each of twelve partitions per transaction.
After each restart every producer moves to a new transactional.id, so a partition a lost marker
left open is never closed by the same producer writing on. The broker runs from the jars
`onceflow infra install` fetched, in a temporary home of its own, on free ports.

    .venv/bin/python infra/kafka/repro_lost_markers.py --mode graceful --restarts 20
    .venv/bin/python infra/kafka/repro_lost_markers.py --mode uncontrolled

The broker's home is kept (its server.log shows the skips) only when a partition hangs or the run failed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow_tools.infra.kafka import KafkaBroker
from onceflow_tools.process import free_port

TOPIC, PARTITIONS, PRODUCERS = "t", 12, 4
SKIPPED = "likely deleted already"


class Broker(KafkaBroker):
    uncontrolled: bool = False

    def _render_props(self) -> Path:
        props = super()._render_props()
        if self.uncontrolled:
            props.write_text(props.read_text() + "\ncontrolled.shutdown.enable=false\n")
        return props


class Writers:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.generation = 0  # bumped after each restart: every producer takes a new transactional.id
        self.commits = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(PRODUCERS)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> bool:
        """True once every producer has returned (one still in a call could leave a transaction
        open, which would look like a hang)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self, n: int) -> None:
        producer: Producer | None = None
        generation = -1
        while not self._stop.is_set():
            if generation != self.generation:
                producer, generation = None, self.generation
            try:
                if producer is None:
                    producer = Producer({
                        "bootstrap.servers": self.bootstrap, "transactional.id": f"p{n}-{generation}",
                        "transaction.timeout.ms": 10_000, "log_level": 0,
                    })
                    producer.init_transactions(60)
                producer.begin_transaction()
                for partition in range(PARTITIONS):
                    producer.produce(TOPIC, b"x" * 100, partition=partition)
                producer.commit_transaction(30)
                self.commits += 1
            except KafkaException as exc:
                try:
                    if exc.args[0].txn_requires_abort():
                        producer.abort_transaction(30)  # type: ignore[union-attr]
                    else:
                        producer = None
                except KafkaException:
                    producer = None
                time.sleep(0.05)
            except Exception:  # a writer that dies silently would leave the run without load
                logging.exception("producer %d", n)
                producer = None
                time.sleep(0.05)


def hanging(bootstrap: str) -> dict[int, tuple[int, int]]:
    """partition -> (last stable offset, high watermark), where the first stays below."""
    ends = {}
    for isolation in ("read_committed", "read_uncommitted"):
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "repro", "isolation.level": isolation})
        ends[isolation] = {p: reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
        reader.close()
    lso, hw = ends["read_committed"], ends["read_uncommitted"]
    return {p: (lso[p], hw[p]) for p in range(PARTITIONS) if lso[p] < hw[p]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("graceful", "hard", "uncontrolled"), default="graceful",
                        help="SIGTERM with a controlled shutdown, SIGKILL, or SIGTERM with controlled.shutdown.enable=false")
    parser.add_argument("--restarts", type=int, default=20)
    args = parser.parse_args()

    port = free_port(2)
    home = Path(tempfile.mkdtemp(prefix="onceflow-repro-"))
    broker = Broker(port=port, controller_port=port + 1, home=home, libs_home=KafkaBroker.from_env(secure=False).home)
    broker.uncontrolled = args.mode == "uncontrolled"
    broker.format()
    broker.start()
    stuck: dict[int, tuple[int, int]] = {}
    finished = False
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result()
        writers = Writers(broker.bootstrap)
        writers.start()
        for n in range(1, args.restarts + 1):
            time.sleep(2.5)
            if args.mode == "hard":
                broker.kill()
            else:
                broker.stop()
            broker.start()
            writers.generation += 1
            print(f"restart {n}/{args.restarts}: {writers.commits} transactions committed", flush=True)
        time.sleep(3)
        if not writers.stop():
            raise SystemExit("a producer did not return within 120 s: its open transaction would look like a hang")
        time.sleep(15)  # past the transaction timeout: anything still open now never ends
        skipped = broker.log_path.read_text(errors="replace").count(SKIPPED)
        stuck = hanging(broker.bootstrap)
        print(f"mode {args.mode}: {writers.commits} transactions, markers skipped {skipped} times, "
              f"hanging partitions (last stable offset, high watermark) {stuck or 'none'}")
        finished = True
    finally:
        broker.stop()
    if stuck or not finished:
        print(f"broker home kept: {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
