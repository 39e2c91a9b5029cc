"""The pipeline's five services (six with the Kafka source, ``onceflow verify --source``) as a supervisor keeps them: each runs as one instance, a service
that exits is started again, and the faults ``onceflow verify`` injects are done to them here.

A zombie is made the way it happens in production: the instance is paused (SIGSTOP), its
replacement starts with the same instance name (so the same transactional.id, which fences the
paused producer) and takes over the partitions, then the paused one resumes (SIGCONT) believing
it still owns them. It must find itself fenced and exit; it must never write."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.faults import CLOCK_SKEW_ENV
from onceflow.faults import ENV as FAULT_ENV
from onceflow_tools.process import ServiceProcess, free_port, pipeline_service

log = logging.getLogger(__name__)

# Start order: ingest last, once everything downstream of it serves.
SERVICES = ("acker", "dedup", "compute", "sink", "ingest")
# With the Kafka source (``onceflow verify --source``): it writes into ingest.records as ingest
# does, and ingest still runs (its replayer replays the source's timed-out trees).
WITH_SOURCE = (*SERVICES, "source")
# Clients reach ingest on one address, so its replacement cannot take a new one: ingest is
# killed, not zombied (its transactional.id fencing is the same code as everyone's).
ZOMBIE_SERVICES = ("acker", "dedup", "compute", "sink", "sink_kafka")
# With the Kafka output topic (``onceflow verify --sink kafka``): a second sink beside the first,
# writing the job's table to a topic; it is one owner, fenced by its transactional.id.
WITH_KAFKA_OUTPUT = ("acker", "dedup", "compute", "sink", "sink_kafka", "ingest")


@dataclass
class Instance:
    process: ServiceProcess
    address: str


@dataclass
class ZombieOutcome:
    service: str
    exit_code: int | None  # None: idle after SIGCONT (nothing to write) and stopped; the checker says what it wrote


@dataclass
class Supervisor:
    prefix: str
    log_dir: Path
    # Per service, its own settings (without the ONCEFLOW_<NAME>_ prefix).
    settings: dict[str, dict[str, str]] = field(default_factory=dict)
    # For every process: common settings, and a sabotage when the checker is being tested.
    env: dict[str, str] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    restarts: Counter[str] = field(default_factory=Counter)  # exits nobody asked for
    zombies: list[ZombieOutcome] = field(default_factory=list)
    _starts: Counter[str] = field(default_factory=Counter)
    _armed: set[str] = field(default_factory=set)  # restarted to crash at a fault point
    # Services whose host clock is off by this many ms, from the clock-skew fault on: every later
    # start of theirs keeps it, as a host's wrong clock survives a process restart.
    clock_skews: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    services: tuple[str, ...] = SERVICES  # WITH_SOURCE: the source too

    def _new(self, name: str, address: str) -> ServiceProcess:
        self._starts[name] += 1
        process = pipeline_service(
            name, address, self.prefix, "verify", self.log_dir, log_name=f"{name}-{self._starts[name]}",
            **self.settings.get(name, {}),
        )
        process.env.update(self.env)
        if name in self.clock_skews:
            process.env[CLOCK_SKEW_ENV] = str(self.clock_skews[name])
        return process

    def start_all(self, timeout_s: float = 180.0) -> None:
        # All at once, then wait for each: the services meet only through Kafka, so none needs
        # another up to start, and their starts (Spark's above all) overlap.
        for name in self.services:
            address = f"127.0.0.1:{free_port()}"
            self.instances[name] = Instance(self._new(name, address).start(), address)
        for instance in self.instances.values():
            instance.process.wait_healthy(instance.address, timeout_s)

    def processes(self) -> list[ServiceProcess]:
        with self._lock:
            return [instance.process for instance in self.instances.values()]

    def address(self, name: str) -> str:
        return self.instances[name].address

    def kill9(self, name: str, fault: str = "") -> None:
        """kill -9 and start again on the same address, as a supervisor does; with ``fault`` (an
        ``ONCEFLOW_FAULT`` rule), the new instance kills itself there, and its next start is clean."""
        with self._lock:
            instance = self.instances[name]
            instance.process.kill9()
            instance.process = self._new(name, instance.address)
            self._armed.discard(name)
            if fault:
                instance.process.env[FAULT_ENV] = fault
                self._armed.add(name)
            instance.process.start()

    def skew_clock(self, name: str, skew_ms: int) -> None:
        """Restart ``name`` (kill -9, on the same address) on a host clock ``skew_ms`` off, and
        keep it so for its later starts."""
        self.clock_skews[name] = skew_ms
        self.kill9(name)

    def zombie(self, name: str, takeover_s: float, timeout_s: float = 180.0, resume_wait_s: float = 20.0) -> ZombieOutcome:
        """Pause ``name``, let a replacement take over, resume the paused one and wait for it to
        find itself fenced."""
        with self._lock:
            old = self.instances[name]
            old.process.sigstop()
            address = f"127.0.0.1:{free_port()}"
            replacement = self._new(name, address).start()
            self.instances[name] = Instance(replacement, address)
        replacement.wait_healthy(address, timeout_s)
        # The replacement's producer fenced the paused one at start; its consumer owns the
        # partitions once the paused member's session has timed out.
        threading.Event().wait(takeover_s)
        old.process.sigcont()
        try:
            # It exits on its next transactional call; one with nothing to write stays idle.
            code: int | None = old.process.wait_exit(timeout_s=resume_wait_s)
        except AssertionError:
            log.info("zombie %s still running %.0f s after SIGCONT (nothing to write); stopping it", name, resume_wait_s)
            old.process.ensure_dead()
            code = None
        outcome = ZombieOutcome(name, code)
        self.zombies.append(outcome)
        return outcome

    def restart_exited(self) -> list[str]:
        """Start again every service whose current instance exited (a fenced or failed instance
        exits non-zero and relies on exactly this); the names of those nobody had told to crash."""
        restarted = []
        with self._lock:
            for name, instance in self.instances.items():
                if not instance.process.alive():
                    if name in self._armed:
                        self._armed.discard(name)  # it crashed where it was told to
                    else:
                        log.warning("%s exited with %s; restarting it", name, instance.process.returncode)
                        self.restarts[name] += 1
                        restarted.append(name)
                    instance.process = self._new(name, instance.address).start()
        return restarted

    def dump_stacks(self) -> list[Path]:
        """Every live service's thread stacks (py-spy, a dev dependency) next to its log: the
        evidence for a pipeline that would not drain, where it sits rather than guesses."""
        written = []
        for instance in self.instances.values():
            stacks = instance.process.stack_dump()
            if not stacks:
                continue
            path = self.log_dir / f"{instance.process.log_path.stem}-stacks.txt"
            path.write_text(stacks)
            written.append(path)
        return written

    def wait_all_healthy(self, timeout_s: float = 180.0) -> None:
        for instance in list(self.instances.values()):
            instance.process.wait_healthy(instance.address, timeout_s)

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM in reverse start order (ingest first); the exit code of each."""
        codes: dict[str, int | None] = {}
        for name in reversed(self.services):
            instance = self.instances.get(name)
            if instance is None:
                continue
            try:
                codes[name] = instance.process.terminate() if instance.process.alive() else instance.process.returncode
            except AssertionError:
                codes[name] = None
            finally:
                instance.process.ensure_dead()
        return codes
