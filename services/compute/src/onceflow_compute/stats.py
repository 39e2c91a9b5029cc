"""What a worker counts about its job, for Stats, Status gauges and metrics."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

JOB_SECONDS = Histogram(
    "onceflow_compute_job_seconds",
    "Engine (Spark) time per micro-batch",
    ["job", "engine"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
RESULTS = Counter("onceflow_compute_results_total", "Result changes committed (+ and -)", ["job"])
BATCH_BOUND = Gauge("onceflow_compute_batch_bound_records", "The adaptive micro-batch bound", ["job"])
LATE = Counter("onceflow_compute_late_total", "Records beyond a windowed job's allowed lateness, sent to compute.late", ["job"])
KEYS = Gauge("onceflow_compute_keys_in_state", "Keys in the owned partitions' state", ["job"])
WATERMARK = Gauge("onceflow_compute_watermark_ms", "The worker's event-time watermark (ms since the epoch; NaN until known)", ["job"])

_WINDOW_S = 60.0


@dataclass
class JobCounts:
    records_in: int = 0
    dead_letters: int = 0
    late: int = 0
    results: int = 0
    batches: int = 0
    _timings: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    _recent: deque[tuple[float, int]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def batch_committed(self, records: int, job_seconds: float | None, dead_letters: int, results: int, late: int = 0) -> None:
        now = time.monotonic()
        with self._lock:
            self.records_in += records
            self.dead_letters += dead_letters
            self.late += late
            self.results += results
            self.batches += 1
            if job_seconds is not None:
                self._timings.append(job_seconds)
            self._recent.append((now, records))
            while self._recent and now - self._recent[0][0] > _WINDOW_S:
                self._recent.popleft()

    def job_seconds(self, quantile: float) -> float:
        with self._lock:
            timings = sorted(self._timings)
        if not timings:
            return 0.0
        return timings[min(len(timings) - 1, int(quantile * len(timings)))]

    def rates(self) -> tuple[float, float]:
        """(batches/s, records/s) over the last minute."""
        with self._lock:
            recent = list(self._recent)
        if len(recent) < 2:
            return 0.0, 0.0
        span = max(recent[-1][0] - recent[0][0], 1e-3)
        return (len(recent) - 1) / span, sum(r for _t, r in recent[1:]) / span
