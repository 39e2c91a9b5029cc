"""Every tree decision on ``acker.events``, as it commits: a record's client send -> COMPLETED,
the acker's view of its latency. Today a tree ends at compute's map hop (its ack has no
children; issue 20), so COMPLETED does not yet include the merge hop or the sink: the bench
measures send -> row visible separately, with probes (``visibility.py``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import partitions_of
from onceflow.topology import Topic
from onceflow.v1.acker_pb2 import TreeEvent


@dataclass(frozen=True, slots=True)
class Completion:
    decided_at_ms: int  # the acker's wall clock


class TreeLog(threading.Thread):
    def __init__(self, common: CommonSettings) -> None:
        super().__init__(name="bench-tree-log", daemon=True)
        self._common = common
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._completed: dict[str, Completion] = {}
        self.failed = 0

    def run(self) -> None:
        topic = self._common.topic(Topic.ACKER_EVENTS)
        reader = clients.reader(self._common, **{"enable.partition.eof": False})
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(self._common, topic)])
        try:
            while not self._stopping.is_set():
                for message in reader.consume(10_000, 0.2):
                    if message.error() is not None:
                        continue
                    event = TreeEvent.FromString(message.value() or b"")
                    if event.outcome != TreeEvent.COMPLETED:
                        self.failed += 1
                        continue
                    with self._lock:
                        # The first decision counts (at-least-once mode may repeat one).
                        self._completed.setdefault(event.origin.record_id, Completion(event.decided_at_ms))
        finally:
            reader.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)

    def completions(self, id_prefix: str) -> dict[str, Completion]:
        with self._lock:
            return {record_id: c for record_id, c in self._completed.items() if record_id.startswith(id_prefix)}
