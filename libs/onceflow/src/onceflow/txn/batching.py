"""One batching policy for every hop: how much goes into one transaction, and how long to wait.

Every hop pays a fixed cost per batch (a transaction commit, for compute a Spark job), so it
batches; and every hop is on some record's path to its result, so it must not sit on a record.
The policy that does both, used by the consumer driver (the gate, compute's two hops, the acker,
the sink, the source, the replayer) and by ingest's group commit:

1. take what is already there, at once, up to the batch bound;
2. if nothing is, wait up to ``first_wait_s`` for a first item (an idle hop so stays responsive
   to pause and stop, and takes a record the moment it comes);
3. after a first item, linger up to ``linger_s`` for more, unless the bound is full (with no
   linger, a first item that was waited for still brings what came with it).

A busy hop so takes what arrived during its last commit (group commit), and its batch grows with
the rate; an idle one commits a lone record after at most the linger. With an adaptive bound
(``min_items`` > 0) the bound doubles after a full batch and halves after one under a quarter
full, between ``min_items`` and ``max_items``.

A hop whose batch cost or output does not shrink with the batch can cap how often it runs
(``min_cycle_s``): under load, when records were already waiting, step 3 lingers until that long
after the previous batch began. Compute's map hop is one: every batch is a Spark job and emits
one partial per key, so a faster cycle means smaller batches and more partials for the merge hop
and the sink to carry (docs/performance.md, "Why at-least-once ran slower").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from onceflow.config import LoopSettings

T = TypeVar("T")

# take(limit, timeout_s): up to ``limit`` items' worth, returning as soon as it has them or
# when ``timeout_s`` has passed (0: only what is there now). Consumer.consume has this shape.
Take = Callable[[int, float], Sequence[T]]


@dataclass(frozen=True)
class BatchPolicy:
    max_items: int
    min_items: int = 0
    first_wait_s: float = 0.1
    linger_s: float = 0.0
    min_cycle_s: float = 0.0

    @classmethod
    def of_loop(cls, settings: LoopSettings) -> BatchPolicy:
        return cls(
            max_items=settings.max_batch_records,
            min_items=settings.min_batch_records,
            first_wait_s=settings.max_batch_ms / 1000,
            linger_s=settings.linger_ms / 1000,
            min_cycle_s=settings.min_cycle_ms / 1000,
        )


class Batcher(Generic[T]):
    """Gathers one batch from ``take`` by the policy; ``size`` counts an item's records (a
    consumed message is one, an ingest call carries many and is never split)."""

    def __init__(
        self,
        policy: BatchPolicy,
        take: Take[T],
        size: Callable[[T], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._take = take
        self._size = size
        self._clock = clock
        self._last_start = float("-inf")
        self.bound = policy.min_items or policy.max_items

    def gather(self) -> list[T]:
        policy, bound = self.policy, self.bound
        started = self._clock()
        items = list(self._take(bound, 0))
        waited = False
        linger = policy.linger_s
        if items:
            # Records were waiting: the hop is busy, so at most one batch per cycle.
            linger = max(linger, self._last_start + policy.min_cycle_s - started)
        else:
            items = list(self._take(1, policy.first_wait_s))
            waited = bool(items)
        if items:  # an empty poll starts no cycle: the next record is not held for it
            self._last_start = started
        taken = self._count(items)
        # After a wait for one, also what came with it, even with no linger.
        if items and taken < bound and (linger > 0 or waited):
            items += self._take(bound - taken, max(linger, 0.0))
        return items

    def adapt(self, taken: int) -> None:
        """After a batch of ``taken`` records: grow under load (a full batch means more was
        waiting), shrink when idle. A fixed bound (min_items 0) stays at the maximum."""
        low, high = self.policy.min_items, self.policy.max_items
        if not low:
            return
        if taken >= self.bound:
            self.bound = min(high, self.bound * 2)
        elif taken < self.bound // 4:
            self.bound = max(low, self.bound // 2)

    def halve(self) -> None:
        """After a failed batch, with an adaptive bound: a smaller retry is cheaper to pick apart."""
        if self.policy.min_items:
            self.bound = max(self.policy.min_items, self.bound // 2)

    def _count(self, items: Sequence[T]) -> int:
        return len(items) if self._size is None else sum(self._size(item) for item in items)
