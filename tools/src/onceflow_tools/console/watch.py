"""The console's one view of the fleet: every service asked at a steady pace, in parallel, each
within the fleet deadline. Pages and the live stream read the last answers and never wait on a
service, so one that is down or hangs shows as DOWN after the deadline and blocks nothing."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from onceflow.admin import fleet
from onceflow.admin.fleet import DOWN, SERVING, Endpoint, ServiceStatus
from onceflow.admin.tls import ClientTLS
from onceflow.v1 import acker_pb2, compute_pb2, dedup_pb2
from onceflow_tools import admin_client
from onceflow_tools.admin_client import as_dict

log = logging.getLogger(__name__)

# The pipeline's services in the order a record meets them (the acker beside them all).
PIPELINE = ("ingest", "dedup", "compute", "sink", "acker")


def read_instance(endpoint: Endpoint, tls: ClientTLS | None, deadline_s: float) -> ServiceStatus:
    """Health, Status and the service's own Stats (``extra``), all within ``deadline_s``; reads
    carry only the read token, as grpc_calls' do."""
    reads = admin_client.read_token()
    return fleet.query(endpoint, tls, deadline_s, bearer=reads, also=admin_client.STATS.get(endpoint.name))


@dataclass
class Sample:
    at: float  # wall clock, s
    in_per_s: float
    out_per_s: float


@dataclass
class ServiceSeries:
    """A service's counters summed over its instances, and the rates between reads. A restarted
    instance starts its counters at zero: a drop reads as a rate of 0, not a negative one."""

    samples: deque[Sample]
    last: tuple[float, float, float] | None = None  # (monotonic s, records in, records out)

    def add(self, records_in: float, records_out: float) -> Sample:
        now = time.monotonic()
        in_rate = out_rate = 0.0
        if self.last is not None and now > self.last[0]:
            elapsed = now - self.last[0]
            in_rate = max(0.0, (records_in - self.last[1]) / elapsed)
            out_rate = max(0.0, (records_out - self.last[2]) / elapsed)
        self.last = (now, records_in, records_out)
        sample = Sample(time.time(), in_rate, out_rate)
        self.samples.append(sample)
        return sample


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _figures(name: str, serving: list[ServiceStatus]) -> dict[str, Any]:
    """What the pipeline view shows beyond the common counters, summed over instances."""
    replies = [r.extra for r in serving]
    acker = [s for s in replies if isinstance(s, acker_pb2.AckerStatsReply)]
    dedup = [s for s in replies if isinstance(s, dedup_pb2.DedupStatsReply)]
    compute = [s for s in replies if isinstance(s, compute_pb2.ComputeStatsReply)]
    if name == "acker" and acker:
        return {
            "pending_trees": sum(s.pending for s in acker),
            "completed_trees": sum(s.completed for s in acker),
            "timed_out_trees": sum(s.timed_out for s in acker),
            "failed_trees": sum(s.failed for s in acker),
            # Percentiles don't add: the worst instance's.
            "tree_p50_ms": max(s.tree_latency_p50_ms for s in acker),
            "tree_p99_ms": max(s.tree_latency_p99_ms for s in acker),
        }
    if name == "dedup" and dedup:
        passed = sum(s.passed for s in dedup)
        dropped = sum(s.dropped for s in dedup)
        return {
            "passed": passed,
            "dropped": dropped,
            "drop_ratio": _ratio(dropped, passed + dropped),
            "fast_path_ratio": _ratio(sum(s.fast_path for s in dedup), passed),
        }
    if name == "compute" and compute:
        marks = [s.watermark_ms for s in compute if s.watermark_ms >= 0]
        return {
            "jobs": sorted({s.job for s in compute}),
            "watermark_ms": min(marks) if marks else None,
            "batch_size": max(s.batch_size for s in compute),
            "results": sum(s.results for s in compute),
        }
    if name == "ingest":
        return {"trees_in_flight": sum(r.status.gauges.get("pending", 0.0) for r in serving if r.status)}
    return {}


