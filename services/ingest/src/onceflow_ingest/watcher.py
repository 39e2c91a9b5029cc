"""Follows acker.events (every partition, from the end) for the trees this instance started."""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import OFFSET_END, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import partitions_of
from onceflow.v1.acker_pb2 import TreeEvent

from onceflow_ingest.trees import InFlightTrees

log = logging.getLogger(__name__)


class EventWatcher:
    def __init__(self, common: CommonSettings, topic: str, trees: InFlightTrees) -> None:
        self._trees = trees
        self._stop = threading.Event()
        self._consumer = clients.reader(common, **{"enable.partition.eof": False})
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in partitions_of(common, topic)])
        self._thread = threading.Thread(target=self._run, name="ingest-events", daemon=True)

    def start(self, ready_timeout_s: float = 15.0) -> None:
        """Resolve the end offsets before ingest accepts anything, so no event is missed."""
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            self._consumer.consume(num_messages=1000, timeout=0.2)
            if all(tp.offset >= 0 for tp in self._consumer.position(self._consumer.assignment())):
                break
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is not None:
                    log.warning("acker.events: %s", message.error())
                    continue
                try:
                    self._trees.on_event(TreeEvent.FromString(message.value() or b""))
                except Exception:  # noqa: BLE001 - one bad event must not stop the watcher
                    log.exception("bad event at %s[%d]@%d", message.topic(), message.partition(), message.offset())
