"""The trees a spout (ingest, the Kafka source) started and is still waiting on: the in-flight
count for backpressure (Storm's max.spout.pending), and ingest's callers waiting for
wait=PROCESSED. Fed by acker.events (:class:`EventWatcher`)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from onceflow.acks import next_root_id
from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.kafka.inspect import end_offsets
from onceflow.v1.acker_pb2 import TreeEvent

log = logging.getLogger(__name__)

_EARLY_MEMORY = 10_000


@dataclass(eq=False)
class Waiter:
    """One wait=PROCESSED call: done when every tree has a final outcome.

    ``failures``: records that took no effect and never will (a stage failed the record, and no
    earlier attempt timed out: ABORTED). ``unknown``: records whose trees timed out; they may
    still take effect (a stalled hop, a lost ack), so the caller is told to retry with the same
    record_id, never that they failed (docs/decisions/0022)."""

    remaining: int
    failures: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


class InFlightTrees:
    def __init__(self, max_attempts: int) -> None:
        self._max_attempts = max_attempts
        self._lock = threading.Lock()
        # root id -> (record id, waiter, whether an earlier attempt of it timed out)
        self._trees: dict[int, tuple[str, Waiter | None, bool]] = {}
        # Final events for trees not (yet) known here: a replay's outcome can overtake the
        # event that caused the replay when they sit in different partitions.
        self._early: OrderedDict[int, TreeEvent] = OrderedDict()
        self.completed = 0
        self.failed = 0
        self.timed_out = 0

    def __len__(self) -> int:
        return len(self._trees)

    def add(self, trees: list[tuple[int, str]], waiter: Waiter | None = None) -> None:
        with self._lock:
            for root_id, record_id in trees:
                self._trees[root_id] = (record_id, waiter, False)

    def forget(self, root_ids: list[int]) -> None:
        """Trees whose records were certainly not committed."""
        with self._lock:
            for root_id in root_ids:
                self._trees.pop(root_id, None)

    def on_event(self, event: TreeEvent) -> None:
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: TreeEvent) -> None:
        entry = self._trees.pop(event.root_id, None)
        if entry is None:
            self._early[event.root_id] = event
            while len(self._early) > _EARLY_MEMORY:
                self._early.popitem(last=False)
            return
        record_id, waiter, timed_out_before = entry
        timed_out = timed_out_before or event.outcome == TreeEvent.TIMED_OUT
        if event.outcome != TreeEvent.COMPLETED and event.attempt < self._max_attempts:
            # The replayer turns this into attempt n+1 under a root id we can derive.
            successor = next_root_id(event.root_id, event.attempt + 1)
            self._trees[successor] = (record_id, waiter, timed_out)
            early = self._early.pop(successor, None)
            if early is not None:
                self._on_event(early)
            return
        if event.outcome == TreeEvent.COMPLETED:
            self.completed += 1
        elif timed_out:
            self.timed_out += 1
        else:
            self.failed += 1
        if waiter is not None:
            if event.outcome != TreeEvent.COMPLETED:
                outcome = TreeEvent.Outcome.Name(event.outcome)
                said = f"{record_id}: {outcome} after {event.attempt} attempt(s): {event.reason}"
                (waiter.unknown if timed_out else waiter.failures).append(said)
            waiter.remaining -= 1
            if waiter.remaining <= 0:
                waiter.done.set()


class EventWatcher:
    """Follows acker.events (every partition, from the end) for the trees ``trees`` holds."""

    def __init__(self, common: CommonSettings, topic: str, trees: InFlightTrees, name: str = "ingest") -> None:
        self._trees = trees
        self._stop = threading.Event()
        self._common = common
        self._topic = topic
        self._consumer = clients.reader(common, **{"enable.partition.eof": False})
        self._thread = threading.Thread(target=self._run, name=f"{name}-events", daemon=True)

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
