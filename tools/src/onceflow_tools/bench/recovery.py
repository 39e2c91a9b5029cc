"""How long a fault stalls the pipeline, from tree completion times alone: the time from the
fault until completions run at half their pre-fault rate again, and stay there."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Completions per second before the fault are averaged over this long (its first seconds, the
# load still ramping up, are left out by the caller's choice of when to fault).
PRE_WINDOW_S = 10.0
# "Again" means for this many consecutive seconds, so one lucky second does not count.
HOLD_S = 3


def recovery_s(completed_ms: Sequence[float], fault_ms: float, threshold: float = 0.5) -> float | None:
    """Seconds from ``fault_ms`` to the start of the first ``HOLD_S`` one-second buckets that
    each saw at least ``threshold`` × the pre-fault completion rate; 0 if the rate never fell
    that low; None if it never came back (or there was no pre-fault rate to compare with)."""
    pre = sum(1 for t in completed_ms if fault_ms - PRE_WINDOW_S * 1000 <= t < fault_ms)
    pre_rate = pre / PRE_WINDOW_S
    after = [t for t in completed_ms if t >= fault_ms]
    if pre_rate <= 0 or not after:
        return None
    buckets = [0] * (math.floor((max(after) - fault_ms) / 1000) + 1)
    for t in after:
        buckets[math.floor((t - fault_ms) / 1000)] += 1
    # The last bucket is partial (the load stopped within it): it is not judged.
    full = buckets[:-1]
    for start in range(len(full) - HOLD_S + 1):
        if all(count >= threshold * pre_rate for count in full[start : start + HOLD_S]):
            return float(start)
    return None
