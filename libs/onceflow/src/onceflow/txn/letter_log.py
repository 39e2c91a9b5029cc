"""Dead-letter warnings rolled up (issue 45): a stage that meets a thousand bad records logs
the first of each reason whole and then one line of counts per interval, not a thousand lines.

Each letter still goes to its topic with its reason (`onceflow dlq list` counts them there);
this only decides what the log says about them."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("onceflow.txn.batch")

INTERVAL_S = 60.0


def reason_of(stage: str, error_class: str, message: str) -> str:
    """What letters are counted by: the stage, the error class and the message up to its first
    colon (``field `amount``` of "field `amount`: expected int64, got ...")."""
    head = message.split(":", 1)[0][:80]
    return f"{stage}: {error_class}: {head}"


class LetterLog:
    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._started = self._clock()
        self._seen: set[str] = set()
        self._counts: Counter[str] = Counter()

    def note(self, stage: str, error_class: str, message: str, where: str) -> None:
        """One letter: logged whole if it is the first of its reason in this interval."""
        self.flush_if_due()
        reason = reason_of(stage, error_class, message)
        with self._lock:
            first = reason not in self._seen
            self._seen.add(reason)
            self._counts[reason] += 1
        if first:
            log.warning("dead letter from %s: %s: %s (more of this reason are counted, not logged)", where, error_class, message)

    def flush_if_due(self) -> None:
        """Log the interval's counts once it has ended (the loop asks at every batch)."""
        now = self._clock()
        with self._lock:
            if now - self._started < self._interval_s:
                return
            elapsed, counts = now - self._started, self._counts
            self._started, self._seen, self._counts = now, set(), Counter()
        if sum(counts.values()) > len(counts):  # something was counted that was not logged
            summary = ", ".join(f"{reason} x{n:,}" for reason, n in counts.most_common())
            log.warning("%d dead letters in the last %.0f s: %s", sum(counts.values()), elapsed, summary)


LETTERS = LetterLog()  # one per process: every loop's batches share it
