"""The trees this ingest instance started and is still waiting on: the in-flight count for
backpressure, and the callers waiting for wait=PROCESSED. Fed by acker.events."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from onceflow.acks import next_root_id
from onceflow.v1.acker_pb2 import TreeEvent

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