def node_view(name: str, readings: list[ServiceStatus], sample: Sample) -> dict[str, Any]:
    """One service as the pipeline view draws it: JSON-ready."""
    serving = [r for r in readings if r.serving]
    statuses = [r.status for r in serving if r.status is not None]
    if not readings:
        health = "UNCONFIGURED"
    elif len(serving) == len(readings):
        health = SERVING
    elif serving:
        health = "DEGRADED"
    elif all(r.endpoint.optional for r in readings):
        health = "NOT_RUNNING"  # an optional service (the Kafka source) this deployment does not run
    else:
        health = DOWN
    return {
        "name": name,
        "health": health,
        "instances_up": len(serving),
        "instances": len(readings),
        "states": sorted({s.state for s in statuses}),
        "in_per_s": round(sample.in_per_s, 1),
        "out_per_s": round(sample.out_per_s, 1),
        "lag": sum(p.lag for s in statuses for p in s.partitions),
        "committed": sum(s.transactions_committed for s in statuses),
        "aborted": sum(s.transactions_aborted for s in statuses),
        "records_in": sum(s.records_in for s in statuses),
        "records_out": sum(s.records_out for s in statuses),
        "errors": [f"{r.endpoint.address}: {r.error}" for r in readings if r.error],
        "figures": _figures(name, serving),
    }


def instance_view(reading: ServiceStatus) -> dict[str, Any]:
    return {
        "address": reading.endpoint.address,
        "health": reading.health,
        "error": reading.error,
        "status": as_dict(reading.status) if reading.status is not None else None,
        "stats": as_dict(reading.extra) if reading.extra is not None else None,
    }


@dataclass
class FleetWatch:
    """Polls ``endpoints`` every ``interval_s`` on a thread of its own (``start``/``stop``)."""

    endpoints: list[Endpoint]
    tls: ClientTLS | None = None
    interval_s: float = 1.0
    deadline_s: float = 1.5
    history: int = 300
    _series: dict[str, ServiceSeries] = field(default_factory=dict)
    _snapshot: dict[str, Any] = field(default_factory=dict)
    _readings: dict[str, list[ServiceStatus]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None

    def names(self) -> list[str]:
        configured = list(dict.fromkeys(e.name for e in self.endpoints))
        return [n for n in PIPELINE if n in configured] + [n for n in configured if n not in PIPELINE]

    def start(self) -> FleetWatch:
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.endpoints)), thread_name_prefix="console-read")
        self.poll()
        self._thread = threading.Thread(target=self._run, name="console-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.deadline_s + self.interval_s + 1)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - one bad read must not end the console's view
                log.exception("reading the fleet failed; trying again")

    def poll(self) -> dict[str, Any]:
        """Ask every instance now (in parallel, at most the deadline) and publish the result."""
        assert self._pool is not None, "start() first"
        readings = list(self._pool.map(lambda e: read_instance(e, self.tls, self.deadline_s), self.endpoints))
        by_name: dict[str, list[ServiceStatus]] = {name: [] for name in self.names()}
        for reading in readings:
            by_name[reading.endpoint.name].append(reading)
        nodes = {}
        for name, group in by_name.items():
            series = self._series.setdefault(name, ServiceSeries(deque(maxlen=self.history)))
            statuses = [r.status for r in group if r.serving and r.status is not None]
            sample = series.add(sum(s.records_in for s in statuses), sum(s.records_out for s in statuses))
            nodes[name] = node_view(name, group, sample)
        snapshot = {"at": time.time(), "nodes": nodes}
        with self._lock:
            self._snapshot = snapshot
            self._readings = by_name
        with self._changed:
            self._changed.notify_all()
        return snapshot

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot

    def service(self, name: str) -> dict[str, Any] | None:
        """A service page's data: its node, each instance's answers and its rate history."""
        with self._lock:
            if name not in self._readings:
                return None
            series = self._series[name]
            return {
                "node": self._snapshot["nodes"][name],
                "instances": [instance_view(r) for r in self._readings[name]],
                "history": [[round(s.at, 3), round(s.in_per_s, 1), round(s.out_per_s, 1)] for s in series.samples],
            }

    def wait_change(self, timeout_s: float) -> None:
        """Block until the next poll has published (or ``timeout_s``): the live stream's pace."""
        with self._changed:
            self._changed.wait(timeout_s)

    def addresses(self, name: str) -> list[str]:
        return [e.address for e in self.endpoints if e.name == name]
