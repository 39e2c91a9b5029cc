"""The whole pipeline end to end, in one processing guarantee: ingest -> gate -> compute
(``usersum``, a keyed count and sum) -> sink, with the acker tracking every record.

- **Sustainable rate**: a backlog pushed through ingest as fast as the clients can; the rate at
  which trees complete between 10% and 90% of it (so neither the start nor the tail counts).
  Meanwhile each service's own rate: what its consumer group committed per second while busy.
- **Latency sweep**: records offered at fixed rates for a few seconds each, two figures from the
  same run: per record, client send -> its tree COMPLETED (the acker's view; today a tree ends
  at compute's map hop, issue 20), and, for one record in ``PROBE_EVERY``, client send -> its row
  visible through Query, polled by the bench itself (``bench/visibility.py``)."""

from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from onceflow.config import CommonSettings
from onceflow.redis_client import connect, delete_prefix
from onceflow.v1 import admin_pb2, admin_pb2_grpc
from onceflow_tools.bench import workload
from onceflow_tools.bench.trees import TreeLog
from onceflow_tools.bench.visibility import VisibilityProbes, probe_user
from onceflow_tools.infra.topics import delete_topics, provision
from onceflow_tools.verify.supervisor import Supervisor
from onceflow_tools.workloads.senders import Senders

log = logging.getLogger(__name__)

GUARANTEES = ("exactly_once", "at_least_once")
# One record in this many of a sweep step is a visibility probe (a user of its own).
PROBE_EVERY = 50


@dataclass(frozen=True)
class PipelineOptions:
    saturation_records: int = 150_000
    warm_up_records: int = 20_000
    step_s: float = 15.0
    users: int = 1_000
    # Each client sends a batch, waits for its commit, sends the next: enough of them, with
    # enough records in flight, that ingest's commits and not the clients' round trips bound
    # what enters the pipeline (4 × 100 capped the exactly-once pipeline at half its rate).
    clients: int = 8
    batch: int = 250
    drain_timeout_s: float = 180.0
    log_dir: Path = Path(".")
    # More ONCEFLOW_COMPUTE_* settings, without the prefix (ENGINE=pandas for a baseline).
    compute: tuple[tuple[str, str], ...] = ()


@dataclass
class RatePoint:
    offered: float
    achieved: float
    records: int
    p50_ms: float  # client send -> tree COMPLETED
    p99_ms: float
    # Client send -> the row visible through Query.Get/Scan, over the step's probes.
    visible_p50_ms: float = 0.0
    visible_p99_ms: float = 0.0
    probes: int = 0


@dataclass
class ModeResult:
    guarantee: str
    sustainable: float = 0.0
    saturation_p50_ms: float = 0.0
    saturation_p99_ms: float = 0.0
    # Per service: pipeline records per second while it had work during the saturation run.
    services: dict[str, float] = field(default_factory=dict)
    sweep: list[RatePoint] = field(default_factory=list)
    failed_trees: int = 0


class PipelineRun:
    """One pipeline in one guarantee, on a topic prefix of its own."""

    def __init__(self, guarantee: str, options: PipelineOptions, note: Callable[[str], None]) -> None:
        self.guarantee, self.options, self.note = guarantee, options, note
        self.prefix = f"bench{uuid.uuid4().hex[:6]}{guarantee.split('_')[0]}."
        self.common = CommonSettings(topic_prefix=self.prefix)
        self.supervisor = Supervisor(
            self.prefix, options.log_dir, settings={"compute": {"JOB": workload.JOB, **dict(options.compute)}},
            env={"ONCEFLOW_PROCESSING_GUARANTEE": guarantee, "ONCEFLOW_ALLOW_TEST_SWITCHES": "1"},
        )
        self.trees = TreeLog(self.common)
        self.visible_latencies: list[float] = []  # the last send's probes, ms

    def __enter__(self) -> PipelineRun:
        provision(self.common.kafka_bootstrap, prefix=self.prefix)
        self.note(f"{self.guarantee}: starting the five services")
        try:
            self.supervisor.start_all()
        except BaseException:
            self.__exit__()
            raise
        self.trees.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.trees.is_alive():
            self.trees.stop()
        self.supervisor.stop_all()
        delete_topics(self.common.kafka_bootstrap, prefix=self.prefix)
        delete_prefix(connect(self.common.redis_url), self.prefix)

    def send(
        self, id_prefix: str, count: int, rate: float, faulty: bool = False, probe_every: int = 0
    ) -> tuple[list[float], list[float]]:
        """``count`` records offered at ``rate`` (0: as fast as ingest takes them), once all
        their trees completed: when each completed and its latency (client send -> completed),
        in ms. With ``probe_every``, one record in that many is a visibility probe (see
        ``visible_latencies``). A service that exits fails the run, unless ``faulty`` (faults
        are being injected): then it is restarted, as a supervisor would."""
        records = workload.ingest_records(count, self.options.users, id_prefix)
        probes: dict[bytes, str] = {}
        for index in range(0, count, probe_every) if probe_every else ():
            user = probe_user(id_prefix, index)
            records[index].key = user.encode()
            records[index].payload = f'{{"user": "{user}", "amount": 1}}'.encode()
            probes[records[index].record_id] = user
        watcher = VisibilityProbes(self.supervisor.address("sink"), id_prefix, len(probes))
        if probes:
            watcher.start()
        senders = Senders(self.supervisor.address("ingest"), records, self.options.batch, self.options.clients, 0.0, 1, rate)
        senders.start()
        try:
            return self._until_completed(id_prefix, count, senders, faulty, probes, watcher)
        finally:
            if probes:
                watcher.stop()

    def _until_completed(
        self, id_prefix: str, count: int, senders: Senders, faulty: bool, probes: dict[bytes, str],
        watcher: VisibilityProbes,
    ) -> tuple[list[float], list[float]]:
        deadline = None
        while True:
            done = self.trees.completions(id_prefix)
            if len(done) >= count and deadline is not None and len(watcher.visible_at_ms) >= len(probes):
                sent = senders.sent_at_ms()
                self.visible_latencies = [watcher.visible_at_ms[user] - sent[record_id] for record_id, user in probes.items()]
                return (
                    sorted(c.decided_at_ms for c in done.values()),
                    [c.decided_at_ms - sent[record_id.encode()] for record_id, c in done.items()],
                )
            if senders.error is not None:
                raise RuntimeError(f"a client gave up: {senders.error}")
            if deadline is None and not senders.running():
                deadline = time.monotonic() + self.options.drain_timeout_s
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{id_prefix}: {len(done):,} of {count:,} trees completed, {len(watcher.visible_at_ms)} of {len(probes)} probes visible"
                )
            for name in self.supervisor.restart_exited():
                if not faulty:
                    raise RuntimeError(f"{name} exited during the bench (see {self.options.log_dir})")
                self.note(f"{self.guarantee}: {name} exited during a fault; restarted")
            time.sleep(0.2)

    def service_rates(self, records: int, stop: threading.Event) -> dict[str, float]:
        """Sampled until ``stop``: per service, ``records`` over the time its own Status count
        (records_in) kept moving. Every record passes every service once, so each figure is
        pipeline records per second while that service had work."""
        channels = {name: grpc.insecure_channel(self.supervisor.address(name)) for name in self.supervisor.instances}
        window: dict[str, list[float]] = {}  # name -> [busy from, busy until]
        last: dict[str, tuple[float, int]] = {}
        try:
            while not stop.wait(0.2):
                for name, channel in channels.items():
                    now = time.monotonic()
                    try:
                        status = admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=2)
                        count = status.records_in + status.records_out  # the sink counts only what it applied
                    except grpc.RpcError as exc:
                        log.warning("bench: %s Status: %s", name, exc.code())
                        continue
                    if name in last and count != last[name][1]:
                        window.setdefault(name, [last[name][0], now])[1] = now
                    last[name] = (now, count)
        finally:
            for channel in channels.values():
                channel.close()
        return {name: records / max(until - since, 1e-3) for name, (since, until) in window.items()}


