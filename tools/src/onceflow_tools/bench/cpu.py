"""Where the machine's CPU goes during a bench phase: every process's CPU time (user + system,
from /proc) before and after, summed per kind of process (a service, the broker, the Spark JVM,
Redis). On a 2-core machine everything shares, so a rate means little without what it cost."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# pid -> (CPU ticks so far, command line)
Snapshot = dict[int, tuple[int, str]]


def _stat(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (state first, then ppid, ...)."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def _ticks(fields: list[str]) -> int:
    """User + system CPU ticks, from ``_stat``'s fields."""
    return int(fields[11]) + int(fields[12])


def snapshot() -> Snapshot:
    found: Snapshot = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat(f"/proc/{entry}/stat")
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # gone meanwhile
        found[int(entry)] = (_ticks(fields), command)
    return found


def label(command: str, bench: str = "") -> str:
    """A process's kind: the Python module it runs, the broker, the Spark JVM, Redis, or the
    bench itself (its script's name in ``bench``)."""
    if " -m " in command:
        return command.split(" -m ", 1)[1].split()[0]
    if "java" in command:
        return "Spark JVM" if "spark" in command.lower() else "Kafka broker" if "kafka" in command.lower() else "java"
    if "redis-server" in command:
        return "redis-server"
    return "this bench" if bench and bench in command else command[:40]


PIPELINE_KINDS = ("Kafka broker", "Spark JVM", "redis-server")  # and every onceflow_* module


def is_pipeline(kind: str) -> bool:
    """A service, or what the services run on: not the bench, nor anything else on the machine."""
    return kind in PIPELINE_KINDS or kind.startswith("onceflow_")


@dataclass(frozen=True)
class Usage:
    seconds: dict[str, float]  # kind -> CPU seconds over the phase
    elapsed_s: float

    def percent(self, floor: float = 1.0) -> dict[str, float]:
        """Kind -> % of one core over the phase (200 = both cores of this machine), largest
        first; kinds under ``floor`` are left out."""
        shares = {kind: 100 * seconds / self.elapsed_s for kind, seconds in self.seconds.items()}
        return dict(sorted(((k, v) for k, v in shares.items() if v >= floor), key=lambda item: -item[1]))

    def pipeline_seconds(self) -> float:
        """CPU seconds of the pipeline's processes alone (``is_pipeline``)."""
        return sum(seconds for kind, seconds in self.seconds.items() if is_pipeline(kind))


def usage(before: Snapshot, after: Snapshot, elapsed_s: float, bench: str = "", min_process_percent: float = 0.0) -> Usage:
    """CPU seconds per kind of process between two snapshots (a process that started meanwhile
    counts from zero; one that ended is lost, so snapshot around a phase nobody exits in).
    Processes under ``min_process_percent`` of a core are left out before summing."""
    tick = os.sysconf("SC_CLK_TCK")
    elapsed_s = max(elapsed_s, 1e-9)
    seconds: dict[str, float] = {}
    for pid, (ticks, command) in after.items():
        spent = (ticks - before.get(pid, (0, ""))[0]) / tick
        if spent > 0 and 100 * spent / elapsed_s >= min_process_percent:
            kind = label(command, bench)
            seconds[kind] = seconds.get(kind, 0.0) + spent
    return Usage(seconds, elapsed_s)


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every live process below them: compute's Spark JVM is its child."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat(f"/proc/{entry}/stat")[1]), []).append(int(entry))
            except OSError:
                continue
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


# tid -> (CPU ticks so far, thread name)
Threads = dict[int, tuple[int, str]]


def threads(pid: int) -> Threads:
    """Every thread of ``pid`` (none if it is gone)."""
    found: Threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            fields = _stat(f"/proc/{pid}/task/{tid}/stat")
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        found[int(tid)] = (_ticks(fields), name)
    return found


def busiest_python_thread_seconds(pid: int, before: Threads, after: Threads) -> float | None:
    """CPU seconds of ``pid``'s busiest Python thread between two thread snapshots, or None if
    ``pid`` is not a Python process. Python's threads keep the process's own name (librdkafka
    names its threads rdk:*, gRPC grpc_*), and one thread can use at most one core: so a hop
    whose loop runs on one thread can move no more than 1 / (this ÷ records) records a second.
    Native pool threads that never name themselves (Arrow's, a BLAS's) keep it too; if one of
    them is the busiest, the bound is still true of that thread, only less telling."""
    process_name = after.get(pid, before.get(pid, (0, "")))[1]
    if not process_name.startswith("python"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    spent = [
        (ticks - before.get(tid, (0, ""))[0]) / tick
        for tid, (ticks, name) in after.items() if name == process_name
    ]
    return max(spent, default=0.0)


@dataclass(frozen=True)
class HopCpu:
    """What one contender of the hop table cost per record over its timed span, in CPU µs."""
    own_us: float  # its processes and their children (compute's Spark JVM included)
    busiest_thread_us: float | None  # its busiest Python thread (None for a JVM contender)
    broker_us: float
    redis_us: float

    @property
    def thread_bound_per_s(self) -> float | None:
        """The most records a second its busiest thread allows, at one core."""
        return None if not self.busiest_thread_us else 1e6 / self.busiest_thread_us

    def machine_bound_per_s(self, cores: int) -> float:
        """The most records a second ``cores`` allow if the contender, the broker and Redis had
        them all, at this CPU per record."""
        return cores * 1e6 / max(self.own_us + self.broker_us + self.redis_us, 1e-9)

    def bound_per_s(self, cores: int) -> float:
        """The lower of the two: no rate of this contender can pass it at this CPU per record."""
        thread = self.thread_bound_per_s
        machine = self.machine_bound_per_s(cores)
        return machine if thread is None else min(thread, machine)


class SpanMeter:
    """CPU of a contender's processes, its threads, the broker and Redis between ``start()``
    and ``stop()``: the span its rate is timed over."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = list(pids)
        self._before: Snapshot = {}
        self._threads: dict[int, Threads] = {}

    def start(self) -> None:
        self._before = snapshot()
        self._threads = {pid: threads(pid) for pid in self._pids}

    def stop(self, records: int) -> HopCpu:
        after = snapshot()
        threads_after = {pid: threads(pid) for pid in self._pids}
        per_record = 1e6 / max(records, 1)
        own = descendants(self._pids)
        # Seconds, not shares, are wanted here: the elapsed time does not matter.
        mine = usage(self._before, {pid: v for pid, v in after.items() if pid in own}, 1.0).seconds
        others = usage(self._before, {pid: v for pid, v in after.items() if pid not in own}, 1.0).seconds
        busiest = [
            busiest_python_thread_seconds(pid, self._threads.get(pid, {}), threads_after[pid]) for pid in self._pids
        ]
        thread_seconds = [s for s in busiest if s is not None]
        return HopCpu(
            own_us=sum(mine.values()) * per_record,
            busiest_thread_us=max(thread_seconds) * per_record if thread_seconds else None,
            broker_us=others.get("Kafka broker", 0.0) * per_record,
            redis_us=others.get("redis-server", 0.0) * per_record,
        )
