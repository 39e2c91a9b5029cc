"""Where the machine's CPU goes during a bench phase: every process's CPU time (user + system,
from /proc) before and after, summed per kind of process (a service, the broker, the Spark JVM,
Redis). On a 2-core machine everything shares, so a rate means little without what it cost."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# pid -> (CPU ticks so far, command line)
Snapshot = dict[int, tuple[int, str]]


def snapshot() -> Snapshot:
    found: Snapshot = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue  # gone meanwhile
        found[int(entry)] = (int(fields[11]) + int(fields[12]), command)
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