def compute_settings(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` pairs from a bench's command line as ``PipelineOptions.compute`` (an
    ``ONCEFLOW_COMPUTE_`` prefix is dropped); ValueError names a pair without ``=``."""
    if bad := [pair for pair in pairs if "=" not in pair]:
        raise ValueError(f"a compute setting is KEY=VALUE (without the ONCEFLOW_COMPUTE_ prefix): {bad}")
    return tuple(
        (key.upper().removeprefix("ONCEFLOW_COMPUTE_"), value) for key, value in (pair.split("=", 1) for pair in pairs)
    )


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else float(values[0])


def completion_rate(times: list[float]) -> float:
    """Trees per second between 10% and 90% of them completing (``times`` sorted, ms)."""
    low, high = times[len(times) // 10], times[len(times) * 9 // 10]
    return (len(times) * 0.8) / max((high - low) / 1000, 1e-3)


def run_mode(
    guarantee: str, options: PipelineOptions, note: Callable[[str], None], rates: Callable[[float], list[float]]
) -> ModeResult:
    """``rates(sustainable)`` gives the offered rates of the sweep, from this mode's own
    sustainable rate (the caller can ignore it, to offer both modes the same rates)."""
    result = ModeResult(guarantee)
    with PipelineRun(guarantee, options, note) as run:
        note(f"{guarantee}: warming up ({options.warm_up_records:,} records)")
        run.send("warm:", options.warm_up_records, 0)

        note(f"{guarantee}: saturation, {options.saturation_records:,} records as fast as ingest takes them")
        stop = threading.Event()
        rates_box: dict[str, float] = {}
        sampler = threading.Thread(
            target=lambda: rates_box.update(run.service_rates(options.saturation_records, stop)), daemon=True
        )
        sampler.start()
        times, latencies = run.send("sat:", options.saturation_records, 0)
        stop.set()
        sampler.join(30)
        result.sustainable = completion_rate(times)
        result.saturation_p50_ms, result.saturation_p99_ms = percentile(latencies, 50), percentile(latencies, 99)
        result.services = rates_box
        note(f"{guarantee}: sustainable {result.sustainable:,.0f} records/s")

        for index, rate in enumerate(rates(result.sustainable)):
            count = max(int(rate * options.step_s), 1)
            note(f"{guarantee}: offering {rate:,.0f} records/s for {options.step_s:.0f} s")
            times, latencies = run.send(f"step{index}:", count, rate, probe_every=PROBE_EVERY)
            visible = run.visible_latencies
            result.sweep.append(RatePoint(
                offered=rate, achieved=len(times) / max((times[-1] - times[0]) / 1000, 1e-3), records=len(times),
                p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99),
                visible_p50_ms=percentile(visible, 50), visible_p99_ms=percentile(visible, 99), probes=len(visible),
            ))
            point = result.sweep[-1]
            note(
                f"{guarantee}: {rate:,.0f}/s offered: completed p50 {point.p50_ms:.0f} / p99 {point.p99_ms:.0f} ms; "
                f"visible p50 {point.visible_p50_ms:.0f} / p99 {point.visible_p99_ms:.0f} ms ({point.probes} probes)"
            )
        result.failed_trees = run.trees.failed
    return result
