"""Send -> visible, measured by the bench itself and not by the acker: some records of a run
are probes, each the only record of a user of its own, so its row appears in the result table
exactly when that record has been applied. A thread scans the probe rows of the run (one Scan
by key prefix, every ``interval_s``) and notes when each first shows; the latency is that time
minus the client's send time. The scan's period bounds the resolution (20 ms)."""

from __future__ import annotations

import threading
import time

from onceflow_client import QueryClient
from onceflow_tools.bench import workload

PROBE_USER_PREFIX = "probe:"


def probe_user(id_prefix: str, index: int) -> str:
    return f"{PROBE_USER_PREFIX}{id_prefix}{index}"


class VisibilityProbes(threading.Thread):
    def __init__(self, sink_address: str, id_prefix: str, expected: int, interval_s: float = 0.02) -> None:
        super().__init__(name="bench-visibility", daemon=True)
        self._address = sink_address
        self._prefix = f"{PROBE_USER_PREFIX}{id_prefix}"
        self._expected = expected
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self.visible_at_ms: dict[str, float] = {}  # probe user -> wall clock when first seen

    def run(self) -> None:
        with QueryClient(self._address) as query:
            while not self._stopping.is_set() and len(self.visible_at_ms) < self._expected:
                now = time.time() * 1000
                for key, _value in query.scan(workload.JOB, self._prefix):
                    self.visible_at_ms.setdefault(key, now)
                self._stopping.wait(self._interval_s)

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)
