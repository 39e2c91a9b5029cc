"""Follows acker.events (every partition, from the end) for the trees this instance started."""

from __future__ import annotations

import logging
import threading

from confluent_kafka import TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets
from onceflow.v1.acker_pb2 import TreeEvent

from onceflow_ingest.trees import InFlightTrees

log = logging.getLogger(__name__)


class EventWatcher:
    def __init__(self, common: CommonSettings, topic: str, trees: InFlightTrees) -> None:
        self._trees = trees
        self._stop = threading.Event()
        self._common = common
        self._topic = topic
        self._consumer = clients.reader(common, **{"enable.partition.eof": False})
        self._thread = threading.Thread(target=self._run, name="ingest-events", daemon=True)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start at each partition's end, looked up before ingest accepts anything: every event
        of a tree this instance starts lies past it. Explicit offsets, not OFFSET_END: a
        consumer's position at OFFSET_END stays unknown until a first event arrives, so waiting
        for it cost every start on a quiet topic its whole wait (15 s)."""
        stable_ends = end_offsets(self._common, self._topic, timeout_s)  # retried while leaders move
        self._consumer.assign([TopicPartition(self._topic, p, stable) for p, (stable, _high) in sorted(stable_ends.items())])
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in clients.consume_ready(self._consumer, 1000, 0.2):
                if message.error() is not None:
                    log.warning("acker.events: %s", message.error())
                    continue
                try:
                    self._trees.on_event(TreeEvent.FromString(message.value() or b""))
                except Exception:  # noqa: BLE001 - one bad event must not stop the watcher
                    log.exception("bad event at %s[%d]@%d", message.topic(), message.partition(), message.offset())
